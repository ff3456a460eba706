//! The fleet model: a discrete-event simulation on a virtual clock of `nodes` proxies, each
//! scraped by Prometheus-like clients at a fixed interval and a random phase per target, all
//! asking one API server. Each proxy runs the caches' rules through the library's own functions:
//! [`policy::lifetime`], [`policy::refresh_ahead_due`] and [`policy::remembered_for`] for the
//! caches, [`HoldState`] for the `Retry-After` gate, and [`retry_delay`] with [`MAX_ATTEMPTS`]
//! for retries. A [`Rule`] may swap the lifetime rule for a baseline, to compare.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use kubelet_auth_proxy::apiserver::cache::policy::{self, Fill};
use kubelet_auth_proxy::apiserver::hold::{Admission, HoldState};
use kubelet_auth_proxy::apiserver::{MAX_ATTEMPTS, retry_delay};

/// Virtual time since the start of the run.
pub type Time = Duration;

/// A seeded generator (splitmix64): the same seed gives the same run.
pub struct Rng(u64);

impl Rng {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn fraction(&mut self) -> f64 {
        // 53 random bits: exactly representable, below 1.
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// How a cache chooses lifetimes and whether it refreshes ahead.
#[derive(Clone, Copy)]
pub struct Rule {
    /// The name in the tables.
    pub name: &'static str,
    /// The lifetime of an entry from its TTL, how it is filled and a uniform draw.
    pub lifetime: fn(Duration, Fill, f64) -> Duration,
    /// Whether entries used in the last part of their lifetime are refreshed in the background.
    pub refresh_ahead: bool,
}

/// A scraper: one token, `targets` scrape targets per node (each its own phase), all asking for
/// the same attributes (the kubelet's `/metrics/*` endpoints are all `nodes/metrics`).
#[derive(Clone, Copy)]
pub struct Scraper {
    /// Seconds between two scrapes of one target.
    pub interval: Duration,
    /// Targets per node.
    pub targets: u32,
}

/// When the proxies start.
#[derive(Clone, Copy)]
pub enum Start {
    /// Each at a uniform random moment in `[0, within)`: caches filled at unrelated times.
    Spread(Duration),
    /// All at 0, with empty caches: a fleet-wide restart.
    Together,
}

/// One run's settings.
#[derive(Clone)]
pub struct Params {
    pub nodes: u32,
    pub seed: u64,
    pub duration: Duration,
    pub scrapers: Vec<Scraper>,
    pub token_ttl: Duration,
    pub access_ttl: Duration,
    /// Time the API server takes to answer a review.
    pub review_latency: Duration,
    /// Reviews the API server serves per second for the proxies' flow; the rest get 429.
    pub capacity: u32,
    /// The `Retry-After` of those 429s.
    pub retry_after: Duration,
    /// `--apiserver-request-timeout`: how long a call may wait for a hold.
    pub request_timeout: Duration,
    pub start: Start,
    /// The first scraper's token (and so its user's credential id) changes at this time; each
    /// target sends the new one from its next scrape on.
    pub rotation: Option<Time>,
    /// The API server refuses connections from this time, for this long.
    pub outage: Option<(Time, Duration)>,
    /// Access is decided on the node (the RBAC mode, or a Policy rule): no SubjectAccessReview,
    /// only the token's review. What is left of the review load when the RBAC mode allows.
    pub local_access: bool,
}

/// What the API server and the clients saw, per second of the run.
#[derive(Default)]
pub struct Record {
    /// Review calls received (every attempt), per second.
    pub calls: Vec<u32>,
    /// Of those, SubjectAccessReviews (the rest are TokenReviews).
    pub access_calls: Vec<u32>,
    /// Of those, answered 429.
    pub throttled: Vec<u32>,
    /// Of those, refused (outage).
    pub refused: Vec<u32>,
    /// Requests answered, per second.
    pub served: Vec<u32>,
    /// Requests failed closed (a review failed or was held off too long), per second.
    pub failed: Vec<u32>,
    /// Latency of answered requests, per millisecond (the last bin collects the rest).
    pub latency_ms: Vec<u64>,
    /// Refreshes ahead started.
    pub refreshes: u64,
}

/// The most latency the histogram resolves.
const LATENCY_BINS: usize = 60_001;
/// How long a refused connection takes to fail.
const REFUSED_AFTER: Duration = Duration::from_millis(1);

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Scrape {
        node: u32,
        scraper: u16,
        target: u16,
    },
    Admit {
        review: u32,
        epoch: u32,
    },
    Answer {
        review: u32,
        outcome: Outcome,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Ok,
    Throttled,
    Refused,
}

/// A request waiting for, or passing through, its reviews: the token's, then the access one.
#[derive(Clone, Copy)]
struct Request {
    node: u32,
    scraper: u16,
    generation: u16,
    started: Time,
    /// 0: token review next, 1: access review next.
    stage: u8,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Purpose {
    Fill(Fill),
    Refresh,
}

struct Review {
    node: u32,
    key: u32,
    purpose: Purpose,
    attempt: u32,
    /// The end of the current wait for the hold (set at the first admission of each attempt).
    deadline: Option<Time>,
    /// Bumped whenever a new admission is scheduled: older scheduled ones are stale.
    epoch: u32,
    probe: bool,
    waiters: Vec<Request>,
}

#[derive(Clone, Copy, Default)]
struct Entry {
    filled: Time,
    lifetime: Duration,
    refreshing: bool,
}

#[derive(Clone, Default)]
struct KeyState {
    entry: Option<Entry>,
    known_until: Time,
    flight: Option<u32>,
}

struct Node {
    keys: Vec<KeyState>,
    hold: HoldState<Time>,
    /// Reviews waiting for the hold, with the epoch they waited at.
    parked: Vec<(u32, u32)>,
    /// Token generation each scraper's targets send.
    generation: Vec<u16>,
}

/// One run of the model.
pub struct Sim<'a> {
    params: &'a Params,
    rule: Rule,
    rng: Rng,
    now: Time,
    seq: u64,
    events: BinaryHeap<Reverse<(Time, u64, Event)>>,
    nodes: Vec<Node>,
    reviews: Vec<Review>,
    free: Vec<u32>,
    /// Reviews the API server accepted in the current second, and which second.
    bucket: (u64, u32),
    record: Record,
}

impl<'a> Sim<'a> {
    /// Runs `params` under `rule` to the end.
    pub fn run(params: &'a Params, rule: Rule) -> Record {
        let seconds = usize::try_from(params.duration.as_secs()).unwrap_or(usize::MAX) + 1;
        let record = Record {
            calls: vec![0; seconds],
            access_calls: vec![0; seconds],
            throttled: vec![0; seconds],
            refused: vec![0; seconds],
            served: vec![0; seconds],
            failed: vec![0; seconds],
            latency_ms: vec![0; LATENCY_BINS],
            refreshes: 0,
        };
        // Keys per node: scraper × (token, access) × generation (0, and 1 after a rotation).
        let keys = params.scrapers.len() * 2 * 2;
        let mut sim = Sim {
            params,
            rule,
            rng: Rng::new(params.seed),
            now: Duration::ZERO,
            seq: 0,
            events: BinaryHeap::new(),
            nodes: Vec::new(),
            reviews: Vec::new(),
            free: Vec::new(),
            bucket: (0, 0),
            record,
        };
        for node in 0..params.nodes {
            sim.nodes.push(Node {
                keys: vec![KeyState::default(); keys],
                hold: HoldState::default(),
                parked: Vec::new(),
                generation: vec![0; params.scrapers.len()],
            });
            let started = match params.start {
                Start::Spread(within) => within.mul_f64(sim.rng.fraction()),
                Start::Together => Duration::ZERO,
            };
            for (scraper, s) in params.scrapers.iter().enumerate() {
                for target in 0..s.targets {
                    let first = started + s.interval.mul_f64(sim.rng.fraction());
                    sim.schedule(
                        first,
                        Event::Scrape {
                            node,
                            scraper: index16(scraper),
                            target: index16(target as usize),
                        },
                    );
                }
            }
        }
        while let Some(Reverse((at, _, event))) = sim.events.pop() {
            if at > params.duration {
                break;
            }
            sim.now = at;
            match event {
                Event::Scrape {
                    node,
                    scraper,
                    target,
                } => sim.scrape(node, scraper, target),
                Event::Admit { review, epoch } => sim.admit(review, epoch),
                Event::Answer { review, outcome } => sim.answer(review, outcome),
            }
        }
        sim.record
    }

    fn schedule(&mut self, at: Time, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, event)));
    }

    fn second(&self) -> usize {
        usize::try_from(self.now.as_secs()).unwrap_or(usize::MAX)
    }

    fn scrape(&mut self, node: u32, scraper: u16, target: u16) {
        let interval = self.params.scrapers[usize::from(scraper)].interval;
        self.schedule(
            self.now + interval,
            Event::Scrape {
                node,
                scraper,
                target,
            },
        );
        if scraper == 0 && self.params.rotation.is_some_and(|at| self.now >= at) {
            self.nodes[node as usize].generation[0] = 1;
        }
        let generation = self.nodes[node as usize].generation[usize::from(scraper)];
        self.lookup(Request {
            node,
            scraper,
            generation,
            started: self.now,
            stage: 0,
        });
    }

    fn key_of(&self, request: &Request) -> u32 {
        let scrapers = self.params.scrapers.len() as u32;
        (u32::from(request.generation) * scrapers + u32::from(request.scraper)) * 2
            + u32::from(request.stage)
    }

    fn ttl_of(&self, key: u32) -> Duration {
        if key.is_multiple_of(2) {
            self.params.token_ttl
        } else {
            self.params.access_ttl
        }
    }

    /// The cache lookup of the request's next review.
    fn lookup(&mut self, request: Request) {
        if request.stage == 2 {
            let waited = self.now - request.started;
            let bin = usize::try_from(waited.as_millis()).unwrap_or(usize::MAX);
            self.record.latency_ms[bin.min(LATENCY_BINS - 1)] += 1;
            let second = self.second();
            self.record.served[second] += 1;
            return;
        }
        if request.stage == 1 && self.params.local_access {
            self.lookup(Request {
                stage: 2,
                ..request
            });
            return;
        }
        let key = self.key_of(&request);
        let now = self.now;
        let state = &mut self.nodes[request.node as usize].keys[key as usize];
        if let Some(entry) = state.entry.as_mut().filter(|e| now < e.filled + e.lifetime) {
            let due = self.rule.refresh_ahead
                && !entry.refreshing
                && policy::refresh_ahead_due(entry.lifetime, now - entry.filled);
            if due {
                entry.refreshing = true;
                self.record.refreshes += 1;
                self.start_review(request.node, key, Purpose::Refresh, Vec::new());
            }
            self.lookup(Request {
                stage: request.stage + 1,
                ..request
            });
            return;
        }
        if let Some(review) = state.flight {
            self.reviews[review as usize].waiters.push(request);
            return;
        }
        let fill = if now < state.known_until {
            Fill::Renewal
        } else {
            Fill::New
        };
        let review = self.start_review(request.node, key, Purpose::Fill(fill), vec![request]);
        self.nodes[request.node as usize].keys[key as usize].flight = Some(review);
    }

    fn start_review(
        &mut self,
        node: u32,
        key: u32,
        purpose: Purpose,
        waiters: Vec<Request>,
    ) -> u32 {
        let mut review = Review {
            node,
            key,
            purpose,
            attempt: 1,
            deadline: None,
            epoch: 0,
            probe: false,
            waiters,
        };
        // A reused slot keeps counting epochs, so its predecessor's scheduled admissions stay
        // stale.
        let id = match self.free.pop() {
            Some(id) => {
                review.epoch = self.reviews[id as usize].epoch + 1;
                self.reviews[id as usize] = review;
                id
            }
            None => {
                self.reviews.push(review);
                u32::try_from(self.reviews.len() - 1).unwrap_or(u32::MAX)
            }
        };
        let epoch = self.reviews[id as usize].epoch;
        self.admit(id, epoch);
        id
    }

    /// A review asks the node's hold-off whether it may call now.
    fn admit(&mut self, id: u32, epoch: u32) {
        let now = self.now;
        let timeout = self.params.request_timeout;
        let review = &mut self.reviews[id as usize];
        if review.epoch != epoch {
            return;
        }
        // The wait for the hold is bounded per attempt, from its first admission.
        let deadline = match review.deadline {
            Some(deadline) if now >= deadline => {
                self.fail(id);
                return;
            }
            Some(deadline) => deadline,
            None => *review.deadline.insert(now + timeout),
        };
        let node = review.node;
        match self.nodes[node as usize].hold.admit(now, deadline) {
            Admission::Pass { probe } => {
                let review = &mut self.reviews[id as usize];
                review.probe = probe;
                review.deadline = None;
                self.send(id);
            }
            Admission::Wait(until) => {
                let review = &mut self.reviews[id as usize];
                review.epoch += 1;
                let epoch = review.epoch;
                self.nodes[node as usize].parked.push((id, epoch));
                self.schedule(until.min(deadline), Event::Admit { review: id, epoch });
            }
            Admission::Held(_) => self.fail(id),
        }
    }

    /// The API server receives the call now.
    fn send(&mut self, id: u32) {
        let second = self.second();
        self.record.calls[second] += 1;
        if !self.reviews[id as usize].key.is_multiple_of(2) {
            self.record.access_calls[second] += 1;
        }
        let down = self
            .params
            .outage
            .is_some_and(|(from, length)| self.now >= from && self.now < from + length);
        let outcome = if down {
            self.record.refused[second] += 1;
            Outcome::Refused
        } else {
            let this = self.now.as_secs();
            if self.bucket.0 != this {
                self.bucket = (this, 0);
            }
            if self.bucket.1 >= self.params.capacity {
                self.record.throttled[second] += 1;
                Outcome::Throttled
            } else {
                self.bucket.1 += 1;
                Outcome::Ok
            }
        };
        let after = match outcome {
            Outcome::Ok => self.params.review_latency,
            Outcome::Throttled | Outcome::Refused => REFUSED_AFTER,
        };
        self.schedule(
            self.now + after,
            Event::Answer {
                review: id,
                outcome,
            },
        );
    }

    fn answer(&mut self, id: u32, outcome: Outcome) {
        let (node, probe) = {
            let review = &self.reviews[id as usize];
            (review.node, review.probe)
        };
        let retry_after = (outcome == Outcome::Throttled).then_some(self.params.retry_after);
        let now = self.now;
        if self.nodes[node as usize]
            .hold
            .record(now, probe, retry_after)
        {
            let parked = std::mem::take(&mut self.nodes[node as usize].parked);
            for (waiting, epoch) in parked {
                let review = &mut self.reviews[waiting as usize];
                if review.epoch == epoch {
                    review.epoch += 1;
                    let epoch = review.epoch;
                    self.schedule(
                        now,
                        Event::Admit {
                            review: waiting,
                            epoch,
                        },
                    );
                }
            }
        }
        match outcome {
            Outcome::Ok => self.succeed(id),
            Outcome::Refused => self.fail(id),
            Outcome::Throttled => {
                let review = &mut self.reviews[id as usize];
                if review.attempt >= MAX_ATTEMPTS {
                    self.fail(id);
                    return;
                }
                let delay = retry_delay(review.attempt, self.rng.fraction());
                let review = &mut self.reviews[id as usize];
                review.attempt += 1;
                review.deadline = None;
                review.epoch += 1;
                let epoch = review.epoch;
                self.schedule(now + delay, Event::Admit { review: id, epoch });
            }
        }
    }

    fn succeed(&mut self, id: u32) {
        let (node, key, purpose) = {
            let r = &self.reviews[id as usize];
            (r.node, r.key, r.purpose)
        };
        let fill = match purpose {
            Purpose::Fill(fill) => fill,
            Purpose::Refresh => Fill::Renewal,
        };
        let ttl = self.ttl_of(key);
        let lifetime = (self.rule.lifetime)(ttl, fill, self.rng.fraction());
        let now = self.now;
        let state = &mut self.nodes[node as usize].keys[key as usize];
        state.entry = Some(Entry {
            filled: now,
            lifetime,
            refreshing: false,
        });
        state.known_until = now + policy::remembered_for(lifetime, ttl);
        self.finish(id, true);
    }

    fn fail(&mut self, id: u32) {
        self.finish(id, false);
    }

    fn finish(&mut self, id: u32, answered: bool) {
        let review = &mut self.reviews[id as usize];
        let waiters = std::mem::take(&mut review.waiters);
        let (node, key, purpose) = (review.node, review.key, review.purpose);
        review.epoch += 1;
        self.free.push(id);
        if let Purpose::Fill(_) = purpose {
            self.nodes[node as usize].keys[key as usize].flight = None;
        }
        for request in waiters {
            if answered {
                self.lookup(Request {
                    stage: request.stage + 1,
                    ..request
                });
            } else {
                let second = self.second();
                self.record.failed[second] += 1;
            }
        }
    }
}

fn index16(i: usize) -> u16 {
    u16::try_from(i).unwrap_or(u16::MAX)
}

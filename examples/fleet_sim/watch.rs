//! The RBAC mode's load on the API server (`docs/FLEET.md`, "RBAC mode: list and watch load"):
//! every node keeps the cluster's RBAC objects itself, one list-then-watch per watched kind,
//! and decides locally, so what the API server sees is lists and watches instead of reviews.
//!
//! A discrete-event simulation on a virtual clock with a seeded generator, like the Webhook
//! model ([`crate::model`]). The client side is the proxy's watch (`src/authz/live_rbac/watch.rs`):
//! an initial list served from the watch cache in pages, then a watch resumed from the last
//! resourceVersion each time the server closes it (each watch's `timeoutSeconds` drawn in
//! 300–600 s, as client-go's reflector), a jittered back-off after every error that only a
//! complete list or a watch the server ended normally resets, and a relist at once on 410 Gone.
//! The server side is
//! kube-apiserver's watch cache: lists at `resourceVersion=0` answered from memory, watches
//! closed at their `timeoutSeconds`, bookmarks about once a minute, one event per watcher for a
//! change, and after a restart, optionally, 410 Gone for resourceVersions from before it.
//!
//! The API server is not a bottleneck here: every list and watch is answered, so the figures
//! are what the fleet asks for, which is what sizing needs.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use crate::model::{Rng, Start, Time};

/// One watched kind of a cluster's RBAC set: how many objects a list returns, and their mean
/// size as served (JSON).
#[derive(Clone, Copy, Debug)]
pub struct Kind {
    pub name: &'static str,
    pub objects: u32,
    pub bytes: u32,
}

/// The objects every node lists and watches: ClusterRoles and ClusterRoleBindings, plus Roles
/// and RoleBindings with `--pod-scoped-authz`.
#[derive(Clone, Debug)]
pub struct RbacSet {
    pub name: &'static str,
    pub kinds: Vec<Kind>,
}

const fn kind(name: &'static str, objects: u32, bytes: u32) -> Kind {
    Kind {
        name,
        objects,
        bytes,
    }
}

/// A small cluster's RBAC: about what a fresh cluster and a few add-ons install.
const SMALL: [Kind; 2] = [
    kind("ClusterRole", 100, 1_500),
    kind("ClusterRoleBinding", 100, 500),
];
/// A large, multi-tenant cluster's RBAC.
const LARGE: [Kind; 2] = [
    kind("ClusterRole", 5_000, 1_500),
    kind("ClusterRoleBinding", 5_000, 500),
];
/// The namespaced kinds `--pod-scoped-authz` adds to the small set: a few teams' namespaces.
const SMALL_NAMESPACED: [Kind; 2] = [kind("Role", 50, 1_000), kind("RoleBinding", 200, 500)];
/// ... and to the large one: 2,000 namespaces, one Role and ten RoleBindings each.
const LARGE_NAMESPACED: [Kind; 2] = [kind("Role", 2_000, 1_000), kind("RoleBinding", 20_000, 500)];

/// The names `--rbac-sets` accepts.
pub const PRESETS: [&str; 4] = ["small", "small-pod", "large", "large-pod"];

/// A named set: `small` or `large`, with `-pod` for `--pod-scoped-authz` (Roles and
/// RoleBindings watched too).
pub fn preset(name: &str) -> Option<RbacSet> {
    let (name, kinds): (&'static str, Vec<Kind>) = match name {
        "small" => ("small", SMALL.to_vec()),
        "small-pod" => ("small-pod", [SMALL, SMALL_NAMESPACED].concat()),
        "large" => ("large", LARGE.to_vec()),
        "large-pod" => ("large-pod", [LARGE, LARGE_NAMESPACED].concat()),
        _ => return None,
    };
    Some(RbacSet { name, kinds })
}

/// The proxy's back-off: a step from 0.8 s, doubling, at most 30 s; each wait drawn uniformly in
/// [½, 1] of the step.
const BACKOFF_MIN: Duration = Duration::from_millis(800);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// The watch cache's bookmark period, and how long before a watch's timeout it sends the last.
const BOOKMARK_EVERY: Duration = Duration::from_secs(60);
const BOOKMARK_BEFORE_TIMEOUT: Duration = Duration::from_secs(2);

/// One run's settings.
#[derive(Clone)]
pub struct WatchParams {
    pub nodes: u32,
    pub seed: u64,
    pub duration: Duration,
    pub set: RbacSet,
    /// When the processes start: spread (steady state) or together (a fleet-wide restart).
    pub start: Start,
    /// `--rbac-start-jitter`: each process waits a uniform part of it before its first lists.
    pub start_jitter: Duration,
    /// Objects per list page (`limit`).
    pub page_size: u32,
    /// How long the API server takes to answer one page from its watch cache.
    pub page_latency: Duration,
    /// Each watch draws its `timeoutSeconds` uniformly in this range (whole seconds).
    pub timeout_secs: (u64, u64),
    /// At this time one object of this kind (an index in `set.kinds`) is created.
    pub change: Option<(Time, usize)>,
    /// The API server is down from this time, for this long: every watch breaks.
    pub outage: Option<(Time, Duration)>,
    /// After the outage the server has no history from before it: a watch resumed from an
    /// older resourceVersion is answered 410 Gone, and the watcher relists.
    pub gone_after_outage: bool,
}

/// What the API server sent and received, per second of the run.
#[derive(Default)]
pub struct WatchRecord {
    /// LISTs started (their first page).
    pub lists: Vec<u32>,
    /// List requests: every page.
    pub pages: Vec<u32>,
    /// Objects served by lists, and their bytes.
    pub objects: Vec<u64>,
    pub bytes: Vec<u64>,
    /// Watch requests the API server accepted.
    pub watches: Vec<u32>,
    /// List and watch requests refused (the outage).
    pub refused: Vec<u32>,
    /// Bookmarks sent.
    pub bookmarks: Vec<u32>,
    /// Watch events sent (a change, once per watcher of its kind), and their bytes.
    pub events: Vec<u32>,
    pub event_bytes: Vec<u64>,
    /// Watches answered 410 Gone.
    pub gone: Vec<u32>,
    /// When the last node had listed every kind once: the whole fleet can decide.
    pub synced_at: Option<Time>,
    /// When, after the outage, the last watcher was watching again.
    pub back_at: Option<Time>,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A process's start delay is over: its watchers list.
    Start {
        node: u32,
    },
    /// A watcher (re)starts its list: the `Init` event (which resets the back-off), then page 0.
    List {
        watcher: u32,
        epoch: u32,
    },
    /// A watcher asks for the next page of its list.
    Page {
        watcher: u32,
        epoch: u32,
        page: u32,
    },
    /// A watcher starts a watch from its last resourceVersion.
    Watch {
        watcher: u32,
        epoch: u32,
    },
    /// The server closes a watch at its timeout.
    Close {
        watcher: u32,
        epoch: u32,
    },
    Down,
    Up,
    Change {
        kind: u16,
    },
}

/// The proxy's back-off (`Backoff` in `src/authz/live_rbac/watch.rs`).
#[derive(Clone, Copy, Default)]
struct Backoff {
    failures: u32,
}

impl Backoff {
    fn next(&mut self, draw: f64) -> Duration {
        let step = BACKOFF_MIN
            .saturating_mul(1 << self.failures.min(16))
            .min(BACKOFF_MAX);
        self.failures = self.failures.saturating_add(1);
        step.mul_f64(0.5 + 0.5 * draw)
    }

    /// A complete list, or a watch the server ended at its timeout.
    fn reset(&mut self) {
        self.failures = 0;
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not started yet, or waiting out a back-off.
    Idle,
    Listing,
    Watching {
        since: Time,
        deadline: Time,
    },
}

struct Watcher {
    node: u32,
    kind: u16,
    /// Bumped when a scheduled event of this watcher becomes stale (its watch broke).
    epoch: u32,
    phase: Phase,
    /// The server generation its resourceVersion comes from; `None` before its first list.
    listed_in: Option<u32>,
    backoff: Backoff,
}

/// One run of the model.
pub struct WatchSim<'a> {
    params: &'a WatchParams,
    rng: Rng,
    now: Time,
    seq: u64,
    events: BinaryHeap<Reverse<(Time, u64, Event)>>,
    watchers: Vec<Watcher>,
    /// Kinds each node has listed at least once, and nodes that have listed them all.
    listed_kinds: Vec<u16>,
    synced_nodes: u32,
    watching: u32,
    down: bool,
    /// Bumped at every restart of the API server.
    generation: u32,
    recovering: bool,
    record: WatchRecord,
}

impl<'a> WatchSim<'a> {
    /// Runs `params` to the end.
    pub fn run(params: &'a WatchParams) -> WatchRecord {
        let seconds = usize::try_from(params.duration.as_secs()).unwrap_or(usize::MAX) + 1;
        let record = WatchRecord {
            lists: vec![0; seconds],
            pages: vec![0; seconds],
            objects: vec![0; seconds],
            bytes: vec![0; seconds],
            watches: vec![0; seconds],
            refused: vec![0; seconds],
            bookmarks: vec![0; seconds],
            events: vec![0; seconds],
            event_bytes: vec![0; seconds],
            gone: vec![0; seconds],
            synced_at: None,
            back_at: None,
        };
        let mut sim = WatchSim {
            params,
            rng: Rng::new(params.seed),
            now: Duration::ZERO,
            seq: 0,
            events: BinaryHeap::new(),
            watchers: Vec::new(),
            listed_kinds: vec![0; params.nodes as usize],
            synced_nodes: 0,
            watching: 0,
            down: false,
            generation: 0,
            recovering: false,
            record,
        };
        for node in 0..params.nodes {
            let started = match params.start {
                Start::Spread(within) => within.mul_f64(sim.rng.fraction()),
                Start::Together => Duration::ZERO,
            } + params.start_jitter.mul_f64(sim.rng.fraction());
            for kind in 0..params.set.kinds.len() {
                sim.watchers.push(Watcher {
                    node,
                    kind: u16::try_from(kind).unwrap_or(u16::MAX),
                    epoch: 0,
                    phase: Phase::Idle,
                    listed_in: None,
                    backoff: Backoff::default(),
                });
            }
            sim.schedule(started, Event::Start { node });
        }
        if let Some((at, kind)) = params.change {
            let kind = u16::try_from(kind).unwrap_or(u16::MAX);
            sim.schedule(at, Event::Change { kind });
        }
        if let Some((from, length)) = params.outage {
            sim.schedule(from, Event::Down);
            sim.schedule(from + length, Event::Up);
        }
        while let Some(Reverse((at, _, event))) = sim.events.pop() {
            if at > params.duration {
                break;
            }
            sim.now = at;
            match event {
                Event::Start { node } => {
                    let kinds = params.set.kinds.len() as u32;
                    for watcher in node * kinds..(node + 1) * kinds {
                        sim.list(watcher);
                    }
                }
                Event::List { watcher, epoch } if sim.current(watcher, epoch) => sim.list(watcher),
                Event::Page {
                    watcher,
                    epoch,
                    page,
                } if sim.current(watcher, epoch) => sim.page(watcher, page),
                Event::Watch { watcher, epoch } if sim.current(watcher, epoch) => {
                    sim.watch(watcher)
                }
                Event::Close { watcher, epoch } if sim.current(watcher, epoch) => {
                    sim.close(watcher)
                }
                Event::Down => sim.go_down(),
                Event::Up => {
                    sim.down = false;
                    sim.recovering = true;
                }
                Event::Change { kind } => sim.change(kind),
                _ => {}
            }
        }
        sim.record
    }

    fn schedule(&mut self, at: Time, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, event)));
    }

    fn second_of(&self, at: Time) -> usize {
        usize::try_from(at.as_secs()).unwrap_or(usize::MAX)
    }

    fn second(&self) -> usize {
        self.second_of(self.now)
    }

    fn current(&self, watcher: u32, epoch: u32) -> bool {
        self.watchers[watcher as usize].epoch == epoch
    }

    fn kind_of(&self, watcher: u32) -> Kind {
        self.params.set.kinds[usize::from(self.watchers[watcher as usize].kind)]
    }

    /// A (re)list: the first page.
    fn list(&mut self, watcher: u32) {
        let w = &mut self.watchers[watcher as usize];
        w.phase = Phase::Listing;
        self.page(watcher, 0);
    }

    /// A list request: one page of up to `page_size` objects from the watch cache. The last page
    /// carries the list's resourceVersion, from which the watch starts.
    fn page(&mut self, watcher: u32, page: u32) {
        if self.down {
            let second = self.second();
            self.record.refused[second] += 1;
            // A failed page: the whole list again, after the back-off.
            self.back_off(watcher, |watcher, epoch| Event::List { watcher, epoch });
            return;
        }
        let kind = self.kind_of(watcher);
        let size = self.params.page_size.max(1);
        let objects = kind.objects.saturating_sub(page * size).min(size);
        let second = self.second();
        if page == 0 {
            self.record.lists[second] += 1;
        }
        self.record.pages[second] += 1;
        self.record.objects[second] += u64::from(objects);
        self.record.bytes[second] += u64::from(objects) * u64::from(kind.bytes);
        let answered = self.now + self.params.page_latency;
        let epoch = self.watchers[watcher as usize].epoch;
        if (page + 1) * size < kind.objects {
            self.schedule(
                answered,
                Event::Page {
                    watcher,
                    epoch,
                    page: page + 1,
                },
            );
            return;
        }
        // The list is complete, then the watch: decided locally from the answer on.
        let generation = self.generation;
        let w = &mut self.watchers[watcher as usize];
        w.backoff.reset();
        let first = w.listed_in.is_none();
        w.listed_in = Some(generation);
        let node = w.node as usize;
        if first {
            self.listed_kinds[node] += 1;
            if usize::from(self.listed_kinds[node]) == self.params.set.kinds.len() {
                self.synced_nodes += 1;
                if self.synced_nodes == self.params.nodes {
                    self.record.synced_at = Some(answered);
                }
            }
        }
        self.schedule(answered, Event::Watch { watcher, epoch });
    }

    /// A watch request from the last resourceVersion.
    fn watch(&mut self, watcher: u32) {
        let second = self.second();
        if self.down {
            self.record.refused[second] += 1;
            // After the back-off it watches again from the same resourceVersion.
            self.back_off(watcher, |watcher, epoch| Event::Watch { watcher, epoch });
            return;
        }
        self.record.watches[second] += 1;
        let stale = self.watchers[watcher as usize]
            .listed_in
            .is_some_and(|listed| listed < self.generation);
        if self.params.gone_after_outage && stale {
            // The watch is accepted, then its first event is an ERROR 410: a relist at once.
            self.record.gone[second] += 1;
            self.list(watcher);
            return;
        }
        // Each watch draws its own timeout.
        let (low, high) = self.params.timeout_secs;
        let spread = (high - low + 1) as f64 * self.rng.fraction();
        let deadline = self.now + Duration::from_secs(low + (spread as u64).min(high - low));
        let since = self.now;
        let w = &mut self.watchers[watcher as usize];
        w.phase = Phase::Watching { since, deadline };
        let epoch = w.epoch;
        self.watching += 1;
        if self.recovering && self.watching == u32::try_from(self.watchers.len()).unwrap_or(0) {
            self.recovering = false;
            self.record.back_at = Some(self.now);
        }
        self.schedule(deadline, Event::Close { watcher, epoch });
    }

    /// The server ends the watch at its timeout; the stream ends without an error, and the
    /// watcher watches again at once from its resourceVersion (no back-off, no list), its
    /// back-off forgotten.
    fn close(&mut self, watcher: u32) {
        self.end_watch(watcher);
        self.watchers[watcher as usize].backoff.reset();
        self.watch(watcher);
    }

    /// A watch ends now: count the bookmarks it got, and stop it.
    fn end_watch(&mut self, watcher: u32) {
        let Phase::Watching { since, deadline } = self.watchers[watcher as usize].phase else {
            return;
        };
        let last = deadline.saturating_sub(BOOKMARK_BEFORE_TIMEOUT);
        let mut at = since + BOOKMARK_EVERY;
        while at < last && at <= self.now {
            let second = self.second_of(at);
            self.record.bookmarks[second] += 1;
            at += BOOKMARK_EVERY;
        }
        if last > since && last <= self.now {
            let second = self.second_of(last);
            self.record.bookmarks[second] += 1;
        }
        let w = &mut self.watchers[watcher as usize];
        w.phase = Phase::Idle;
        w.epoch += 1;
        // A bookmark carries the latest resourceVersion, not a newer history.
        self.watching -= 1;
    }

    /// An error: the watcher sleeps its back-off, then goes on with `next`.
    fn back_off(&mut self, watcher: u32, next: fn(u32, u32) -> Event) {
        let draw = self.rng.fraction();
        let now = self.now;
        let w = &mut self.watchers[watcher as usize];
        let delay = w.backoff.next(draw);
        w.phase = Phase::Idle;
        w.epoch += 1;
        let epoch = w.epoch;
        self.schedule(now + delay, next(watcher, epoch));
    }

    /// The API server stops: every watch stream ends, and every watcher watches again at once
    /// (refused, then backing off); lists in progress fail at their next page.
    fn go_down(&mut self) {
        self.down = true;
        self.generation += 1;
        for watcher in 0..u32::try_from(self.watchers.len()).unwrap_or(0) {
            if let Phase::Watching { .. } = self.watchers[watcher as usize].phase {
                self.end_watch(watcher);
                self.watch(watcher);
            }
        }
    }

    /// One object of `kind` created: one event to every watcher of that kind.
    fn change(&mut self, kind: u16) {
        let bytes = self.params.set.kinds[usize::from(kind)].bytes;
        let second = self.second();
        for w in &self.watchers {
            if w.kind == kind && matches!(w.phase, Phase::Watching { .. }) {
                self.record.events[second] += 1;
                self.record.event_bytes[second] += u64::from(bytes);
            }
        }
    }
}

//! Whether the watched state may be used, kind by kind: synced at least once, and not broken for
//! longer than the staleness bound (`--rbac-max-staleness`). Requests read one atomic; the watch
//! tasks recompute it when a kind's health changes.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::kinds::WatchKind;

/// `usable_until` while every kind is synced and healthy.
const FOREVER: u64 = u64::MAX;

/// The health of the watches, read on every request the `RBAC` authorizer answers.
#[derive(Debug)]
pub struct Health {
    /// Times are milliseconds since this.
    epoch: Instant,
    /// How long a broken watch's last state may still decide.
    max_staleness: Duration,
    /// The kinds watched, by [`WatchKind::index`] (the unwatched ones stay synced and healthy).
    kinds: [KindHealth; 4],
    /// The watched state decides while `now < usable_until` (milliseconds since `epoch`): 0 before
    /// every kind synced, [`FOREVER`] while every watch is healthy, else the oldest break plus
    /// the bound.
    usable_until: AtomicU64,
    /// Serializes recomputing `usable_until`, so an older computation never overwrites a newer
    /// one. Taken only by the watch tasks.
    recompute: Mutex<()>,
}

#[derive(Debug, Default)]
struct KindHealth {
    /// A complete list (or stream of initial events) has been applied once.
    synced: AtomicBool,
    /// Milliseconds since the epoch, plus one, of the first failure since the last contact; 0
    /// while healthy.
    broken_since: AtomicU64,
    /// Milliseconds since the epoch of the last word from the API server on this kind: a list,
    /// a watch started, an event, a bookmark.
    last_contact: AtomicU64,
}

/// Where the watched state stands, for the reasons, `explain` and `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Some kind has never been listed completely.
    NotSynced {
        /// The first kind not synced.
        kind: WatchKind,
    },
    /// Every watch is healthy.
    Fresh,
    /// Some watch is broken, for less than the bound: the last state decides.
    Stale {
        /// The kind broken longest.
        kind: WatchKind,
        /// For how long.
        broken_for: Duration,
    },
    /// Some watch has been broken for longer than the bound: no opinion.
    Expired {
        /// The kind broken longest.
        kind: WatchKind,
        /// For how long.
        broken_for: Duration,
    },
}

impl Health {
    /// Every watched kind unsynced; the kinds not watched count as synced and healthy.
    pub fn new(watched: &[WatchKind], max_staleness: Duration) -> Health {
        let health = Health {
            epoch: Instant::now(),
            max_staleness,
            kinds: Default::default(),
            usable_until: AtomicU64::new(0),
            recompute: Mutex::new(()),
        };
        for kind in WatchKind::ALL {
            if !watched.contains(&kind) {
                health.kinds[kind.index()]
                    .synced
                    .store(true, Ordering::Relaxed);
            }
        }
        health
    }

    /// How long ago the watches started.
    pub fn age(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Whether the watched state decides now: the request path's one check.
    pub fn usable(&self) -> bool {
        self.now() < self.usable_until.load(Ordering::Acquire)
    }

    /// The API server answered about `kind`: a list, a watch started, an event or a bookmark.
    pub fn contact(&self, kind: WatchKind) {
        let k = &self.kinds[kind.index()];
        k.last_contact.store(self.now().max(1), Ordering::Relaxed);
        if k.broken_since.swap(0, Ordering::Relaxed) != 0 {
            self.recompute();
        }
    }

    /// A policy holding `kind`'s complete list is in force. Said again after every rebuild, so
    /// it must not count as a word from the API server: a kind whose watch is broken stays
    /// broken however often other kinds change.
    pub fn synced(&self, kind: WatchKind) {
        let k = &self.kinds[kind.index()];
        if !k.synced.swap(true, Ordering::Relaxed) {
            self.recompute();
        }
    }

    /// Asking the API server about `kind` failed; the staleness clock starts now unless it
    /// already runs, or, when the watch had gone `silent` (nothing came until its idle timeout,
    /// so the connection may have been lost long before), at the last contact.
    pub fn broken(&self, kind: WatchKind, silent: bool) {
        let k = &self.kinds[kind.index()];
        let now = if silent {
            k.last_contact.load(Ordering::Relaxed)
        } else {
            self.now()
        } + 1;
        let started = k
            .broken_since
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        if started.is_ok() {
            self.recompute();
        }
    }

    /// Whether every watched kind has been synced once.
    pub fn all_synced(&self) -> bool {
        self.kinds.iter().all(|k| k.synced.load(Ordering::Relaxed))
    }

    /// Whether `kind` is synced and its watch healthy.
    pub fn kind_healthy(&self, kind: WatchKind) -> bool {
        let k = &self.kinds[kind.index()];
        k.synced.load(Ordering::Relaxed) && k.broken_since.load(Ordering::Relaxed) == 0
    }

    /// How long ago the API server last answered about `kind`, `None` if never.
    pub fn since_contact(&self, kind: WatchKind) -> Option<Duration> {
        let at = self.kinds[kind.index()]
            .last_contact
            .load(Ordering::Relaxed);
        (at != 0).then(|| Duration::from_millis(self.now().saturating_sub(at)))
    }

    /// Where the watched state stands now.
    pub fn state(&self) -> State {
        if let Some(kind) = WatchKind::ALL
            .into_iter()
            .find(|k| !self.kinds[k.index()].synced.load(Ordering::Relaxed))
        {
            return State::NotSynced { kind };
        }
        let now = self.now();
        let broken = WatchKind::ALL
            .into_iter()
            .filter_map(|kind| {
                let since = self.kinds[kind.index()]
                    .broken_since
                    .load(Ordering::Relaxed);
                (since != 0).then(|| (kind, Duration::from_millis(now.saturating_sub(since - 1))))
            })
            .max_by_key(|&(_, broken_for)| broken_for);
        match broken {
            None => State::Fresh,
            Some((kind, broken_for)) if broken_for < self.max_staleness => {
                State::Stale { kind, broken_for }
            }
            Some((kind, broken_for)) => State::Expired { kind, broken_for },
        }
    }

    fn recompute(&self) {
        // A poisoned lock only means another watch task panicked while holding it; the guard
        // protects no data, so go on.
        let _serial = self
            .recompute
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let until = if !self.all_synced() {
            0
        } else {
            let bound = u64::try_from(self.max_staleness.as_millis()).unwrap_or(FOREVER);
            self.kinds
                .iter()
                .filter_map(|k| match k.broken_since.load(Ordering::Relaxed) {
                    0 => None,
                    since => Some((since - 1).saturating_add(bound)),
                })
                .min()
                .unwrap_or(FOREVER)
        };
        self.usable_until.store(until, Ordering::Release);
    }

    /// Milliseconds since the epoch.
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(FOREVER - 1)
    }
}

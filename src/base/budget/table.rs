//! A bounded table of token buckets keyed by what a client chooses: [`SHARDS`] shards, each
//! behind its own mutex and holding at most the table's shard capacity, indexed by a keyed
//! SipHash (std's `RandomState`) so a client cannot aim keys at one shard. A key arriving at a
//! full shard takes the place of an idle one (bucket full, nothing to report), else shares the
//! overflow entry with every key beyond the table: a client with endless keys gets one bucket
//! more, never unbounded memory, and never a fresh bucket per key.
//!
//! Each entry also holds what its key had refused since its last report (`P`), so that
//! whoever meters with the table can write one summary per key and interval
//! ([`Table::take_due`]) instead of one line per refusal.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{Bucket, Limits};

/// Shards of a table.
pub const SHARDS: usize = 16;

/// What an entry has to report; empty when there is nothing. It may also remember something
/// about its key that outlives a report (how the key stood lately), which keeps the entry from
/// being taken for idle while it matters.
pub trait Pending: Default {
    /// Nothing to report.
    fn is_empty(&self) -> bool;

    /// Whether the entry still remembers something about its key at `now`, though it has
    /// nothing to report and a full bucket: such an entry is not idle.
    fn remembers(&self, _now: Instant) -> bool {
        false
    }

    /// Takes what there is to report, leaving what is remembered.
    fn take_report(&mut self) -> Self {
        std::mem::take(self)
    }
}

/// One key's bucket and what it has to report.
#[derive(Debug)]
pub struct Entry<P> {
    /// The key's budget.
    pub bucket: Bucket,
    /// Places taken by work that has not settled yet (a review in flight). An entry holding any
    /// is never idle, so it is still there when the work settles.
    pub held: u32,
    /// What the key had refused since its last summary.
    pub pending: P,
    /// When its last summary was taken.
    summarized: Option<Instant>,
}

impl<P: Pending> Entry<P> {
    fn new(limits: Limits, now: Instant) -> Entry<P> {
        Entry {
            bucket: Bucket::full(limits, now),
            held: 0,
            pending: P::default(),
            summarized: None,
        }
    }

    fn idle(&mut self, limits: Limits, now: Instant) -> bool {
        self.bucket.refill(limits, now);
        self.held == 0
            && self.pending.is_empty()
            && !self.pending.remembers(now)
            && self.bucket.tokens >= limits.burst
    }
}

/// Which entry a key was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Its own.
    Own,
    /// The one shared by the keys beyond the table.
    Overflow,
}

/// A summary due: for which key (`None`: the keys beyond the table), and what.
#[derive(Debug)]
pub struct Due<K, P> {
    /// The key, or `None` for the overflow entry.
    pub key: Option<K>,
    /// What it had to report, taken from its entry.
    pub pending: P,
}

/// The table: each key's bucket of `limits`.
#[derive(Debug)]
pub struct Table<K, P> {
    limits: Limits,
    shard_capacity: usize,
    shards: Vec<Mutex<HashMap<K, Entry<P>>>>,
    overflow: Mutex<Entry<P>>,
    hasher: RandomState,
}

impl<K: Eq + Hash + Clone, P: Pending> Table<K, P> {
    /// A table of at most [`SHARDS`] × `shard_capacity` keys, each with a bucket of `limits`,
    /// full at `now`.
    pub fn new(limits: Limits, shard_capacity: usize, now: Instant) -> Table<K, P> {
        Table {
            limits,
            shard_capacity,
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::with_capacity(shard_capacity)))
                .collect(),
            overflow: Mutex::new(Entry::new(limits, now)),
            hasher: RandomState::new(),
        }
    }

    /// Runs `f` on `key`'s entry, its bucket refilled to `now`: its own, made room for when new,
    /// or the overflow's; `f` is told which.
    pub fn with_entry<T>(
        &self,
        key: &K,
        now: Instant,
        f: impl FnOnce(&mut Entry<P>, Place) -> T,
    ) -> T {
        let limits = self.limits;
        let shard = &self.shards[self.hasher.hash_one(key) as usize % SHARDS];
        let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
        // The usual case, a known key: it is not cloned.
        if let Some(entry) = shard.get_mut(key) {
            entry.bucket.refill(limits, now);
            return f(entry, Place::Own);
        }
        if shard.len() >= self.shard_capacity {
            let idle = shard
                .iter_mut()
                .find_map(|(key, entry)| entry.idle(limits, now).then(|| key.clone()));
            if let Some(idle) = idle {
                shard.remove(&idle);
            }
        }
        if shard.len() < self.shard_capacity {
            let entry = shard
                .entry(key.clone())
                .or_insert_with(|| Entry::new(limits, now));
            return f(entry, Place::Own);
        }
        drop(shard);
        self.in_overflow(now, f)
    }

    /// Runs `f` on the entry `key` was given in `place` by an earlier [`with_entry`](Self::with_entry)
    /// (`Table::with_entry`) that took a place in it ([`Entry::held`]): that entry is not idle,
    /// so it is still there.
    pub fn with_place<T>(
        &self,
        key: &K,
        place: Place,
        now: Instant,
        f: impl FnOnce(&mut Entry<P>, Place) -> T,
    ) -> T {
        match place {
            Place::Own => self.with_entry(key, now, f),
            Place::Overflow => self.in_overflow(now, f),
        }
    }

    fn in_overflow<T>(&self, now: Instant, f: impl FnOnce(&mut Entry<P>, Place) -> T) -> T {
        let mut overflow = self.overflow.lock().unwrap_or_else(PoisonError::into_inner);
        overflow.bucket.refill(self.limits, now);
        f(&mut overflow, Place::Overflow)
    }

    /// Folds `f` over every entry with a key of its own, each refilled to `now`: one shard
    /// locked at a time, so `f` must not look at the table. For what only a flood needs (the
    /// audit budget's fair share), never per request.
    pub fn fold<T>(&self, init: T, now: Instant, mut f: impl FnMut(T, &mut Entry<P>) -> T) -> T {
        let mut acc = init;
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            for entry in shard.values_mut() {
                entry.bucket.refill(self.limits, now);
                acc = f(acc, entry);
            }
        }
        acc
    }

    /// Takes, for at most `limit` keys, what they had to report, from those whose last summary
    /// is at least `interval` old (all of them when `interval` is zero).
    pub fn take_due(&self, now: Instant, interval: Duration, limit: usize) -> Vec<Due<K, P>> {
        let mut due = Vec::new();
        let ready = |entry: &Entry<P>| {
            !entry.pending.is_empty()
                && entry
                    .summarized
                    .is_none_or(|at| now.saturating_duration_since(at) >= interval)
        };
        let take = |entry: &mut Entry<P>, key: Option<K>| {
            entry.summarized = Some(now);
            Due {
                key,
                pending: entry.pending.take_report(),
            }
        };
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            for (key, entry) in shard.iter_mut() {
                if due.len() >= limit {
                    return due;
                }
                if ready(entry) {
                    due.push(take(entry, Some(key.clone())));
                }
            }
        }
        let mut overflow = self.overflow.lock().unwrap_or_else(PoisonError::into_inner);
        if due.len() < limit && ready(&overflow) {
            due.push(take(&mut overflow, None));
        }
        due
    }

    /// How many keys have an entry of their own.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    /// Whether `key` has an entry of its own.
    #[cfg(test)]
    pub(crate) fn contains(&self, key: &K) -> bool {
        self.shards[self.hasher.hash_one(key) as usize % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default)]
    struct Count(u64);

    impl Pending for Count {
        fn is_empty(&self) -> bool {
            self.0 == 0
        }
    }

    const LIMITS: Limits = Limits {
        burst: 2.0,
        rate: 1.0,
    };

    fn refuse(table: &Table<u32, Count>, key: u32, now: Instant) {
        table.with_entry(&key, now, |entry, _| {
            entry.bucket.tokens = 0.0;
            entry.pending.0 += 1;
        });
    }

    #[test]
    fn keys_beyond_the_table_share_the_overflow_and_idle_ones_make_room() {
        let start = Instant::now();
        let table = Table::<u32, Count>::new(LIMITS, 4, start);
        for key in 0..200 {
            refuse(&table, key, start);
        }
        assert_eq!(table.len(), SHARDS * 4);
        let due = table.take_due(start, Duration::ZERO, usize::MAX);
        let total: u64 = due.iter().map(|d| d.pending.0).sum();
        assert_eq!(total, 200, "every refusal is reported, the overflow's too");
        assert!(due.iter().any(|d| d.key.is_none()));
        // Reported, and full again a minute later: idle, so a new key takes a place.
        table.with_entry(&1000, start + Duration::from_secs(60), |_, _| ());
        assert!(table.contains(&1000));
    }

    #[test]
    fn summaries_are_due_once_per_interval_per_key() {
        let start = Instant::now();
        let minute = Duration::from_secs(60);
        let table = Table::<u32, Count>::new(LIMITS, 4, start);
        refuse(&table, 7, start);
        refuse(&table, 7, start);
        let due = table.take_due(start, minute, 18);
        assert_eq!((due.len(), due[0].key, due[0].pending.0), (1, Some(7), 2));
        refuse(&table, 7, start);
        assert!(table.take_due(start + minute / 2, minute, 18).is_empty());
        let due = table.take_due(start + minute, minute, 18);
        assert_eq!(due[0].pending.0, 1);
        for key in 0..10 {
            refuse(&table, key, start);
        }
        assert_eq!(table.take_due(start + minute * 3, minute, 4).len(), 4);
    }
}

//! Bounded caches of API server review answers, with a time to live chosen per answer and
//! coalescing of concurrent misses: N requests that miss on the same key make one API server call
//! and share its answer (the kubelet's own caches call once per request). Errors are shared with
//! the requests that waited for them but never cached.
//!
//! Two fleet-scale rules ([`policy`], `docs/FLEET.md`): a new key's first entry lives a random
//! part of its TTL, so keys filled at one moment on every node (a restart, a token rotation) do
//! not expire together forever after; and an entry used in the last part of its lifetime is
//! revalidated in the background, once, while requests keep being answered from it, so a key in
//! steady use never makes a request wait for a review.
//!
//! Keys are 32-byte digests of a length-prefixed encoding of every field that matters, so a key
//! holds no secret and no lookup clones request data. Token keys are an HMAC with a per-process
//! random key, so even the digest of a token is useless outside this process.

pub mod policy;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use moka::Expiry;
use moka::future::Cache;
use prometheus_client::metrics::counter::Counter;
use ring::{digest, hmac};
use tokio::sync::watch;

use super::metrics::{ApiServerMetrics, CacheResult, ReviewKind};
use policy::Fill;

/// A cache key: the digest of everything the answer depends on.
pub type CacheKey = [u8; 32];

/// Builds a [`CacheKey`] from fields, each length-prefixed so that no two different field lists
/// encode alike (`["ab", "c"]` ≠ `["a", "bc"]`).
///
/// Cloneable, so that a prefix shared by many keys (a user's part of a SubjectAccessReview key)
/// is hashed once and each key pays only for what follows it ([`pad_to_block`](Self::pad_to_block)).
#[derive(Clone)]
pub struct KeyHasher {
    mac: Mac,
    /// Bytes taken so far.
    len: usize,
}

/// The function a [`KeyHasher`] computes.
#[derive(Clone)]
enum Mac {
    /// Plain SHA-256, for keys built from non-secret data.
    Sha256(digest::Context),
    /// HMAC-SHA256 with a secret key, for keys built from credentials.
    Hmac(hmac::Context),
}

/// SHA-256's block: a hasher holding a whole number of them has nothing pending.
const BLOCK_LEN: usize = 64;

impl KeyHasher {
    /// A SHA-256 key builder.
    pub fn sha256() -> KeyHasher {
        KeyHasher {
            mac: Mac::Sha256(digest::Context::new(&digest::SHA256)),
            len: 0,
        }
    }

    /// An HMAC-SHA256 key builder with `key`.
    pub fn hmac(key: &hmac::Key) -> KeyHasher {
        KeyHasher {
            mac: Mac::Hmac(hmac::Context::with_key(key)),
            len: 0,
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        self.len = self.len.saturating_add(bytes.len());
        match &mut self.mac {
            Mac::Sha256(ctx) => ctx.update(bytes),
            Mac::Hmac(ctx) => ctx.update(bytes),
        }
    }

    /// Adds one field: its length (u32, big-endian, saturating) and its bytes.
    pub fn field(&mut self, bytes: &[u8]) -> &mut Self {
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        self.update(&len.to_be_bytes());
        self.update(bytes);
        self
    }

    /// Adds a count, e.g. of the list items that follow.
    pub fn count(&mut self, n: usize) -> &mut Self {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        self.update(&n.to_be_bytes());
        self
    }

    /// Adds zeros up to the next block boundary, ending a prefix: a clone of the hasher then
    /// holds nothing pending, and what each key adds after the prefix costs only its own blocks
    /// (a prefix ending mid-block would make every key hash that block's remainder again). The
    /// zeros keep the encoding unambiguous only after a prefix that says itself where it ends,
    /// e.g. a fixed list of fields and counted lists: their number is then a function of that
    /// prefix.
    pub fn pad_to_block(&mut self) -> &mut Self {
        let zeros = [0u8; BLOCK_LEN];
        let missing = (BLOCK_LEN - self.len % BLOCK_LEN) % BLOCK_LEN;
        self.update(&zeros[..missing]);
        self
    }

    /// The key.
    pub fn finish(self) -> CacheKey {
        let mut key = [0u8; 32];
        match self.mac {
            Mac::Sha256(ctx) => key.copy_from_slice(ctx.finish().as_ref()),
            Mac::Hmac(ctx) => key.copy_from_slice(ctx.sign().as_ref()),
        }
        key
    }
}

/// A fresh random HMAC key for this process.
pub fn random_hmac_key() -> Result<hmac::Key, ring::error::Unspecified> {
    hmac::Key::generate(hmac::HMAC_SHA256, &ring::rand::SystemRandom::new())
}

/// The time to live of an answer, decided from the answer itself.
type TtlOf<V> = Arc<dyn Fn(&V) -> Duration + Send + Sync>;

/// An answer as kept: with its lifetime, which the cache's expiry reads, and whether it is being
/// refreshed ahead.
#[derive(Clone)]
struct Stored<V> {
    value: V,
    filled: Instant,
    lifetime: Duration,
    /// Set by the first use that starts a refresh ahead; never cleared, so an entry is refreshed
    /// at most once (a failed refresh is not retried before the entry expires).
    refreshing: Arc<AtomicBool>,
}

/// Each entry expires after its own lifetime.
struct StoredLifetime;

impl<V> Expiry<CacheKey, Stored<V>> for StoredLifetime {
    fn expire_after_create(
        &self,
        _key: &CacheKey,
        value: &Stored<V>,
        _now: Instant,
    ) -> Option<Duration> {
        Some(value.lifetime)
    }

    fn expire_after_update(
        &self,
        _key: &CacheKey,
        value: &Stored<V>,
        _now: Instant,
        _remaining: Option<Duration>,
    ) -> Option<Duration> {
        Some(value.lifetime)
    }
}

/// Keys filled lately, each kept for the duration it holds: what tells a new key from a renewal.
struct RememberedFor;

impl Expiry<CacheKey, Duration> for RememberedFor {
    fn expire_after_create(
        &self,
        _key: &CacheKey,
        for_: &Duration,
        _now: Instant,
    ) -> Option<Duration> {
        Some(*for_)
    }

    fn expire_after_update(
        &self,
        _key: &CacheKey,
        for_: &Duration,
        _now: Instant,
        _remaining: Option<Duration>,
    ) -> Option<Duration> {
        Some(*for_)
    }
}

/// A bounded, expiring, coalescing cache of review answers of type `V`.
pub struct ReviewCache<V> {
    entries: Cache<CacheKey, Stored<V>>,
    /// Keys whose entry was filled within the last lifetime and TTL ([`policy::remembered_for`]),
    /// as many as there may be entries: a key found here is refilled as a renewal.
    known: Cache<CacheKey, Duration>,
    ttl: TtlOf<V>,
    /// Refreshes ahead still running, by key: a miss on a key whose entry expired before its
    /// refresh answered waits for that refresh instead of making a second review. Touched only
    /// on misses and by refreshes, never on a hit; at most one per entry.
    refreshes: Arc<Mutex<HashMap<CacheKey, watch::Receiver<()>>>>,
    kind: ReviewKind,
    /// `metrics`' counter of this cache's hits, resolved once: a hit is the common case.
    hits: Counter,
    metrics: Arc<ApiServerMetrics>,
}

impl<V: Clone + Send + Sync + 'static> ReviewCache<V> {
    /// A cache of at most `max_entries` answers (least recently used evicted first), each kept
    /// for at most `ttl(answer)` ([`policy::lifetime`]); a zero TTL still coalesces concurrent
    /// lookups but keeps nothing.
    pub fn new(
        kind: ReviewKind,
        max_entries: u64,
        ttl: impl Fn(&V) -> Duration + Send + Sync + 'static,
        metrics: Arc<ApiServerMetrics>,
    ) -> ReviewCache<V> {
        ReviewCache {
            entries: Cache::builder()
                .max_capacity(max_entries)
                .expire_after(StoredLifetime)
                .build(),
            known: Cache::builder()
                .max_capacity(max_entries)
                .expire_after(RememberedFor)
                .build(),
            ttl: Arc::new(ttl),
            refreshes: Arc::default(),
            kind,
            hits: metrics.cache_lookups(kind, CacheResult::Hit),
            metrics,
        }
    }

    /// The cached answer for `key`, or the answer of the review `review` makes, which runs only
    /// if no other lookup of `key` is already running it. An `Err` is returned to every waiter
    /// and not cached. A hit in the last part of the entry's lifetime also starts, once, a
    /// refresh ahead with `review` in the background (so its future owns what it needs): its
    /// answer, allowing or not, replaces the entry as soon as it comes; a failure leaves the
    /// entry to its original expiry.
    pub async fn get_or_review<E, R, F>(&self, key: CacheKey, review: R) -> Result<V, Arc<E>>
    where
        R: FnOnce() -> F,
        F: Future<Output = Result<V, E>> + Send + 'static,
        E: Send + Sync + 'static,
    {
        if let Some(stored) = self.entries.get(&key).await {
            self.hits.inc();
            if policy::refresh_ahead_due(stored.lifetime, stored.filled.elapsed())
                && !stored.refreshing.swap(true, Ordering::AcqRel)
            {
                self.refresh_ahead(key, review());
            }
            return Ok(stored.value);
        }
        // The miss path lives on the heap: a review (an API server call with its retries) is a
        // future of kilobytes, and held inline it would make every request's future, hits
        // included, that much larger to create and move (under callgrind, the copy of the
        // request's future into its box was the largest single cost per request).
        let (value, result) = Box::pin(async move {
            if let Some(value) = self.join_refresh(&key).await {
                return Ok::<_, Arc<E>>((value, CacheResult::Coalesced));
            }
            let fill = if self.known.contains_key(&key) {
                Fill::Renewal
            } else {
                Fill::New
            };
            let review = review();
            let entry = self
                .entries
                .entry(key)
                .or_try_insert_with(async move { Ok(self.stored(key, review.await?, fill).await) })
                .await?;
            let result = if entry.is_fresh() {
                CacheResult::Miss
            } else {
                CacheResult::Coalesced
            };
            Ok((entry.into_value().value, result))
        })
        .await?;
        self.metrics.observe_cache(self.kind, result);
        Ok(value)
    }

    /// Waits for the refresh ahead of `key` if one is running, and returns the entry it left;
    /// `None` when there was none, or it failed (the caller then reviews, under the hold-off).
    async fn join_refresh(&self, key: &CacheKey) -> Option<V> {
        let running = self
            .refreshes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned();
        // The refresh drops its sender when it ends, however it ends.
        let _ = running?.changed().await;
        self.entries.get(key).await.map(|stored| stored.value)
    }

    /// Revalidates `key` in the background with `review`.
    fn refresh_ahead<E, F>(&self, key: CacheKey, review: F)
    where
        F: Future<Output = Result<V, E>> + Send + 'static,
        E: Send + Sync + 'static,
    {
        let cache = self.handle();
        let (running, joined) = watch::channel(());
        cache
            .refreshes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, joined);
        tokio::spawn(async move {
            let replaced = match review.await {
                Ok(value) => {
                    let stored = cache.stored(key, value, Fill::Renewal).await;
                    cache.entries.insert(key, stored).await;
                    true
                }
                Err(_) => false,
            };
            cache
                .refreshes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&key);
            // Wakes the misses that joined this refresh: the entry is in place (or not).
            drop(running);
            cache.metrics.refreshed_ahead(cache.kind, replaced);
        });
    }

    /// `value` as kept for `key`, with the lifetime [`policy::lifetime`] gives it; the key is
    /// remembered for [`policy::remembered_for`] that lifetime.
    async fn stored(&self, key: CacheKey, value: V, fill: Fill) -> Stored<V> {
        let ttl = (self.ttl)(&value);
        let lifetime = policy::lifetime(ttl, fill, random_fraction());
        self.known
            .insert(key, policy::remembered_for(lifetime, ttl))
            .await;
        Stored {
            value,
            filled: Instant::now(),
            lifetime,
            refreshing: Arc::default(),
        }
    }

    /// A second handle on the same caches, for a background refresh.
    fn handle(&self) -> ReviewCache<V> {
        ReviewCache {
            entries: self.entries.clone(),
            known: self.known.clone(),
            ttl: Arc::clone(&self.ttl),
            refreshes: Arc::clone(&self.refreshes),
            kind: self.kind,
            hits: self.hits.clone(),
            metrics: Arc::clone(&self.metrics),
        }
    }
}

/// A uniform fraction in [0, 1) from the system's randomness; 0 if it is unavailable (the
/// longest first lifetime; the shortest retry backoff).
pub(crate) fn random_fraction() -> f64 {
    let mut bytes = [0u8; 4];
    match ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes) {
        Ok(()) => f64::from(u32::from_le_bytes(bytes)) / (f64::from(u32::MAX) + 1.0),
        Err(_) => 0.0,
    }
}

#[cfg(test)]
mod tests;

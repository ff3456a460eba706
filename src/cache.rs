//! Bounded caches of API server review answers, with a time to live chosen per answer and
//! coalescing of concurrent misses: N requests that miss on the same key make one API server call
//! and share its answer (the kubelet's own caches call once per request). Errors are shared with
//! the requests that waited for them but never cached.
//!
//! Keys are 32-byte digests of a length-prefixed encoding of every field that matters, so a key
//! holds no secret and no lookup clones request data. Token keys are an HMAC with a per-process
//! random key, so even the digest of a token is useless outside this process.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::Expiry;
use moka::future::Cache;
use ring::{digest, hmac};

use crate::metrics::{CacheResult, Metrics, ReviewKind};

/// A cache key: the digest of everything the answer depends on.
pub type CacheKey = [u8; 32];

/// Builds a [`CacheKey`] from fields, each length-prefixed so that no two different field lists
/// encode alike (`["ab", "c"]` ≠ `["a", "bc"]`).
pub enum KeyHasher {
    /// Plain SHA-256, for keys built from non-secret data.
    Sha256(digest::Context),
    /// HMAC-SHA256 with a secret key, for keys built from credentials.
    Hmac(hmac::Context),
}

impl KeyHasher {
    /// A SHA-256 key builder.
    pub fn sha256() -> KeyHasher {
        KeyHasher::Sha256(digest::Context::new(&digest::SHA256))
    }

    /// An HMAC-SHA256 key builder with `key`.
    pub fn hmac(key: &hmac::Key) -> KeyHasher {
        KeyHasher::Hmac(hmac::Context::with_key(key))
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            KeyHasher::Sha256(ctx) => ctx.update(bytes),
            KeyHasher::Hmac(ctx) => ctx.update(bytes),
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

    /// The key.
    pub fn finish(self) -> CacheKey {
        let mut key = [0u8; 32];
        match self {
            KeyHasher::Sha256(ctx) => key.copy_from_slice(ctx.finish().as_ref()),
            KeyHasher::Hmac(ctx) => key.copy_from_slice(ctx.sign().as_ref()),
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

struct TtlByAnswer<V>(TtlOf<V>);

impl<V> Expiry<CacheKey, V> for TtlByAnswer<V> {
    fn expire_after_create(&self, _key: &CacheKey, value: &V, _now: Instant) -> Option<Duration> {
        Some((self.0)(value))
    }
}

/// A bounded, expiring, coalescing cache of review answers of type `V`.
pub struct ReviewCache<V> {
    cache: Cache<CacheKey, V>,
    kind: ReviewKind,
    metrics: Arc<Metrics>,
}

impl<V: Clone + Send + Sync + 'static> ReviewCache<V> {
    /// A cache of at most `max_entries` answers (least recently used evicted first), each kept
    /// for `ttl(answer)`; a zero TTL still coalesces concurrent lookups but keeps nothing.
    pub fn new(
        kind: ReviewKind,
        max_entries: u64,
        ttl: impl Fn(&V) -> Duration + Send + Sync + 'static,
        metrics: Arc<Metrics>,
    ) -> ReviewCache<V> {
        let cache = Cache::builder()
            .max_capacity(max_entries)
            .expire_after(TtlByAnswer(Arc::new(ttl) as TtlOf<V>))
            .build();
        ReviewCache {
            cache,
            kind,
            metrics,
        }
    }

    /// The cached answer for `key`, or the answer of the review `review()` starts, which runs
    /// only if no other lookup of `key` is already running it. An `Err` is returned to every
    /// waiter and not cached.
    ///
    /// The review is made only on a miss, and its future lives on the heap: a review (an API
    /// server call with its retries) is a future of kilobytes, and held inline it would make
    /// every request's future, hits included, that much larger to create and move (measured
    /// under callgrind: the copy of the request's future into its box was the largest single
    /// cost per request).
    pub async fn get_or_review<E, F>(
        &self,
        key: CacheKey,
        review: impl FnOnce() -> F,
    ) -> Result<V, Arc<E>>
    where
        F: Future<Output = Result<V, E>>,
        E: Send + Sync + 'static,
    {
        if let Some(answer) = self.cache.get(&key).await {
            self.metrics.observe_cache(self.kind, CacheResult::Hit);
            return Ok(answer);
        }
        let entry = Box::pin(async move {
            self.cache
                .entry(key)
                .or_try_insert_with(Box::pin(review()))
                .await
        })
        .await?;
        self.metrics.observe_cache(
            self.kind,
            if entry.is_fresh() {
                CacheResult::Miss
            } else {
                CacheResult::Coalesced
            },
        );
        Ok(entry.into_value())
    }
}

#[cfg(test)]
mod tests;

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

    /// The cached answer for `key`, or the answer of `review`, which runs only if no other lookup
    /// of `key` is already running it. An `Err` is returned to every waiter and not cached.
    pub async fn get_or_review<E, F>(&self, key: CacheKey, review: F) -> Result<V, Arc<E>>
    where
        F: Future<Output = Result<V, E>>,
        E: Send + Sync + 'static,
    {
        if let Some(answer) = self.cache.get(&key).await {
            self.metrics.observe_cache(self.kind, CacheResult::Hit);
            return Ok(answer);
        }
        let entry = self.cache.entry(key).or_try_insert_with(review).await?;
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
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn key(s: &str) -> CacheKey {
        let mut h = KeyHasher::sha256();
        h.field(s.as_bytes());
        h.finish()
    }

    #[test]
    fn fields_are_length_prefixed() {
        let mut a = KeyHasher::sha256();
        a.field(b"ab").field(b"c");
        let mut b = KeyHasher::sha256();
        b.field(b"a").field(b"bc");
        assert_ne!(a.finish(), b.finish());
        let secret = random_hmac_key().unwrap();
        let mut h = KeyHasher::hmac(&secret);
        h.field(b"ab").field(b"c");
        let mut plain = KeyHasher::sha256();
        plain.field(b"ab").field(b"c");
        assert_ne!(h.finish(), plain.finish());
    }

    #[tokio::test]
    async fn concurrent_misses_make_one_call_and_errors_are_not_kept() {
        let metrics = Arc::new(Metrics::new());
        let cache: Arc<ReviewCache<u32>> = Arc::new(ReviewCache::new(
            ReviewKind::TokenReview,
            100,
            |_| Duration::from_secs(60),
            Arc::clone(&metrics),
        ));
        let calls = Arc::new(AtomicUsize::new(0));
        let (release, gate) = tokio::sync::watch::channel(false);
        let mut waiters = Vec::new();
        for _ in 0..50 {
            let (cache, calls, mut gate) = (Arc::clone(&cache), Arc::clone(&calls), gate.clone());
            waiters.push(tokio::spawn(async move {
                cache
                    .get_or_review(key("k"), async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        let _ = gate.wait_for(|open| *open).await;
                        Ok::<_, ()>(7)
                    })
                    .await
            }));
        }
        tokio::task::yield_now().await;
        release.send(true).unwrap();
        for waiter in waiters {
            assert_eq!(waiter.await.unwrap(), Ok(7));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let again = cache
            .get_or_review(key("k"), async { Err::<u32, _>("must not run") })
            .await;
        assert_eq!(again, Ok(7));

        let failed = cache
            .get_or_review(key("e"), async { Err::<u32, _>("boom") })
            .await;
        assert_eq!(failed.unwrap_err().as_ref(), &"boom");
        let retried = cache
            .get_or_review(key("e"), async { Ok::<_, &str>(9) })
            .await;
        assert_eq!(retried, Ok(9), "an error must not be cached");
        let exposition = metrics.encode();
        assert!(
            exposition.contains(r#"cache="TokenReview",result="hit""#),
            "{exposition}"
        );
    }

    /// A million distinct keys, as a flood of a million distinct bad tokens would bring (61 times
    /// the cap): the cache never holds more than its cap (moka evicts, or refuses admission, as
    /// entries arrive). About 30 s in a debug build.
    #[tokio::test]
    async fn distinct_keys_far_beyond_the_cap_never_exceed_it() {
        const CAP: u64 = 16_384;
        let cache: ReviewCache<u32> = ReviewCache::new(
            ReviewKind::TokenReview,
            CAP,
            |_| Duration::from_secs(3600),
            Arc::new(Metrics::new()),
        );
        let mut most = 0;
        for i in 0..1_000_000u32 {
            let mut h = KeyHasher::sha256();
            h.field(&i.to_be_bytes());
            let answer = cache
                .get_or_review(h.finish(), async move { Ok::<_, ()>(i) })
                .await;
            assert_eq!(answer, Ok(i));
            if i % 65_536 == 0 {
                cache.cache.run_pending_tasks().await;
                most = most.max(cache.cache.entry_count());
            }
        }
        cache.cache.run_pending_tasks().await;
        let held = cache.cache.entry_count();
        assert!(held <= CAP, "{held} entries held");
        assert!(most <= CAP, "{most} entries held at one point");
        assert!(held > CAP / 2, "the cache is in use: {held} entries");
    }

    #[tokio::test]
    async fn ttl_is_chosen_per_answer() {
        let cache: ReviewCache<bool> = ReviewCache::new(
            ReviewKind::SubjectAccessReview,
            100,
            |allowed| {
                if *allowed {
                    Duration::from_secs(60)
                } else {
                    Duration::ZERO
                }
            },
            Arc::new(Metrics::new()),
        );
        assert_eq!(
            cache
                .get_or_review(key("yes"), async { Ok::<_, ()>(true) })
                .await,
            Ok(true)
        );
        assert_eq!(
            cache
                .get_or_review(key("no"), async { Ok::<_, ()>(false) })
                .await,
            Ok(false)
        );
        assert_eq!(
            cache
                .get_or_review(key("yes"), async { Ok::<_, ()>(false) })
                .await,
            Ok(true),
            "kept for its TTL"
        );
        assert_eq!(
            cache
                .get_or_review(key("no"), async { Ok::<_, ()>(true) })
                .await,
            Ok(true),
            "a zero TTL keeps nothing"
        );
    }
}

//! The review cache's tests: bounds, expiry and coalescing.

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

#[test]
fn padding_ends_a_prefix_at_a_block() {
    let key = |fields: &[&[u8]], pad: bool| {
        let mut h = KeyHasher::sha256();
        for f in &fields[..1] {
            h.field(f);
        }
        if pad {
            h.pad_to_block();
        }
        for f in &fields[1..] {
            h.field(f);
        }
        h.finish()
    };
    // 4 + 60 bytes: already at a block boundary, padding adds nothing.
    let aligned: &[&[u8]] = &[&[7; 60], b"x"];
    assert_eq!(key(aligned, true), key(aligned, false));
    // Otherwise zeros are added, which only the prefix's own encoding tells from data.
    let short: &[&[u8]] = &[b"ab", b"c"];
    assert_ne!(key(short, true), key(short, false));
    let mut explicit = KeyHasher::sha256();
    explicit.field(b"ab");
    explicit.update(&[0; 58]);
    explicit.field(b"c");
    assert_eq!(key(short, true), explicit.finish());
    // A clone of a padded prefix goes on exactly as the original would.
    let mut prefix = KeyHasher::sha256();
    prefix.field(b"ab").pad_to_block();
    let mut clone = prefix.clone();
    clone.field(b"c");
    assert_eq!(clone.finish(), key(short, true));
}

#[tokio::test]
async fn concurrent_misses_make_one_call_and_errors_are_not_kept() {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(ApiServerMetrics::register(&mut registry));
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
                .get_or_review(key("k"), move || async move {
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
        .get_or_review(key("k"), || async { Err::<u32, _>("must not run") })
        .await;
    assert_eq!(again, Ok(7));

    let failed = cache
        .get_or_review(key("e"), || async { Err::<u32, _>("boom") })
        .await;
    assert_eq!(failed.unwrap_err().as_ref(), &"boom");
    let retried = cache
        .get_or_review(key("e"), || async { Ok::<_, &str>(9) })
        .await;
    assert_eq!(retried, Ok(9), "an error must not be cached");
    let exposition = crate::base::metrics::encode(&registry);
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
        Arc::new(ApiServerMetrics::default()),
    );
    let mut most = 0;
    for i in 0..1_000_000u32 {
        let mut h = KeyHasher::sha256();
        h.field(&i.to_be_bytes());
        let answer = cache
            .get_or_review(h.finish(), move || async move { Ok::<_, ()>(i) })
            .await;
        assert_eq!(answer, Ok(i));
        if i % 65_536 == 0 {
            cache.entries.run_pending_tasks().await;
            most = most.max(cache.entries.entry_count());
        }
    }
    cache.entries.run_pending_tasks().await;
    let held = cache.entries.entry_count();
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
        Arc::new(ApiServerMetrics::default()),
    );
    assert_eq!(
        cache
            .get_or_review(key("yes"), || async { Ok::<_, ()>(true) })
            .await,
        Ok(true)
    );
    assert_eq!(
        cache
            .get_or_review(key("no"), || async { Ok::<_, ()>(false) })
            .await,
        Ok(false)
    );
    assert_eq!(
        cache
            .get_or_review(key("yes"), || async { Ok::<_, ()>(false) })
            .await,
        Ok(true),
        "kept for its TTL"
    );
    assert_eq!(
        cache
            .get_or_review(key("no"), || async { Ok::<_, ()>(true) })
            .await,
        Ok(true),
        "a zero TTL keeps nothing"
    );
}

/// A refresh ahead still running when its entry expires is joined by the next miss: the miss
/// gets the refresh's answer, and the API server is not asked a second time beside it.
#[tokio::test]
async fn a_miss_after_expiry_joins_the_refresh_ahead_still_running() {
    const TTL: Duration = Duration::from_secs(2);
    let cache = Arc::new(ReviewCache::new(
        ReviewKind::TokenReview,
        100,
        |_| TTL,
        Arc::new(ApiServerMetrics::default()),
    ));
    let reviews = Arc::new(AtomicUsize::new(0));
    let (release, gate) = tokio::sync::watch::channel(false);
    // A review answering `answer`; all but the first are held until the gate opens.
    let review = |answer: u32| {
        let (reviews, mut gate) = (Arc::clone(&reviews), gate.clone());
        move || async move {
            reviews.fetch_add(1, Ordering::SeqCst);
            if answer > 1 {
                let _ = gate.wait_for(|open| *open).await;
            }
            Ok::<_, ()>(answer)
        }
    };
    assert_eq!(cache.get_or_review(key("k"), review(1)).await, Ok(1));
    // Hits until one falls in the last tenth of the entry's lifetime (at least 50 ms long) and
    // starts the refresh, which the gate holds.
    while reviews.load(Ordering::SeqCst) < 2 {
        let hit = tokio::time::timeout(TTL, cache.get_or_review(key("k"), review(2))).await;
        assert_eq!(hit, Ok(Ok(1)), "a hit, until the refresh starts");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The entry expires (its lifetime is at most the TTL) while the refresh is held.
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    let miss = tokio::spawn({
        let (cache, review) = (Arc::clone(&cache), review(3));
        async move { cache.get_or_review(key("k"), review).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    release.send(true).unwrap();
    assert_eq!(miss.await.unwrap(), Ok(2), "the refresh's answer");
    assert_eq!(reviews.load(Ordering::SeqCst), 2, "no second review");
}

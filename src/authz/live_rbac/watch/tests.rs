use std::time::Duration;

use kube::core::Status;
use kube::core::response::StatusDetails;

use super::{Backoff, Failure, MAX_BACKOFF, MAX_RETRY_AFTER};

/// The wait of one back-off step, on Tokio's paused clock.
async fn waited(backoff: &mut Backoff, retry_after: Option<Duration>) -> Duration {
    let started = tokio::time::Instant::now();
    backoff.wait(retry_after).await;
    started.elapsed()
}

#[tokio::test(start_paused = true)]
async fn back_off_doubles_with_jitter_up_to_its_ceiling_and_starts_over_when_reset() {
    let mut backoff = Backoff::default();
    let mut step = Duration::from_millis(800);
    for _ in 0..10 {
        let waited = waited(&mut backoff, None).await;
        assert!(
            waited >= step / 2 && waited <= step,
            "{waited:?} not in [{:?}, {step:?}]",
            step / 2
        );
        step = (step * 2).min(MAX_BACKOFF);
    }
    assert_eq!(step, MAX_BACKOFF);
    backoff.reset();
    assert!(waited(&mut backoff, None).await <= Duration::from_millis(800));
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_longer_than_the_step_is_obeyed() {
    let mut backoff = Backoff::default();
    let waited = waited(&mut backoff, Some(Duration::from_secs(45))).await;
    assert!(waited >= Duration::from_secs(45), "{waited:?}");
}

#[test]
fn retry_after_seconds_of_a_status_are_kept_and_bounded() {
    let status = |seconds: u32| Status {
        code: 429,
        reason: "TooManyRequests".to_owned(),
        message: "too many requests".to_owned(),
        details: Some(StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: String::new(),
            uid: String::new(),
            causes: Vec::new(),
            retry_after_seconds: seconds,
        }),
        ..Status::default()
    };
    let failure = Failure::from_status(&status(7));
    assert_eq!(failure.retry_after, Some(Duration::from_secs(7)));
    assert!(failure.cause.contains("429"), "{}", failure.cause);
    assert_eq!(
        Failure::from_status(&status(86_400)).retry_after,
        Some(MAX_RETRY_AFTER)
    );
    assert_eq!(Failure::from_status(&status(0)).retry_after, None);
}

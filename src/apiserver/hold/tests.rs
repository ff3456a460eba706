//! The hold-off on a paused clock: one call per `Retry-After`, whatever the number of callers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

const R: Duration = Duration::from_secs(2);
const BUDGET: Duration = Duration::from_secs(10);

#[tokio::test(start_paused = true)]
async fn without_a_hold_every_call_goes_at_once() {
    let hold = HoldOff::default();
    let started = Instant::now();
    for _ in 0..3 {
        hold.admit(BUDGET).await.unwrap().answered(None);
    }
    assert_eq!(Instant::now(), started);
}

/// Twenty callers during a 429 period of 6 s with `Retry-After: 2`: the calls go out one at a
/// time, R apart (P/R + 1 = 4 of them), then all at once when the API server answers again.
#[tokio::test(start_paused = true)]
async fn during_a_429_period_one_call_goes_out_per_retry_after() {
    let hold = Arc::new(HoldOff::default());
    let started = Instant::now();
    let throttle_until = started + Duration::from_secs(6);
    // A first call meets the first 429.
    hold.admit(BUDGET).await.unwrap().answered(Some(R));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::new();
    for _ in 0..20 {
        let (hold, sent, done) = (Arc::clone(&hold), Arc::clone(&sent), Arc::clone(&done));
        callers.push(tokio::spawn(async move {
            loop {
                let pass = hold.admit(BUDGET).await.expect("within the budget");
                let now = Instant::now();
                sent.lock().unwrap().push(now - started);
                // Each call takes 100 ms to be answered.
                tokio::time::sleep(Duration::from_millis(100)).await;
                if now < throttle_until {
                    pass.answered(Some(R));
                } else {
                    pass.answered(None);
                    done.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        }));
    }
    for caller in callers {
        caller.await.unwrap();
    }
    assert_eq!(done.load(Ordering::Relaxed), 20);
    let sent = sent.lock().unwrap().clone();
    let throttled: Vec<_> = sent
        .iter()
        .filter(|at| **at < Duration::from_secs(6))
        .collect();
    // Calls at 2.0, 4.1 s (each answered 100 ms later, the hold counted from the answer).
    assert_eq!(
        throttled,
        [&Duration::from_secs(2), &Duration::from_millis(4100)],
        "{sent:?}"
    );
    // The probe at 6.2 s is answered: the other 19 go at once.
    assert_eq!(sent.len(), 22, "{sent:?}");
    assert!(
        sent[2..]
            .iter()
            .all(|at| *at >= Duration::from_millis(6200)),
        "{sent:?}"
    );
    assert!(
        sent[3..]
            .iter()
            .all(|at| *at == Duration::from_millis(6300)),
        "{sent:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hold_longer_than_the_budget_fails_at_once() {
    let hold = HoldOff::default();
    hold.admit(BUDGET)
        .await
        .unwrap()
        .answered(Some(Duration::from_secs(20)));
    let started = Instant::now();
    let held = hold
        .admit(Duration::from_secs(5))
        .await
        .err()
        .expect("refused");
    assert_eq!(held.remaining, Duration::from_secs(20));
    assert_eq!(Instant::now(), started, "refused without waiting");
    // Capped: a Retry-After of an hour holds for MAX_HOLD.
    hold.admit(Duration::from_secs(60))
        .await
        .unwrap()
        .answered(Some(Duration::from_secs(3600)));
    let held = hold.admit(Duration::ZERO).await.err().expect("refused");
    assert_eq!(held.remaining, MAX_HOLD);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_probe_lets_the_next_caller_probe() {
    let hold = Arc::new(HoldOff::default());
    hold.admit(BUDGET).await.unwrap().answered(Some(R));
    let probe = hold.admit(BUDGET).await.unwrap();
    assert!(probe.probe);
    let waiter = {
        let hold = Arc::clone(&hold);
        tokio::spawn(async move { hold.admit(BUDGET).await.map(|pass| pass.probe) })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished(), "waits for the probe's answer");
    drop(probe);
    assert_eq!(waiter.await.unwrap(), Ok(true));
}

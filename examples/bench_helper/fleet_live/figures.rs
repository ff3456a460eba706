//! The arithmetic of the live fleet's figures, on the API server's call log and the clients'
//! latencies: counts in a window, the closest two arrivals, calls in flight at once, reviews per
//! window and their peak against their mean, percentiles. Pure functions of offsets from the
//! situation's start, so they are tested here without processes.

use std::time::Duration;

/// One review call as the stand-in API server saw it, as offsets from the situation's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// When it arrived.
    pub arrived: Duration,
    /// When its answer was ready.
    pub answered: Duration,
}

/// The spans that arrived in `[from, to)`, in order of arrival.
pub fn within(spans: &[Span], from: Duration, to: Duration) -> Vec<Span> {
    let mut inside: Vec<Span> = spans
        .iter()
        .copied()
        .filter(|s| s.arrived >= from && s.arrived < to)
        .collect();
    inside.sort_by_key(|s| s.arrived);
    inside
}

/// The shortest time between two arrivals (`None` for fewer than two).
pub fn closest_arrivals(spans: &[Span]) -> Option<Duration> {
    let mut arrivals: Vec<Duration> = spans.iter().map(|s| s.arrived).collect();
    arrivals.sort_unstable();
    arrivals.windows(2).map(|w| w[1] - w[0]).min()
}

/// The most calls in flight at one moment (a call is in flight from its arrival to its answer;
/// one that arrives as another is answered does not overlap it).
pub fn max_in_flight(spans: &[Span]) -> usize {
    // Ends sort before starts at the same instant.
    let mut events: Vec<(Duration, i32)> = spans
        .iter()
        .flat_map(|s| [(s.arrived, 1), (s.answered.max(s.arrived), -1)])
        .collect();
    events.sort_unstable();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

/// Arrivals per window of `width` from the start, for `windows` windows (later ones dropped).
pub fn per_window(spans: &[Span], width: Duration, windows: usize) -> Vec<usize> {
    let mut counts = vec![0usize; windows];
    if width.is_zero() {
        return counts;
    }
    for span in spans {
        let index = (span.arrived.as_nanos() / width.as_nanos()) as usize;
        if let Some(count) = counts.get_mut(index) {
            *count += 1;
        }
    }
    counts
}

/// The largest count and the mean of `counts` (`(0, 0.0)` when empty).
pub fn peak_and_mean(counts: &[usize]) -> (usize, f64) {
    if counts.is_empty() {
        return (0, 0.0);
    }
    let peak = counts.iter().copied().max().unwrap_or(0);
    let mean = counts.iter().sum::<usize>() as f64 / counts.len() as f64;
    (peak, mean)
}

/// The nearest-rank percentile `q` (0 < q ≤ 1) of sorted values.
pub fn percentile(sorted: &[Duration], q: f64) -> Option<Duration> {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.max(1) - 1).copied()
}

/// Milliseconds with one decimal, for the table.
pub fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(arrived_ms: u64, answered_ms: u64) -> Span {
        Span {
            arrived: Duration::from_millis(arrived_ms),
            answered: Duration::from_millis(answered_ms),
        }
    }

    #[test]
    fn windows_gaps_and_overlaps() {
        let spans = [span(0, 10), span(5, 20), span(20, 30), span(1500, 1501)];
        assert_eq!(
            within(&spans, Duration::ZERO, Duration::from_secs(1)).len(),
            3
        );
        assert_eq!(closest_arrivals(&spans), Some(Duration::from_millis(5)));
        assert_eq!(closest_arrivals(&spans[..1]), None);
        // The third arrives as the second is answered: two at most.
        assert_eq!(max_in_flight(&spans), 2);
        assert_eq!(max_in_flight(&[]), 0);
        assert_eq!(per_window(&spans, Duration::from_secs(1), 3), vec![3, 1, 0]);
        assert_eq!(peak_and_mean(&[3, 1, 0, 0]), (3, 1.0));
        assert_eq!(peak_and_mean(&[]), (0, 0.0));
    }

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&values, 0.5), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&values, 0.99), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&[], 0.99), None);
    }
}

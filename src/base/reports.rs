//! Reports of a recurring failure, at most one per cause per minute: a kubelet or an API server
//! that is down must not turn into a log line per request, while every new cause is said at once.
//! The upstream causes (`forward::cause`), failed reviews (`apiserver::failure`) and the RBAC
//! authorizer's watches use it.

/// Admits one report per cause per minute. `K` is the cause: an upstream cause, or a review kind
/// and its cause.
#[derive(Debug)]
pub struct Reports<K> {
    last: std::sync::Mutex<Vec<(K, std::time::Instant)>>,
}

impl<K> Default for Reports<K> {
    fn default() -> Reports<K> {
        Reports {
            last: std::sync::Mutex::new(Vec::new()),
        }
    }
}

/// How often one cause is reported.
const REPORT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

impl<K: PartialEq + Copy> Reports<K> {
    /// Whether a failure with `cause` should be reported now; records it if so.
    pub fn admit(&self, cause: K) -> bool {
        let Ok(mut last) = self.last.lock() else {
            return true;
        };
        let now = std::time::Instant::now();
        match last.iter_mut().find(|(c, _)| *c == cause) {
            Some((_, at)) if now.duration_since(*at) < REPORT_INTERVAL => false,
            Some((_, at)) => {
                *at = now;
                true
            }
            None => {
                last.push((cause, now));
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_is_reported_once_a_minute() {
        let reports = Reports::default();
        assert!(reports.admit("unknown_ca"));
        assert!(!reports.admit("unknown_ca"));
        assert!(reports.admit("connection_refused"));
    }
}

//! The file-descriptor budget. Every client connection, every request in flight to the kubelet and
//! every review in flight to an API server holds one descriptor; if their bounds together exceed
//! `RLIMIT_NOFILE`, a flood makes `accept` fail with `EMFILE` and the proxy can no longer open the
//! files, sockets and connections its other clients need. So at start the proxy raises its soft
//! limit to the hard limit (as Go programs such as the kubelet do since Go 1.19), and when the
//! bounds still do not fit, serves fewer client connections than `--max-connections` asks, with a
//! warning naming the flags. The accept loop then never runs out: it pauses at
//! `--max-connections`, waiting for a connection to end.

use std::io;

use rustix::process::{Resource, Rlimit};

/// Descriptors kept for everything that is not a connection: listeners, the admin listener, the
/// audit log, configuration files being re-read, the runtime's own (epoll, eventfd), stdio.
pub const RESERVED: u64 = 64;

/// What the connection bounds need from the descriptor limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    /// `--max-connections`.
    pub max_connections: u32,
    /// Kubelet connections: `--upstream-max-requests-inflight` for each serving thread, whose
    /// pool keeps open up to as many as it last had in flight.
    pub upstream: u64,
    /// Reviews in flight to every API server together.
    pub apiserver: u64,
}

/// The client connections to serve, and why fewer than asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// At most `--max-connections`.
    pub max_connections: u32,
    /// Set when `max_connections` had to be lowered.
    pub warning: Option<String>,
}

/// Why no budget is possible.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    /// The limit leaves too few descriptors for client connections.
    #[error(
        "the open-file limit ({limit}) leaves {left} descriptors for client connections after {upstream} for kubelet connections (--upstream-max-requests-inflight per --serving-threads), {apiserver} for API server reviews (--apiserver-max-reviews-inflight) and {reserved} reserved; raise it (systemd LimitNOFILE=, ulimit -n) or lower those flags"
    )]
    TooLow {
        limit: u64,
        left: u64,
        upstream: u64,
        apiserver: u64,
        reserved: u64,
    },
}

/// The fewest client connections worth serving; below this the limit is a misconfiguration.
const MIN_CLIENT_CONNECTIONS: u64 = 16;

/// Fits `demand` into `limit` descriptors.
pub fn plan(limit: u64, demand: Demand) -> Result<Plan, BudgetError> {
    let others = demand.upstream + demand.apiserver + RESERVED;
    let left = limit.saturating_sub(others);
    if left < MIN_CLIENT_CONNECTIONS.min(u64::from(demand.max_connections)) {
        return Err(BudgetError::TooLow {
            limit,
            left,
            upstream: demand.upstream,
            apiserver: demand.apiserver,
            reserved: RESERVED,
        });
    }
    if u64::from(demand.max_connections) <= left {
        return Ok(Plan {
            max_connections: demand.max_connections,
            warning: None,
        });
    }
    // `left` < max_connections, a u32.
    let max_connections = u32::try_from(left).unwrap_or(u32::MAX);
    Ok(Plan {
        max_connections,
        warning: Some(format!(
            "--max-connections={} does not fit the open-file limit ({limit}) beside kubelet connections ({}: --upstream-max-requests-inflight per --serving-threads) and API server reviews ({}); serving at most {max_connections} client connections. Raise the limit (systemd LimitNOFILE=, ulimit -n) to serve more",
            demand.max_connections, demand.upstream, demand.apiserver
        )),
    })
}

/// The hard `RLIMIT_NOFILE`: what the soft limit can be raised to without privileges, and so
/// the budget [`raise_soft_limit`] makes available. Unlimited reads as `u64::MAX`.
pub fn hard_limit() -> u64 {
    nofile().maximum.unwrap_or(u64::MAX)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit now in force.
pub fn raise_soft_limit() -> io::Result<u64> {
    let limit = nofile();
    if limit.current != limit.maximum {
        rustix::process::setrlimit(
            Resource::Nofile,
            Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        )?;
    }
    Ok(nofile().current.unwrap_or(u64::MAX))
}

fn nofile() -> Rlimit {
    rustix::process::getrlimit(Resource::Nofile)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEMAND: Demand = Demand {
        max_connections: 10_000,
        upstream: 1024,
        apiserver: 128,
    };

    #[test]
    fn a_limit_that_fits_changes_nothing() {
        let plan = plan(1 << 20, DEMAND).unwrap();
        assert_eq!(plan.max_connections, 10_000);
        assert_eq!(plan.warning, None);
    }

    #[test]
    fn a_tight_limit_lowers_max_connections_and_says_why() {
        let plan = plan(4096, DEMAND).unwrap();
        assert_eq!(plan.max_connections, 4096 - 1024 - 128 - 64);
        let warning = plan.warning.unwrap();
        assert!(warning.contains("--max-connections=10000"), "{warning}");
        assert!(warning.contains("LimitNOFILE"), "{warning}");
    }

    #[test]
    fn a_limit_too_low_for_anything_is_an_error_naming_the_flags() {
        let error = plan(1024, DEMAND).unwrap_err().to_string();
        assert!(
            error.contains("--upstream-max-requests-inflight"),
            "{error}"
        );
        assert!(error.contains("raise it"), "{error}");
    }

    #[test]
    fn raising_reaches_the_hard_limit() {
        let hard = hard_limit();
        assert_eq!(raise_soft_limit().unwrap(), hard);
    }
}

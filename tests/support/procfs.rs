//! What a process holds, read from `/proc/<pid>` the way an operator's `ls /proc/<pid>/fd` and
//! `grep Threads /proc/<pid>/status` would: open file descriptors, threads and resident memory.
//! The scenarios that must leave nothing behind compare these before and after.

use std::time::Duration;

/// Open file descriptors, threads and resident set size of one process at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Entries of `/proc/<pid>/fd`: sockets, files, epoll and event descriptors.
    pub fds: usize,
    /// `Threads:` of `/proc/<pid>/status`.
    pub threads: usize,
    /// `VmRSS:` of `/proc/<pid>/status`, in KiB.
    pub rss_kib: u64,
}

/// Reads the usage of process `pid`; panics when the process is gone.
pub fn usage(pid: u32) -> Usage {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/fd: {e}"))
        .count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/status: {e}"));
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status:\n{status}"))
    };
    Usage {
        fds,
        threads: usize::try_from(field("Threads:")).unwrap(),
        rss_kib: field("VmRSS:"),
    }
}

/// Polls `usage(pid)` every 50 ms until `settled` holds, for at most `limit`; returns the
/// settling usage, or panics with `what` and the last usage seen.
pub async fn settles(
    pid: u32,
    what: &str,
    limit: Duration,
    settled: impl Fn(&Usage) -> bool,
) -> Usage {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let now = usage(pid);
        if settled(&now) {
            return now;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("not within {limit:?}: {what}; last seen {now:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

//! The RBAC mode's scenarios and report (`--mode rbac|both`): the [`crate::watch`] model run
//! for each RBAC set, and the figures set beside the Webhook mode's, which come from the review
//! model ([`crate::model`]) of the same run.
//!
//! The scenarios are the Webhook ones that have an RBAC counterpart: *steady* (processes started
//! at unrelated moments; at 15 min one ClusterRoleBinding is created), *restart* (every process
//! started at once), and *outage* (the API server down for `--rbac-outage-s` from 15 min),
//! twice: resumed watches, and 410 Gone for every resourceVersion from before the outage.

use std::time::Duration;

use crate::model::{Record, Start};
use crate::watch::{RbacSet, WatchParams, WatchRecord, WatchSim};

/// What the scenarios share.
pub struct RbacOptions {
    pub nodes: u32,
    pub seed: u64,
    pub duration: Duration,
    pub event_at: Duration,
    pub outage: Duration,
    pub start_jitter: Duration,
    pub page_latency: Duration,
}

/// The steady scenario's processes start over one longest watch, so that their watches are
/// re-issued at unrelated moments from the start.
const SPREAD: Duration = Duration::from_secs(290);
/// The first watches of a restart end 240–290 s after it (plus the start jitter and the
/// lists): its first wave of re-issues falls in this window.
const FIRST_WAVE: (usize, usize) = (200, 400);

/// The four runs of one RBAC set.
pub struct RbacRuns {
    pub set: RbacSet,
    pub steady: WatchRecord,
    pub restart: WatchRecord,
    pub outage: WatchRecord,
    pub gone: WatchRecord,
}

/// Runs the four scenarios for each set.
pub fn run(options: &RbacOptions, sets: &[RbacSet]) -> Vec<RbacRuns> {
    sets.iter()
        .map(|set| {
            let binding = set
                .kinds
                .iter()
                .position(|k| k.name == "ClusterRoleBinding");
            let base = WatchParams {
                nodes: options.nodes,
                seed: options.seed,
                duration: options.duration,
                set: set.clone(),
                start: Start::Spread(SPREAD),
                start_jitter: options.start_jitter,
                page_size: 500,
                page_latency: options.page_latency,
                timeout_secs: (300, 600),
                change: None,
                outage: None,
                gone_after_outage: false,
            };
            let outage = WatchParams {
                outage: Some((options.event_at, options.outage)),
                ..base.clone()
            };
            RbacRuns {
                set: set.clone(),
                steady: WatchSim::run(&WatchParams {
                    change: binding.map(|kind| (options.event_at, kind)),
                    ..base.clone()
                }),
                restart: WatchSim::run(&WatchParams {
                    start: Start::Together,
                    ..base.clone()
                }),
                gone: WatchSim::run(&WatchParams {
                    gone_after_outage: true,
                    ..outage.clone()
                }),
                outage: WatchSim::run(&outage),
            }
        })
        .collect()
}

/// The review load of one mode: the Webhook mode (SubjectAccessReviews and TokenReviews), or
/// the RBAC mode (TokenReviews only: access is decided on the node).
pub struct Reviews {
    /// The restart's busiest second, every call.
    pub restart_peak: u32,
    pub restart_access_peak: u32,
    /// Steady state, per second from `settled_from` on.
    pub steady_mean: f64,
    pub steady_access_mean: f64,
    /// Requests failed closed in the outage scenario, and the last one's distance from the
    /// outage's end.
    pub outage_failed: u64,
    pub outage_back: u64,
}

impl Reviews {
    /// The figures of the proxy's rule in the steady, restart and outage scenarios.
    pub fn of(
        steady: &Record,
        restart: &Record,
        outage: &Record,
        settled_from: Duration,
        outage_end: Duration,
    ) -> Reviews {
        let from = secs(settled_from);
        let last_failed = outage
            .failed
            .iter()
            .enumerate()
            .rfind(|&(_, &f)| f > 0)
            .map_or(0, |(second, _)| second);
        Reviews {
            restart_peak: restart.calls.iter().copied().max().unwrap_or(0),
            restart_access_peak: restart.access_calls.iter().copied().max().unwrap_or(0),
            steady_mean: mean(&steady.calls[from.min(steady.calls.len())..]),
            steady_access_mean: mean(&steady.access_calls[from.min(steady.calls.len())..]),
            outage_failed: outage.failed.iter().map(|&f| u64::from(f)).sum(),
            outage_back: (last_failed.saturating_sub(secs(outage_end))) as u64,
        }
    }
}

fn secs(at: Duration) -> usize {
    usize::try_from(at.as_secs()).unwrap_or(usize::MAX)
}

fn mean<T: Copy + Into<u64>>(series: &[T]) -> f64 {
    let total: u64 = series.iter().map(|&v| v.into()).sum();
    total as f64 / series.len().max(1) as f64
}

fn sum<T: Copy + Into<u64>>(series: &[T]) -> u64 {
    series.iter().map(|&v| v.into()).sum()
}

fn peak<T: Copy + Into<u64>>(series: &[T]) -> u64 {
    series.iter().map(|&v| v.into()).max().unwrap_or(0)
}

/// 1234567 → "1,234,567".
fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes in decimal units, as network rates are given.
fn bytes(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1} GB", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1} MB", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1} kB", n / 1e3)
    } else {
        format!("{n} B")
    }
}

/// Seconds after `from` of `at`, with one decimal.
fn after(at: Option<Duration>, from: Duration) -> String {
    at.map_or_else(
        || "never".to_owned(),
        |at| format!("{:.1} s", at.saturating_sub(from).as_secs_f64()),
    )
}

/// The side-by-side table: one row per figure, the Webhook mode (when it ran) then each set.
pub fn table(
    options: &RbacOptions,
    runs: &[RbacRuns],
    webhook: Option<&Reviews>,
    token_only: Option<&Reviews>,
) -> String {
    let from = secs(options.event_at);
    let outage_from = secs(options.event_at);
    let outage_end = options.event_at + options.outage;
    let end = secs(outage_end);
    let mut header = String::from("| figure |");
    let mut rule = String::from("|---|");
    if webhook.is_some() {
        header.push_str(" Webhook |");
        rule.push_str("---:|");
    }
    for run in runs {
        header.push_str(&format!(
            " RBAC {} ({} kinds, {} objects) |",
            run.set.name,
            run.set.kinds.len(),
            count(run.set.kinds.iter().map(|k| u64::from(k.objects)).sum())
        ));
        rule.push_str("---:|");
    }
    let mut out = format!("{header}\n{rule}\n");
    let mut row = |name: &str, webhook: Option<String>, rbac: &dyn Fn(&RbacRuns) -> String| {
        out.push_str(&format!("| {name} |"));
        if let Some(w) = webhook {
            out.push_str(&format!(" {w} |"));
        }
        for run in runs {
            out.push_str(&format!(" {} |", rbac(run)));
        }
        out.push('\n');
    };
    let dash = || webhook.map(|_| "–".to_owned());
    let w = |f: &dyn Fn(&Reviews) -> String| webhook.map(f);
    let tokens = |f: &dyn Fn(&Reviews) -> String| token_only.map_or_else(|| "–".to_owned(), f);
    row(
        "**restart**: reviews/s, peak (SubjectAccess + Token)",
        w(&|r| count(u64::from(r.restart_peak))),
        &|_| tokens(&|r| count(u64::from(r.restart_peak))),
    );
    row(
        "restart: SubjectAccessReviews/s, peak",
        w(&|r| count(u64::from(r.restart_access_peak))),
        &|_| "0".to_owned(),
    );
    row("restart: LISTs started/s, peak", dash(), &|r| {
        count(peak(&r.restart.lists))
    });
    row("restart: list requests (pages)/s, peak", dash(), &|r| {
        count(peak(&r.restart.pages))
    });
    row("restart: objects listed/s, peak", dash(), &|r| {
        count(peak(&r.restart.objects))
    });
    row("restart: bytes listed/s, peak", dash(), &|r| {
        bytes(peak(&r.restart.bytes))
    });
    row("restart: objects listed, total", dash(), &|r| {
        count(sum(&r.restart.objects))
    });
    row("restart: bytes listed, total", dash(), &|r| {
        bytes(sum(&r.restart.bytes))
    });
    row("restart: every node synced after", dash(), &|r| {
        after(r.restart.synced_at, Duration::ZERO)
    });
    row("restart: first watches/s, peak", dash(), &|r| {
        count(peak(&r.restart.watches[..FIRST_WAVE.0]))
    });
    row(
        "restart: their re-issues at timeoutSeconds (200–400 s)/s, peak",
        dash(),
        &|r| count(peak(&r.restart.watches[FIRST_WAVE.0..FIRST_WAVE.1])),
    );
    row(
        "**steady**: reviews/s, mean (SubjectAccess + Token)",
        w(&|r| format!("{:.1}", r.steady_mean)),
        &|_| tokens(&|r| format!("{:.1}", r.steady_mean)),
    );
    row(
        "steady: SubjectAccessReviews/s, mean",
        w(&|r| format!("{:.1}", r.steady_access_mean)),
        &|_| "0".to_owned(),
    );
    row("steady: watch requests/s, mean / peak", dash(), &|r| {
        let series = &r.steady.watches[from..];
        format!("{:.1} / {}", mean(series), peak(series))
    });
    row("steady: bookmarks/s, mean / peak", dash(), &|r| {
        let series = &r.steady.bookmarks[from..];
        format!("{:.1} / {}", mean(series), peak(series))
    });
    row(
        "**one ClusterRoleBinding created**: watch events sent",
        dash(),
        &|r| count(sum(&r.steady.events)),
    );
    row("one ClusterRoleBinding created: bytes sent", dash(), &|r| {
        bytes(sum(&r.steady.event_bytes))
    });
    let length = options.outage.as_secs();
    let length = if length >= 60 && length.is_multiple_of(60) {
        format!("{} min", length / 60)
    } else {
        format!("{length} s")
    };
    row(
        &format!("**API server down {length}**: requests failed closed"),
        w(&|r| count(r.outage_failed)),
        &|_| tokens(&|r| count(r.outage_failed)),
    );
    row(
        "outage: last request failed, after the server is back",
        w(&|r| format!("{} s", r.outage_back)),
        &|_| tokens(&|r| format!("{} s", r.outage_back)),
    );
    row(
        "outage: list and watch calls refused, total / peak per s",
        dash(),
        &|r| {
            let series = &r.outage.refused[outage_from..end];
            format!("{} / {}", count(sum(series)), count(peak(series)))
        },
    );
    row("outage, resumed: re-watches/s after, peak", dash(), &|r| {
        count(peak(&r.outage.watches[end..]))
    });
    row("outage, resumed: every watch back after", dash(), &|r| {
        after(r.outage.back_at, outage_end)
    });
    row("outage, resumed: LISTs", dash(), &|r| {
        count(sum(&r.outage.lists[outage_from..]))
    });
    row("outage, 410 Gone: relists (LISTs), total", dash(), &|r| {
        count(sum(&r.gone.lists[outage_from..]))
    });
    row("outage, 410 Gone: LISTs started/s, peak", dash(), &|r| {
        count(peak(&r.gone.lists[outage_from..]))
    });
    row(
        "outage, 410 Gone: objects relisted, total / peak per s",
        dash(),
        &|r| {
            let series = &r.gone.objects[outage_from..];
            format!("{} / {}", count(sum(series)), count(peak(series)))
        },
    );
    row("outage, 410 Gone: bytes relisted, total", dash(), &|r| {
        bytes(sum(&r.gone.bytes[outage_from..]))
    });
    row("outage, 410 Gone: every watch back after", dash(), &|r| {
        after(r.gone.back_at, outage_end)
    });
    out
}

/// The restart's first seconds: objects listed per second, every set, while lists run.
pub fn restart_profile(runs: &[RbacRuns]) -> String {
    let mut out = String::new();
    for run in runs {
        let last = run
            .restart
            .objects
            .iter()
            .rposition(|&o| o > 0)
            .unwrap_or(0);
        let seconds: Vec<String> = run.restart.objects[..=last]
            .iter()
            .map(|&o| count(o))
            .collect();
        out.push_str(&format!(
            "restart, RBAC {}: objects listed per second from 0 s: {}\n",
            run.set.name,
            seconds.join(", ")
        ));
    }
    out
}

/// Every run's series, per second.
pub fn csv(runs: &[RbacRuns]) -> String {
    const COLUMNS: [&str; 10] = [
        "lists",
        "pages",
        "objects",
        "bytes",
        "watches",
        "refused",
        "bookmarks",
        "events",
        "event_bytes",
        "gone",
    ];
    let mut records: Vec<(String, &WatchRecord)> = Vec::new();
    for run in runs {
        for (scenario, record) in [
            ("steady", &run.steady),
            ("restart", &run.restart),
            ("outage", &run.outage),
            ("outage-410", &run.gone),
        ] {
            records.push((format!("{}/{}", run.set.name, scenario), record));
        }
    }
    let mut out = String::from("second");
    for (name, _) in &records {
        for column in COLUMNS {
            out.push_str(&format!(",{name}/{column}"));
        }
    }
    out.push('\n');
    let seconds = records.first().map_or(0, |(_, r)| r.lists.len());
    for second in 0..seconds {
        out.push_str(&second.to_string());
        for (_, r) in &records {
            let values = [
                u64::from(r.lists[second]),
                u64::from(r.pages[second]),
                r.objects[second],
                r.bytes[second],
                u64::from(r.watches[second]),
                u64::from(r.refused[second]),
                u64::from(r.bookmarks[second]),
                u64::from(r.events[second]),
                r.event_bytes[second],
                u64::from(r.gone[second]),
            ];
            for value in values {
                out.push_str(&format!(",{value}"));
            }
        }
        out.push('\n');
    }
    out
}

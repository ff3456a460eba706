//! Audit bytes a second under a flood, with and without the flood budget
//! (`--audit-log-flood-retention`), in a release build: a proxy in front of the stand-in kubelet,
//! and `--identities` clients (two connections each) sending GETs with a 15 KB query as fast as
//! they are answered, for `--seconds`. Prints requests a second and audit bytes a second: over
//! the whole run, and after the first quarter (once the budget's burst is spent, its steady rate).
//!
//! With `--case acts` the flooders are allowed to exec and send `GET /exec/…?command=<query>`
//! without an upgrade (each an act, whose event the budget never suppresses), after an admin's
//! exec; it says whether that exec is still in the kept files at the end, and how many acts were
//! refused with 429. After any flood, each flooder reads node logs (`GET /logs/messages`) six
//! times; it says how many of those reads have an event in the kept files.
//!
//! `cargo run --release --example audit_flood -- --case refused|allowed|acts [--budget-off]`

#[allow(dead_code)] // Shared with the end-to-end tests; the flood uses only part of it.
#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use http::StatusCode;

use support::TempDir;
use support::client::{Client, empty, request};
use support::harness::{ProxySpec, Subject, grant};
use support::streams::{EXEC_PROTOCOL, ExecSession};

#[derive(Debug, Parser)]
struct Args {
    /// `refused`: users with no permission, 403; `allowed`: users allowed `GET /healthz`;
    /// `acts`: users allowed to exec, sending execs without an upgrade.
    #[arg(long)]
    case: String,
    /// Run with `--audit-log-flood-retention=0` (and a file never rotated, to count every byte).
    #[arg(long)]
    budget_off: bool,
    #[arg(long, default_value_t = 8)]
    identities: usize,
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Bytes of query on every request.
    #[arg(long, default_value_t = 15_000)]
    query: usize,
}

/// Whether an event with audit ID `id` is in the audit files of `dir`.
fn kept(dir: &Path, id: &str) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("audit"))
            .any(|e| std::fs::read_to_string(e.path()).is_ok_and(|text| text.contains(id)))
    })
}

/// The events of `GET /logs/messages` in the audit files of `dir`, and how many users they are of.
fn log_reads(dir: &Path) -> (usize, usize) {
    let mut users = std::collections::BTreeSet::new();
    let mut events = 0;
    for entry in std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
    {
        if !entry.file_name().to_string_lossy().starts_with("audit") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for event in text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        {
            if event["requestURI"] == "/logs/messages" {
                events += 1;
                users.insert(event["user"]["username"].to_string());
            }
        }
    }
    (events, users.len())
}

/// Bytes in the audit files of `dir`.
fn audit_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("audit"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

async fn flood(
    client: Client,
    target: String,
    status: StatusCode,
    until: Instant,
    sent: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
) {
    let Ok(mut conn) = client.connect().await else {
        return;
    };
    while Instant::now() < until {
        match conn
            .send(request("GET", &target).body(empty()).unwrap())
            .await
        {
            Ok(response) if status == StatusCode::OK || response.status() == status => {
                sent.fetch_add(1, Ordering::Relaxed);
                if response.status() == StatusCode::TOO_MANY_REQUESTS {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(response) => panic!("answered {}", response.status()),
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let dir = TempDir::new("audit-flood-bench");
    let log = dir.path().join("audit.log");
    let mut flags = vec![
        "--authorization-mode=Policy".to_owned(),
        format!("--audit-log-path={}", log.display()),
    ];
    if args.budget_off {
        flags.push("--audit-log-flood-retention=0".to_owned());
        flags.push("--audit-log-maxsize=0".to_owned());
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let h = ProxySpec::new(&flags)
        .policy(&format!(
            "{}---\n{}",
            grant(
                "health",
                &["nodes/healthz", "nodes/log"],
                &["get"],
                &[Subject::Group("probes")],
            ),
            grant(
                "exec",
                &["nodes/proxy"],
                &["get", "create"],
                &[Subject::Group("actors"), Subject::User("admin")],
            )
        ))
        .start()
        .await;
    let query = "a".repeat(args.query);
    let (target, status, groups): (String, StatusCode, &[&str]) = match args.case.as_str() {
        "refused" => (format!("/pods?q={query}"), StatusCode::FORBIDDEN, &[]),
        "allowed" => (format!("/healthz?q={query}"), StatusCode::OK, &["probes"]),
        // Whatever the kubelet answers an exec without an upgrade.
        "acts" => (
            format!("/exec/ns/pod/ctr?command={query}"),
            StatusCode::OK,
            &["actors"],
        ),
        other => panic!("--case {other}: refused, allowed or acts"),
    };
    let session = ExecSession::open(&h.http1_user("admin"), EXEC_PROTOCOL).await;
    let exec_id = session.headers["audit-id"].to_str().unwrap().to_owned();
    session.close().await;
    let refused = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let until = start + Duration::from_secs(args.seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..args.identities {
        for _ in 0..2 {
            let client = h.user(&format!("flooder-{i}"), groups);
            tasks.spawn(flood(
                client,
                target.clone(),
                status,
                until,
                Arc::clone(&sent),
                Arc::clone(&refused),
            ));
        }
    }
    let quarter = Duration::from_secs(args.seconds) / 4;
    tokio::time::sleep(quarter).await;
    let bytes_at_quarter = audit_bytes(dir.path());
    tasks.join_all().await;
    let elapsed = start.elapsed().as_secs_f64();
    let mut reads = 0;
    for i in 0..args.identities {
        let client = h.user(&format!("flooder-{i}"), groups);
        for _ in 0..6 {
            if client.get("/logs/messages").await.status == StatusCode::OK {
                reads += 1;
            }
        }
    }
    // Let the writer catch up with what was queued.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let bytes = audit_bytes(dir.path());
    let total = sent.load(Ordering::Relaxed);
    let rest = elapsed - quarter.as_secs_f64();
    let logs = log_reads(dir.path());
    let suppressed = h
        .metric("kubelet_auth_proxy_audit_events_suppressed_total", &[])
        .await;
    let dropped = h
        .metric("kubelet_auth_proxy_audit_events_dropped_total", &[])
        .await;
    println!(
        "case={} budget={} identities={} seconds={elapsed:.1} requests/s={:.0} audit_bytes/s={:.0} \
         audit_bytes/s_after_first_quarter={:.0} audit_bytes={bytes} suppressed={suppressed} dropped={dropped} \
         refused_429={} admin_exec_kept={} log_reads_served={reads} log_reads_audited={} \
         readers_audited={}",
        args.case,
        if args.budget_off { "off" } else { "default" },
        args.identities,
        total as f64 / elapsed,
        bytes as f64 / elapsed,
        (bytes - bytes_at_quarter) as f64 / rest,
        refused.load(Ordering::Relaxed),
        kept(dir.path(), &exec_id),
        logs.0,
        logs.1,
    );
    h.shutdown().await;
}

//! Turns the raw records of a `bench/run` (one tab-separated line per measurement, oha's JSON
//! output, burst summaries) into the results JSON and `docs/BENCHMARKS.md`, with every figure
//! next to its target (the throughput and cost goals the project set itself).

mod deterministic;
mod format;
mod goals;
mod json;
mod markdown;
mod records;
mod streams;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context as _;
use serde_json::Value;

use json::results_json;
use markdown::markdown;
use streams::Stream;

/// The label of the nginx reference proxy.
const REFERENCE: &str = "nginx-reference";
/// The label of the direct connection to the upstream.
const DIRECT: &str = "direct";

/// Options of `bench_helper report`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The raw records written by bench/run.
    #[arg(long)]
    raw: PathBuf,
    /// Where the results JSON goes.
    #[arg(long)]
    json: PathBuf,
    /// Where the Markdown report goes.
    #[arg(long)]
    markdown: PathBuf,
    /// The run's work directory, shown as `$WORK` in the report.
    #[arg(long)]
    work_dir: PathBuf,
}

/// The load cases, in report order: id, title, what it exercises.
const CASES: &[(&str, &str, &str)] = &[
    (
        "a-x509",
        "(a) x509 client certificate, 1 KiB",
        "`GET /healthz` (a 1 KiB file), keep-alive, HTTP/1.1; the proxy authorizes with its local policy.",
    ),
    (
        "b-token",
        "(b) bearer token, warm caches, 1 KiB",
        "`GET /healthz` with `Authorization: Bearer`; the proxy checks the token with TokenReview and \
         authorizes with SubjectAccessReview, both answered from its caches after the warm-up. The \
         proxy gets the token alone; direct and the nginx reference get the client certificate (and \
         ignore the header).",
    ),
    (
        "c-1mib",
        "(c) 1 MiB response",
        "`GET /metrics/cadvisor` (a 1 MiB file), x509, keep-alive.",
    ),
    (
        "d-newconn",
        "(d) a new TLS connection per request",
        "`GET /healthz`, x509, no keep-alive: every request pays a full TLS handshake with a client \
         certificate (the proxy keeps its upstream connections).",
    ),
    (
        "e-h2",
        "(e) HTTP/2 client",
        "`GET /healthz`, x509, HTTP/2 (one stream at a time per connection); the proxy forwards over \
         HTTP/1.1, nginx too.",
    ),
    (
        "f-x509-1conn",
        "(f) one connection, x509, 1 KiB",
        "As (a) with a single connection: the latency the proxy adds on the cache-hit path.",
    ),
    (
        "g-token-1conn",
        "(g) one connection, warm token, 1 KiB",
        "As (b) with a single connection: the latency added with warm token and authorization caches.",
    ),
];

/// One load measurement: one round, or the rounds of a case and target folded together.
#[derive(Debug, Clone)]
struct Load {
    case: String,
    target: String,
    status: String,
    /// Responses received, whatever their status.
    requests: u64,
    /// Responses other than 200, and requests that got no response.
    errors: u64,
    /// Requests sent: responses and requests without one.
    attempts: u64,
    /// 200 responses per second of the measured run.
    rps: Option<f64>,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    cpu_us_per_request: Option<f64>,
    peak_rss_kib: Option<u64>,
    /// Connections the upstream accepted during the measured run.
    upstream_connections: Option<u64>,
    /// The figures of each round, for the results JSON.
    rounds: Vec<Value>,
}

/// Memory with some idle connections held.
#[derive(Debug, Clone)]
struct ConnStep {
    target: String,
    idle: u64,
    status: String,
    established: Option<u64>,
    rss_kib: Option<u64>,
    hwm_kib: Option<u64>,
}

/// One cold burst.
#[derive(Debug, Clone)]
struct Burst {
    target: String,
    kind: String,
    status: String,
    token_reviews: Option<u64>,
    access_reviews: Option<u64>,
    summary: Value,
}

/// The counts of the deterministic section for one setup, connection count and target.
#[derive(Debug, Clone)]
struct Det {
    setup: String,
    connections: u64,
    target: String,
    status: String,
    /// Instructions (callgrind's Ir) of the measured run, from zeroing to dump.
    instructions: Option<u64>,
    /// Responses and failed requests of the measured run under callgrind.
    cg: Answers,
    /// The same for the shorter run before it (a fifth of the requests, as many connections).
    instructions_short: Option<u64>,
    cg_short: Answers,
    /// Reviews the stand-in API server received during the run under callgrind.
    token_reviews: Option<u64>,
    access_reviews: Option<u64>,
    /// Context switches over the second run (no valgrind, no tracer), summed over threads.
    voluntary: Option<u64>,
    nonvoluntary: Option<u64>,
    ctx: Answers,
    /// Syscalls over the third run (perf stat or strace attached).
    syscalls: Option<u64>,
    sys: Answers,
}

/// What one oha run got back.
#[derive(Debug, Clone, Copy, Default)]
struct Answers {
    responses: u64,
    /// Responses other than 200, and requests that got no response.
    failed: u64,
}

impl Answers {
    fn of(oha: &Value) -> Answers {
        let sum = |v: &Value| -> u64 {
            v.as_object()
                .map(|m| m.values().filter_map(Value::as_u64).sum())
                .unwrap_or(0)
        };
        let codes = &oha["statusCodeDistribution"];
        let responses = sum(codes);
        let ok = codes["200"].as_u64().unwrap_or(0);
        Answers {
            responses,
            failed: sum(&oha["errorDistribution"]) + responses.saturating_sub(ok),
        }
    }

    /// `count` per response.
    fn per(&self, count: Option<u64>) -> Option<f64> {
        count
            .filter(|_| self.responses > 0)
            .map(|c| c as f64 / self.responses as f64)
    }
}

impl Det {
    fn instructions_per_request(&self) -> Option<f64> {
        self.cg.per(self.instructions)
    }
    /// What one more request on an open connection costs: the difference between the two runs
    /// under callgrind, which opened as many connections, over the difference in responses.
    fn marginal_instructions_per_request(&self) -> Option<f64> {
        let more = self.cg.responses.checked_sub(self.cg_short.responses)?;
        let ir = self.instructions?.checked_sub(self.instructions_short?)?;
        (more > 0).then(|| ir as f64 / more as f64)
    }
    /// The rest of the measured run per connection: the TLS handshake, accepting and closing.
    fn instructions_per_connection(&self) -> Option<f64> {
        let marginal = self.marginal_instructions_per_request()?;
        let rest = self.instructions? as f64 - marginal * self.cg.responses as f64;
        (self.connections > 0).then(|| rest / self.connections as f64)
    }
    fn voluntary_per_request(&self) -> Option<f64> {
        self.ctx.per(self.voluntary)
    }
    fn nonvoluntary_per_request(&self) -> Option<f64> {
        self.ctx.per(self.nonvoluntary)
    }
    fn syscalls_per_request(&self) -> Option<f64> {
        self.sys.per(self.syscalls)
    }
}

/// Everything a run recorded.
#[derive(Debug, Default)]
struct Run {
    meta: BTreeMap<String, String>,
    proxies: Vec<(String, String)>,
    loads: Vec<Load>,
    streams: Vec<Stream>,
    conns: Vec<ConnStep>,
    bursts: Vec<Burst>,
    dets: Vec<Det>,
}

/// Reads the raw records and writes both outputs.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.raw)
        .with_context(|| format!("reading {}", args.raw.display()))?;
    let run = Run::parse(&text);
    let json = results_json(&run, &args.work_dir);
    std::fs::write(
        &args.json,
        format!("{}\n", serde_json::to_string_pretty(&json)?),
    )
    .with_context(|| format!("writing {}", args.json.display()))?;
    std::fs::write(&args.markdown, markdown(&run, &args.work_dir))
        .with_context(|| format!("writing {}", args.markdown.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::format::{fmt_count, hide_paths};
    use super::records::median;
    use super::*;

    #[test]
    fn the_report_names_temporary_directories_instead_of_spelling_them() {
        let work = Path::new("/tmp/kap-bench.X1");
        let args = "--tls-cert-file=/tmp/kap-bench.X1/pki/proxy.crt \
                    --kubeconfig=/tmp/kap-e2e-2931-0-apiserver/kubeconfig-cert.yaml --v=0";
        assert_eq!(
            hide_paths(args, work),
            "--tls-cert-file=$WORK/pki/proxy.crt --kubeconfig=$APISERVER/kubeconfig-cert.yaml --v=0"
        );
    }

    #[test]
    fn deterministic_counts_are_per_response() {
        let dir = std::env::temp_dir().join(format!("kap-report-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let oha = dir.join("oha.json");
        std::fs::write(&oha, r#"{"statusCodeDistribution":{"200":1000}}"#).unwrap();
        let short = dir.join("short.json");
        std::fs::write(&short, r#"{"statusCodeDistribution":{"200":200}}"#).unwrap();
        let o = oha.display();
        let s = short.display();
        let run = Run::parse(&format!(
            "proxy\tp\tcmd\n\
             det\tx509\t8\tp\tok\t{o}\t150000000\t0\t0\t{o}\t900\t100\t{o}\t4200\t{s}\t50000000\n\
             det\tx509\t8\tnginx-reference\tok\t{o}\t50000000\t0\t0\t{o}\t-\t-\t{o}\t-\n"
        ));
        std::fs::remove_dir_all(&dir).unwrap();
        let ours = run.det("x509", 8, "p").unwrap();
        assert_eq!(ours.instructions_per_request(), Some(150000.0));
        assert_eq!(ours.voluntary_per_request(), Some(0.9));
        assert_eq!(ours.syscalls_per_request(), Some(4.2));
        // (150M − 50M) / 800 = 125,000 per request; (150M − 125M) / 8 per connection.
        assert_eq!(ours.marginal_instructions_per_request(), Some(125000.0));
        assert_eq!(ours.instructions_per_connection(), Some(3125000.0));
        let nginx = run.det("x509", 8, REFERENCE).unwrap();
        assert_eq!(nginx.syscalls_per_request(), None);
        let md = markdown(&run, Path::new("/nowhere"));
        assert!(
            md.contains("| x509 | 8 | 150,000 | 50,000 | 3.00× |"),
            "{md}"
        );
        assert_eq!(fmt_count(Some(1234567.4)), "1,234,567");
        assert_eq!(fmt_count(Some(999.0)), "999");
    }

    #[test]
    fn the_results_json_spells_no_temporary_directory_either() {
        let run = Run::parse(
            "meta\targs_x509\t--tls-cert-file=/tmp/kap-bench.X1/pki/proxy.crt\n\
             meta\targs_token\t--kubeconfig=/tmp/kap-e2e-2931-0-apiserver/kubeconfig-cert.yaml\n",
        );
        let json = results_json(&run, Path::new("/tmp/kap-bench.X1")).to_string();
        assert!(!json.contains("/tmp/"), "{json}");
        assert!(json.contains("$WORK/pki/proxy.crt"), "{json}");
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(Vec::new()), None);
    }

    #[test]
    fn rounds_fold_into_medians() {
        let run = Run::parse(
            "load\tx\tp\tok\t-\t-\t100\t1\t1\n\
             load\tx\tp\toha failed\t-\t-\t-\t-\t2\n\
             load\tx\tp\tok\t-\t-\t300\t5\t3\n\
             load\tx\tp\tok\t-\t-\t200\t3\t4\n",
        );
        assert_eq!(run.loads.len(), 1);
        let load = &run.loads[0];
        assert_eq!(load.status, "ok (1 of 4 rounds failed)");
        assert_eq!(load.upstream_connections, Some(3));
        assert_eq!(load.peak_rss_kib, Some(300));
        assert_eq!(load.rounds.len(), 4);
    }

    #[test]
    fn per_connection_memory_uses_open_connections() {
        let run = Run::parse(
            "conn\tp\t0\tok\t0\t8000\t8000\n\
             conn\tp\t1000\tready opened=1000 failed=0\t1000\t28000\t28000\n",
        );
        assert_eq!(run.per_connection_kib("p"), Some(20.0));
    }
}

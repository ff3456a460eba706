//! Turns the raw records of a `bench/run` (one tab-separated line per measurement, oha's JSON
//! output, burst summaries) into the results JSON and `docs/BENCHMARKS.md`, with every figure
//! next to its target (the throughput and cost goals the project set itself).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde_json::{Value, json};

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

/// One stream.
#[derive(Debug, Clone)]
struct Stream {
    target: String,
    status: String,
    bytes: Option<u64>,
    seconds: Option<f64>,
    cpu_seconds: Option<f64>,
    peak_rss_kib: Option<u64>,
}

impl Stream {
    fn mb_per_s(&self) -> Option<f64> {
        match (self.bytes, self.seconds) {
            (Some(b), Some(s)) if s > 0.0 => Some(b as f64 / s / 1e6),
            _ => None,
        }
    }
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

fn num<T: std::str::FromStr>(field: Option<&&str>) -> Option<T> {
    field.and_then(|f| f.parse().ok())
}

fn read_json(path: &str) -> Value {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(Value::Null)
}

impl Run {
    /// Reads the records `bench/run` appends, one per line, fields separated by tabs, `-` where
    /// a figure could not be taken:
    ///
    /// - `meta <key> <value>`; `proxy <label> <command template>`;
    /// - `load <case> <target> <status> <oha json file> <cpu ticks> <VmHWM KiB> <upstream conns>`;
    /// - `stream <target> <round> <status> <bytes> <seconds> <cpu ticks> <VmHWM KiB>`;
    /// - `conn <target> <idle connections> <status> <established> <VmRSS KiB> <VmHWM KiB>`;
    /// - `burst <target> <x509|one|distinct> <status> <TokenReviews> <SARs> <summary json file>`;
    /// - `det <x509|token> <connections> <target> <status> <oha json under callgrind> <Ir>
    ///   <TokenReviews> <SARs> <oha json> <voluntary switches> <nonvoluntary switches>
    ///   <oha json> <syscalls> <oha json of the short run under callgrind> <its Ir>`.
    ///
    /// A status other than `ok` says what went wrong; unknown lines are skipped.
    fn parse(text: &str) -> Run {
        let mut run = Run::default();
        let mut rounds: Vec<Vec<Load>> = Vec::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            match f.first().copied() {
                Some("meta") if f.len() >= 3 => {
                    run.meta.insert(f[1].to_owned(), f[2..].join("\t"));
                }
                Some("proxy") if f.len() >= 3 => {
                    run.proxies.push((f[1].to_owned(), f[2..].join("\t")));
                }
                Some("load") if f.len() >= 7 => {
                    let load = Load::from_record(&f, &run.meta);
                    match rounds.iter_mut().find(|r: &&mut Vec<Load>| {
                        r[0].case == load.case && r[0].target == load.target
                    }) {
                        Some(same) => same.push(load),
                        None => rounds.push(vec![load]),
                    }
                }
                Some("stream") if f.len() >= 8 => run.streams.push(Stream {
                    target: f[1].to_owned(),
                    status: f[3].to_owned(),
                    bytes: num(f.get(4)),
                    seconds: num(f.get(5)),
                    cpu_seconds: num::<f64>(f.get(6)).map(|t| t / clk_tck(&run.meta)),
                    peak_rss_kib: num(f.get(7)),
                }),
                Some("conn") if f.len() >= 7 => run.conns.push(ConnStep {
                    target: f[1].to_owned(),
                    idle: num(f.get(2)).unwrap_or(0),
                    status: f[3].to_owned(),
                    established: num(f.get(4)),
                    rss_kib: num(f.get(5)),
                    hwm_kib: num(f.get(6)),
                }),
                Some("burst") if f.len() >= 7 => run.bursts.push(Burst {
                    target: f[1].to_owned(),
                    kind: f[2].to_owned(),
                    status: f[3].to_owned(),
                    token_reviews: num(f.get(4)),
                    access_reviews: num(f.get(5)),
                    summary: read_json(f[6]),
                }),
                Some("det") if f.len() >= 14 => run.dets.push(Det {
                    setup: f[1].to_owned(),
                    connections: num(f.get(2)).unwrap_or(0),
                    target: f[3].to_owned(),
                    status: f[4].to_owned(),
                    cg: Answers::of(&read_json(f[5])),
                    instructions: num(f.get(6)),
                    token_reviews: num(f.get(7)),
                    access_reviews: num(f.get(8)),
                    ctx: Answers::of(&read_json(f[9])),
                    voluntary: num(f.get(10)),
                    nonvoluntary: num(f.get(11)),
                    sys: Answers::of(&read_json(f[12])),
                    syscalls: num(f.get(13)),
                    cg_short: f
                        .get(14)
                        .map(|p| Answers::of(&read_json(p)))
                        .unwrap_or_default(),
                    instructions_short: num(f.get(15)),
                }),
                _ => {}
            }
        }
        run.loads = rounds.into_iter().filter_map(Load::fold).collect();
        run
    }

    fn load(&self, case: &str, target: &str) -> Option<&Load> {
        self.loads
            .iter()
            .find(|l| l.case == case && l.target == target)
    }

    /// Every target in the order first measured, the direct connection first, the reference last.
    fn targets(&self) -> Vec<String> {
        let mut targets = vec![DIRECT.to_owned()];
        targets.extend(self.proxies.iter().map(|(label, _)| label.clone()));
        targets.push(REFERENCE.to_owned());
        targets
    }

    /// The proxies under test: every target but the direct connection and the reference.
    fn proxies(&self) -> Vec<&str> {
        self.proxies.iter().map(|(l, _)| l.as_str()).collect()
    }

    fn median_stream(&self, target: &str) -> Option<f64> {
        median(
            self.streams
                .iter()
                .filter(|s| s.target == target && s.status == "ok")
                .filter_map(Stream::mb_per_s)
                .collect(),
        )
    }

    fn conn_steps(&self, target: &str) -> Vec<&ConnStep> {
        self.conns.iter().filter(|c| c.target == target).collect()
    }

    /// KiB of RSS per idle connection at the largest step, against the idle proxy.
    fn per_connection_kib(&self, target: &str) -> Option<f64> {
        let steps = self.conn_steps(target);
        let idle = steps.iter().find(|c| c.idle == 0)?;
        let most = steps
            .iter()
            .filter(|c| c.idle > 0 && c.rss_kib.is_some() && c.established.is_some())
            .max_by_key(|c| c.idle)?;
        let connections = most.established? as f64 - idle.established.unwrap_or(0) as f64;
        let grown = most.rss_kib? as f64 - idle.rss_kib? as f64;
        (connections > 0.0).then_some(grown / connections)
    }

    fn det(&self, setup: &str, connections: u64, target: &str) -> Option<&Det> {
        self.dets
            .iter()
            .find(|d| d.setup == setup && d.connections == connections && d.target == target)
    }

    fn burst(&self, target: &str, kind: &str) -> Option<&Burst> {
        self.bursts
            .iter()
            .find(|b| b.target == target && b.kind == kind)
    }
}

fn clk_tck(meta: &BTreeMap<String, String>) -> f64 {
    meta.get("clk_tck")
        .and_then(|t| t.parse().ok())
        .unwrap_or(100.0)
}

impl Load {
    fn from_record(f: &[&str], meta: &BTreeMap<String, String>) -> Load {
        let oha = if f[3] == "ok" {
            read_json(f[4])
        } else {
            Value::Null
        };
        let sum = |v: &Value| -> u64 {
            v.as_object()
                .map(|m| m.values().filter_map(Value::as_u64).sum())
                .unwrap_or(0)
        };
        let codes = &oha["statusCodeDistribution"];
        let ok = codes["200"].as_u64().unwrap_or(0);
        let requests = sum(codes);
        let transport = sum(&oha["errorDistribution"]);
        let errors = transport + requests.saturating_sub(ok);
        let cpu_ticks: Option<f64> = num(f.get(5));
        let mut load = Load {
            case: f[1].to_owned(),
            target: f[2].to_owned(),
            status: f[3].to_owned(),
            requests,
            errors,
            attempts: requests + transport,
            rps: oha["summary"]["total"]
                .as_f64()
                .filter(|secs| *secs > 0.0)
                .map(|secs| ok as f64 / secs),
            p50_ms: oha["latencyPercentiles"]["p50"].as_f64().map(|s| s * 1e3),
            p99_ms: oha["latencyPercentiles"]["p99"].as_f64().map(|s| s * 1e3),
            cpu_us_per_request: cpu_ticks
                .filter(|_| requests > 0)
                .map(|t| t / clk_tck(meta) * 1e6 / requests as f64),
            peak_rss_kib: num(f.get(6)),
            upstream_connections: num(f.get(7)),
            rounds: Vec::new(),
        };
        load.rounds.push(json!({
            "round": num::<u64>(f.get(8)),
            "status": load.status,
            "requests": load.requests,
            "failed": load.errors,
            "requestsPerSec": load.rps,
            "p50Ms": load.p50_ms,
            "p99Ms": load.p99_ms,
            "cpuMicrosPerRequest": load.cpu_us_per_request,
            "peakRssKib": load.peak_rss_kib,
            "upstreamConnectionsOpened": load.upstream_connections,
            "latencyPercentilesSeconds": oha["latencyPercentiles"],
            "statusCodes": oha["statusCodeDistribution"],
            "errors": oha["errorDistribution"],
        }));
        load
    }

    /// Folds the rounds of one case and target: the median of each figure over the rounds that
    /// ran, the highest peak RSS, the counts summed. Failed rounds are named in the status.
    fn fold(rounds: Vec<Load>) -> Option<Load> {
        let ran: Vec<&Load> = rounds.iter().filter(|l| l.status == "ok").collect();
        let Some(first) = ran.first() else {
            return rounds.into_iter().next();
        };
        let med = |figure: fn(&Load) -> Option<f64>| {
            median(ran.iter().filter_map(|l| figure(l)).collect())
        };
        let failed = rounds.len() - ran.len();
        Some(Load {
            case: first.case.clone(),
            target: first.target.clone(),
            status: if failed == 0 {
                "ok".to_owned()
            } else {
                format!("ok ({failed} of {} rounds failed)", rounds.len())
            },
            requests: ran.iter().map(|l| l.requests).sum(),
            errors: ran.iter().map(|l| l.errors).sum(),
            attempts: ran.iter().map(|l| l.attempts).sum(),
            rps: med(|l| l.rps),
            p50_ms: med(|l| l.p50_ms),
            p99_ms: med(|l| l.p99_ms),
            cpu_us_per_request: med(|l| l.cpu_us_per_request),
            peak_rss_kib: ran.iter().filter_map(|l| l.peak_rss_kib).max(),
            upstream_connections: med(|l| l.upstream_connections.map(|n| n as f64))
                .map(|n| n.round() as u64),
            rounds: rounds.iter().flat_map(|l| l.rounds.clone()).collect(),
        })
    }
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

// --- formatting ------------------------------------------------------------------------------

fn or_dash(value: Option<String>) -> String {
    value.unwrap_or_else(|| "–".to_owned())
}

fn fmt_rps(v: Option<f64>) -> String {
    or_dash(v.map(|v| format!("{v:.0}")))
}

fn fmt_ms(v: Option<f64>) -> String {
    or_dash(v.map(|ms| {
        if ms < 1.0 {
            format!("{:.0} µs", ms * 1e3)
        } else if ms < 100.0 {
            format!("{ms:.2} ms")
        } else {
            format!("{ms:.0} ms")
        }
    }))
}

fn fmt_pct(v: Option<f64>) -> String {
    or_dash(v.map(|r| format!("{:.0}%", r * 100.0)))
}

fn fmt_us(v: Option<f64>) -> String {
    or_dash(v.map(|us| format!("{us:.1} µs")))
}

fn fmt_kib(v: Option<u64>) -> String {
    or_dash(v.map(|k| {
        if k >= 10 * 1024 {
            format!("{:.1} MiB", k as f64 / 1024.0)
        } else {
            format!("{k} KiB")
        }
    }))
}

/// One figure of `proxy` against the nginx reference in every load case a–e: the figures, and
/// whether `met` holds for the ratio in every case.
fn against_reference(
    run: &Run,
    proxy: &str,
    figure: fn(&Load) -> Option<f64>,
    fmt: fn(Option<f64>) -> String,
    met: fn(f64) -> bool,
) -> (String, Option<bool>) {
    let mut figures = Vec::new();
    let mut all = Some(true);
    for (case, _, _) in &CASES[..5] {
        let value = |t: &str| run.load(case, t).and_then(figure);
        let r = ratio(value(proxy), value(REFERENCE));
        figures.push(format!(
            "{}: {} vs {} ({})",
            &case[..1],
            fmt(value(proxy)),
            fmt(value(REFERENCE)),
            fmt_times(r)
        ));
        all = all_of(all, r.map(met));
    }
    (figures.join("; "), all)
}

/// A ratio as `0.87×`.
fn fmt_times(r: Option<f64>) -> String {
    or_dash(r.map(|r| format!("{r:.2}×")))
}

/// Whether a target met so far stays met with one more figure; unknown once a figure is.
fn all_of(so_far: Option<bool>, this: Option<bool>) -> Option<bool> {
    so_far.zip(this).map(|(a, b)| a && b)
}

fn yes_no(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "not measured",
    }
}

/// A target for one proxy: what it asks, the figure, and whether it is met.
struct Goal {
    proxy: String,
    target: &'static str,
    figure: String,
    met: Option<bool>,
}

fn goals(run: &Run) -> Vec<Goal> {
    let mut goals = Vec::new();
    for proxy in run.proxies() {
        let mut push = |target: &'static str, figure: String, met: Option<bool>| {
            goals.push(Goal {
                proxy: proxy.to_owned(),
                target,
                figure,
                met,
            });
        };
        for (case, what) in [("a-x509", "x509"), ("b-token", "warm-token")] {
            let rps = |t: &str| run.load(case, t).and_then(|l| l.rps);
            let of_direct = ratio(rps(proxy), rps(DIRECT));
            push(
                if what == "x509" {
                    "x509 requests/s ≥ 50% of direct"
                } else {
                    "warm-token requests/s ≥ 50% of direct"
                },
                format!("{} of direct", fmt_pct(of_direct)),
                of_direct.map(|r| r >= 0.5),
            );
        }
        // Against the nginx reference, every load case a–e: the proxy must be clearly cheaper
        // and faster, by a margin the noise of a shared machine does not close.
        let (cpu_figures, cpu_met) =
            against_reference(run, proxy, |l| l.cpu_us_per_request, fmt_us, |r| r <= 0.8);
        let (rps_figures, rps_met) =
            against_reference(run, proxy, |l| l.rps, fmt_rps, |r| r >= 1.1);
        let mut rss_figures = Vec::new();
        let mut rss_met = Some(true);
        for (case, _, _) in &CASES[..5] {
            let rss = |t: &str| run.load(case, t).and_then(|l| l.peak_rss_kib);
            rss_figures.push(format!(
                "{}: {} vs {}",
                &case[..1],
                fmt_kib(rss(proxy)),
                fmt_kib(rss(REFERENCE))
            ));
            rss_met = all_of(
                rss_met,
                rss(proxy)
                    .zip(rss(REFERENCE))
                    .map(|(ours, theirs)| ours <= theirs),
            );
        }
        push(
            "CPU per request ≤ 0.8 × the nginx reference's (cases a–e)",
            cpu_figures,
            cpu_met,
        );
        push(
            "requests/s ≥ 1.1 × the nginx reference's (cases a–e)",
            rps_figures,
            rps_met,
        );
        push(
            "peak RSS under load ≤ the nginx reference's (cases a–e)",
            rss_figures.join("; "),
            rss_met,
        );
        let mut ir_figures = Vec::new();
        let mut ir_met = Some(true);
        for setup in ["x509", "token"] {
            for connections in [1, 8, 64] {
                let ir = |t: &str| {
                    run.det(setup, connections, t)
                        .and_then(Det::instructions_per_request)
                };
                let (ours, theirs) = (ir(proxy), ir(REFERENCE));
                if ours.is_none() && theirs.is_none() {
                    continue;
                }
                ir_figures.push(format!(
                    "{setup}/{connections}: {} vs {}",
                    fmt_count(ours),
                    fmt_count(theirs)
                ));
                ir_met = all_of(ir_met, ours.zip(theirs).map(|(o, t)| o <= t));
            }
        }
        if ir_figures.is_empty() {
            ir_met = None;
        }
        push(
            "instructions per request (callgrind, handshakes included) ≤ the nginx reference's at 1, 8 and 64 connections",
            or_dash((!ir_figures.is_empty()).then(|| ir_figures.join("; "))),
            ir_met,
        );
        for (case, what) in [("f-x509-1conn", "x509"), ("g-token-1conn", "warm token")] {
            let p50 = |t: &str| run.load(case, t).and_then(|l| l.p50_ms);
            let added_by = |t: &str| match (p50(t), p50(DIRECT)) {
                (Some(p), Some(d)) => Some((p - d) * 1e3),
                _ => None,
            };
            let added = added_by(proxy);
            push(
                if what == "x509" {
                    "added p50 at one connection < 100 µs (x509)"
                } else {
                    "added p50 at one connection < 100 µs (warm token)"
                },
                format!(
                    "{} ({} vs {} direct; nginx reference {})",
                    or_dash(added.map(|us| format!("{us:+.0} µs"))),
                    fmt_ms(p50(proxy)),
                    fmt_ms(p50(DIRECT)),
                    or_dash(added_by(REFERENCE).map(|us| format!("{us:+.0} µs"))),
                ),
                added.map(|us| us < 100.0),
            );
        }
        let stream = ratio(run.median_stream(proxy), run.median_stream(DIRECT));
        push(
            "streaming ≥ 80% of direct",
            format!(
                "{} ({} vs {} MB/s; nginx reference {})",
                fmt_pct(stream),
                or_dash(run.median_stream(proxy).map(|v| format!("{v:.0}"))),
                or_dash(run.median_stream(DIRECT).map(|v| format!("{v:.0}"))),
                fmt_pct(ratio(
                    run.median_stream(REFERENCE),
                    run.median_stream(DIRECT)
                )),
            ),
            stream.map(|r| r >= 0.8),
        );
        let against_reference = ratio(run.median_stream(proxy), run.median_stream(REFERENCE));
        push(
            "streaming ≥ the nginx reference",
            format!(
                "{} of the nginx reference's MB/s",
                fmt_times(against_reference)
            ),
            against_reference.map(|r| r >= 1.0),
        );
        let idle_peak = |t: &str| {
            run.conn_steps(t)
                .into_iter()
                .find(|c| c.idle == 0)
                .and_then(|c| c.hwm_kib)
        };
        let idle = idle_peak(proxy);
        push(
            "peak RSS < 16 MiB idle",
            format!(
                "{} (nginx reference {})",
                fmt_kib(idle),
                fmt_kib(idle_peak(REFERENCE))
            ),
            idle.map(|k| k < 16 * 1024),
        );
        let per_connection =
            |t: &str| or_dash(run.per_connection_kib(t).map(|k| format!("{k:.1} KiB")));
        let per = run.per_connection_kib(proxy);
        push(
            "< 32 KiB per idle TLS connection",
            format!(
                "{} (nginx reference {})",
                per_connection(proxy),
                per_connection(REFERENCE)
            ),
            per.map(|k| k < 32.0),
        );
        push(
            "≤ 21 KiB per idle TLS connection",
            format!(
                "{} (nginx reference {})",
                per_connection(proxy),
                per_connection(REFERENCE)
            ),
            per.map(|k| k <= 21.0),
        );
        let burst_count: u64 = run
            .meta
            .get("burst")
            .and_then(|b| b.parse().ok())
            .unwrap_or(0);
        let mut figure = Vec::new();
        let mut exact = Some(true);
        for (kind, keys) in [("one", 1), ("distinct", burst_count)] {
            let b = run.burst(proxy, kind);
            let (tr, sar) = (
                b.and_then(|b| b.token_reviews),
                b.and_then(|b| b.access_reviews),
            );
            figure.push(format!(
                "{} token{}: {} TokenReview, {} SAR for {keys} key{}",
                if kind == "one" { "one" } else { "distinct" },
                if kind == "one" { "" } else { "s" },
                or_dash(tr.map(|v| v.to_string())),
                or_dash(sar.map(|v| v.to_string())),
                if keys == 1 { "" } else { "s" },
            ));
            exact = match (exact, tr, sar) {
                (Some(so_far), Some(tr), Some(sar)) => Some(so_far && tr == keys && sar == keys),
                _ => None,
            };
        }
        push(
            "cold bursts: exactly one TokenReview and one SAR per distinct key",
            figure.join("; "),
            exact,
        );
    }
    goals
}

fn markdown(run: &Run, work_dir: &Path) -> String {
    let meta = |k: &str| run.meta.get(k).cloned().unwrap_or_else(|| "?".to_owned());
    let hide = |s: &str| hide_paths(s, work_dir);
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(w, "# Benchmarks\n");
    let _ = writeln!(
        w,
        "Generated by `bench/run` (do not edit by hand: run it again). Every figure is also in \
         [`bench/results/latest.json`](../bench/results/latest.json). Where the time and memory go, \
         and what limits the targets not met: [PERFORMANCE.md](PERFORMANCE.md).\n"
    );
    let _ = writeln!(
        w,
        "**These figures are from one run on a shared 2-core machine**: other builds ran at the \
         same time, so absolute figures move from run to run. What holds are the ratios measured \
         side by side: for each case the direct connection, the proxy and the nginx reference ran \
         one right after the other, under the same conditions. The load generator, the upstream and \
         the proxy share the two cores, so a proxy's requests/s is bounded by everything else \
         running, not only by its own cost.\n"
    );
    let _ = writeln!(w, "## The run\n");
    let _ = writeln!(w, "| | |\n|---|---|");
    let memory = meta("memory_kib")
        .parse::<f64>()
        .map(|k| format!("{:.1} GiB", k / 1024.0 / 1024.0))
        .unwrap_or_else(|_| "?".to_owned());
    let rows = [
        ("Command", format!("`{}`", meta("command"))),
        ("Date (UTC)", meta("date")),
        ("Commit", meta("commit")),
        (
            "Machine",
            format!(
                "{} CPUs (`nproc`), {}, {} RAM, {}",
                meta("nproc"),
                meta("cpu"),
                memory,
                meta("kernel")
            ),
        ),
        (
            "Load average (1, 5, 15 min)",
            format!(
                "{} at the start, {} at the end",
                meta("load_start"),
                meta("load_end")
            ),
        ),
        (
            "Load",
            format!(
                "{}; {} connections, {} s warm-up then {} s measured per case",
                meta("oha"),
                meta("connections"),
                meta("warmup_s"),
                meta("duration_s")
            ),
        ),
        ("Upstream and reference", meta("nginx")),
        ("Toolchain", meta("rustc")),
        (
            "Measuring time",
            format!("{} s (builds and installs excluded)", meta("wall_s")),
        ),
    ];
    for (k, v) in rows {
        let _ = writeln!(w, "| {k} | {v} |");
    }
    let _ = writeln!(
        w,
        "\nProxies measured (`bench/run --proxy LABEL=TEMPLATE` adds more):\n"
    );
    for (label, template) in &run.proxies {
        let _ = writeln!(w, "- **{label}**: `{}`", hide(template));
    }
    let _ = writeln!(
        w,
        "\n  `{{args}}`, kubelet-auth-proxy's flags, by setup:\n\n\
         \x20 - x509: `{}`\n\
         \x20 - token: `{}`\n\
         \x20 - idle connections: `{}`\n",
        hide(&meta("args_x509")),
        hide(&meta("args_token")),
        hide(&meta("args_idle"))
    );
    let _ = writeln!(
        w,
        "- **{REFERENCE}**: nginx as a TLS reverse proxy with client-certificate verification, \
         upstream TLS with a client certificate, upstream keep-alive (configuration below). It does \
         no kubelet authorization: it is the floor of what a proxy costs."
    );

    let goals = goals(run);
    // A run of the deterministic section alone measures none of the targets.
    if goals.iter().any(|g| g.met.is_some()) {
        let _ = writeln!(w, "\n## Targets\n");
        let _ = writeln!(w, "| Proxy | Target | Figure | Met |\n|---|---|---|---|");
        for goal in goals {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} |",
                goal.proxy,
                goal.target,
                goal.figure,
                yes_no(goal.met)
            );
        }
        let _ = writeln!(
            w,
            "\nNot measured by this harness: \"zero avoidable per-request allocations, no lock held \
             across an await\" (a profile and code review answer those, not a load test).\n"
        );
    } else {
        let _ = writeln!(w);
    }

    if !run.loads.is_empty() {
        let _ = writeln!(
            w,
            "## 1. Requests: direct, through the proxy, through nginx\n"
        );
        let _ = writeln!(
            w,
            "oha, {} connections unless said otherwise, keep-alive; {}. *vs direct*: requests/s as a \
         share of the direct connection's in the same case. *CPU/request*: the process's \
         utime + stime from `/proc/<pid>/stat` over the measured run, divided by the responses \
         (clock ticks of 10 ms, so ±1 tick). *Peak RSS*: `VmHWM` at the end of the case, the \
         process started fresh for each case (nginx: master and workers summed). *Upstream conns*: \
         connections the upstream accepted during the measured run (its `stub_status`): for \
         direct, the load generator's own; for a proxy, the connections it opened to the \
         upstream. The upstream is nginx serving fixed-size files over TLS with client \
         certificates required.\n",
            meta("connections"),
            match meta("rounds").as_str() {
                "1" => "one round".to_owned(),
                n => format!(
                    "{n} rounds, all cases each round: every figure is the median over the rounds, \
                 peak RSS the highest"
                ),
            }
        );
    }
    for (case, title, what) in CASES {
        if !run.loads.iter().any(|l| l.case == *case) {
            continue;
        }
        let _ = writeln!(w, "### {title}\n\n{what}\n");
        let _ = writeln!(
            w,
            "| Target | req/s | p50 | p99 | vs direct | CPU/request | Peak RSS | Upstream conns | Failed |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        let direct_rps = run.load(case, DIRECT).and_then(|l| l.rps);
        for target in run.targets() {
            let Some(load) = run.load(case, &target) else {
                continue;
            };
            let Some(partly) = load.status.strip_prefix("ok") else {
                let _ = writeln!(w, "| {target} | {} | | | | | | | |", load.status);
                continue;
            };
            let _ = writeln!(
                w,
                "| {target}{partly} | {} | {} | {} | {} | {} | {} | {} | {} of {} |",
                fmt_rps(load.rps),
                fmt_ms(load.p50_ms),
                fmt_ms(load.p99_ms),
                fmt_pct(ratio(load.rps, direct_rps)),
                fmt_us(load.cpu_us_per_request),
                fmt_kib(load.peak_rss_kib),
                or_dash(load.upstream_connections.map(|n| n.to_string())),
                load.errors,
                load.attempts,
            );
        }
        let _ = writeln!(w);
    }

    if !run.streams.is_empty() {
        let _ = writeln!(w, "## 2. Streaming\n");
        let _ = writeln!(
            w,
            "One `GET /containerLogs/default/web-0/web?follow=true` of {} MiB with curl (HTTP/1.1, \
             x509), repeated, each round starting with the next target; the median is shown. The upstream is \
             nginx serving a file of that size: the stand-in kubelet's followed log is paced at \
             one line per 50 ms and cannot carry a gigabyte, and a file keeps the upstream's own \
             cost the same for every target. *CPU*: the process's CPU seconds per stream.\n",
            meta("stream_mib")
        );
        let _ = writeln!(
            w,
            "| Target | MB/s (median) | vs direct | runs (MB/s) | CPU per stream | Peak RSS |\n\
             |---|---:|---:|---|---:|---:|"
        );
        let direct = run.median_stream(DIRECT);
        for target in run.targets() {
            let streams: Vec<&Stream> = run.streams.iter().filter(|s| s.target == target).collect();
            if streams.is_empty() {
                continue;
            }
            let runs: Vec<String> = streams
                .iter()
                .map(|s| match s.mb_per_s() {
                    Some(v) if s.status == "ok" => format!("{v:.0}"),
                    _ => s.status.clone(),
                })
                .collect();
            let cpu = median(streams.iter().filter_map(|s| s.cpu_seconds).collect());
            let peak = streams.iter().filter_map(|s| s.peak_rss_kib).max();
            let med = run.median_stream(&target);
            let _ = writeln!(
                w,
                "| {target} | {} | {} | {} | {} | {} |",
                or_dash(med.map(|v| format!("{v:.0}"))),
                fmt_pct(ratio(med, direct)),
                runs.join(", "),
                or_dash(cpu.map(|s| format!("{s:.2} s"))),
                fmt_kib(peak)
            );
        }
        let _ = writeln!(w);
    }

    if !run.conns.is_empty() {
        let _ = writeln!(w, "## 3. Idle connections\n");
        let _ = writeln!(
            w,
            "The proxy is started fresh and sent one request; *idle* is its RSS then. Then a helper \
             (`bench_helper idle`) opens TLS connections with the client certificate, sends one \
             request on each and holds them open, idle, in steps. *Open* counts the established \
             connections on the proxy's port (from `/proc/net/tcp`) when RSS (`VmRSS`) is read. \
             *Per connection*: (RSS at the last step − idle RSS) / connections. In this section the \
             proxy runs with `--header-read-timeout=10m --idle-connection-timeout=10m \
             --max-connections=20000`: by default a kept-alive connection idle for 10 s (hyper's \
             HTTP/1 header timer) or 90 s (HTTP/2) is closed, sooner than the steps take to open.\n"
        );
        let steps: Vec<u64> = {
            let mut s: Vec<u64> = run.conns.iter().map(|c| c.idle).collect();
            s.sort_unstable();
            s.dedup();
            s
        };
        let mut header = "| Target |".to_owned();
        let mut rule = "|---|".to_owned();
        for step in &steps {
            if *step == 0 {
                header.push_str(" idle |");
            } else {
                let _ = write!(header, " {step} idle: open, RSS |");
            }
            rule.push_str("---:|");
        }
        header.push_str(" Per connection | Peak RSS |");
        rule.push_str("---:|---:|");
        let _ = writeln!(w, "{header}\n{rule}");
        for target in run.targets() {
            let own = run.conn_steps(&target);
            if own.is_empty() {
                continue;
            }
            let mut row = format!("| {target} |");
            for step in &steps {
                match own.iter().find(|c| c.idle == *step) {
                    Some(c) if *step == 0 => {
                        let _ = write!(row, " {} |", fmt_kib(c.rss_kib));
                    }
                    Some(c) if c.rss_kib.is_some() => {
                        let note = if c.status.contains("failed=0") {
                            String::new()
                        } else {
                            format!(" ({})", c.status)
                        };
                        let _ = write!(
                            row,
                            " {}, {}{note} |",
                            or_dash(c.established.map(|e| e.to_string())),
                            fmt_kib(c.rss_kib)
                        );
                    }
                    Some(c) => {
                        let _ = write!(row, " {} |", c.status);
                    }
                    None => row.push_str(" |"),
                }
            }
            let peak = own.iter().filter_map(|c| c.hwm_kib).max();
            let _ = writeln!(
                w,
                "{row} {} | {} |",
                or_dash(
                    run.per_connection_kib(&target)
                        .map(|k| format!("{k:.1} KiB"))
                ),
                fmt_kib(peak)
            );
        }
        let _ = writeln!(w);
    }

    if !run.bursts.is_empty() {
        let _ = writeln!(w, "## 4. Cold bursts\n");
        let _ = writeln!(
            w,
            "The stand-in API server of the end-to-end tests (`tests/support/apiserver/`), run by \
             `bench_helper apiserver`, answers every TokenReview and SubjectAccessReview after {} ms. \
             A fresh proxy in the token setup (`--authentication-token-webhook \
             --authorization-mode=Webhook`) gets one request first (so it has its API server \
             connection), then {} requests are released at the same instant, each on its own \
             connection opened beforehand: all with one token nobody used yet, then each with a \
             token of its own (each a different user). *Reviews* are the calls the stand-in \
             received during the burst. Latency is from release to the whole response. The \
             baseline is the same burst against the proxy in the x509 setup (client certificates, \
             local policy): what {} simultaneous requests cost on this machine without any API \
             server call.\n",
            meta("apiserver_delay_ms"),
            meta("burst"),
            meta("burst")
        );
        let _ = writeln!(
            w,
            "| Proxy | Burst | Answers | TokenReviews | SubjectAccessReviews | Expected | p50 | p99 | max |\n\
             |---|---|---|---:|---:|---:|---:|---:|---:|"
        );
        let burst_count = meta("burst");
        for b in &run.bursts {
            let (burst, expected) = match b.kind.as_str() {
                "one" => ("one new token", "1 each".to_owned()),
                "distinct" => ("distinct new tokens", format!("{burst_count} each")),
                _ => ("baseline: x509, no API call", "–".to_owned()),
            };
            let answers = if b.status == "ok" {
                let mut parts: Vec<String> = b.summary["statuses"]
                    .as_object()
                    .map(|m| m.iter().map(|(code, n)| format!("{n}× {code}")).collect())
                    .unwrap_or_default();
                let errors = b.summary["errors"].as_u64().unwrap_or(0);
                if errors > 0 {
                    parts.push(format!("{errors} failed"));
                }
                parts.join(", ")
            } else {
                b.status.clone()
            };
            let ms = |k: &str| b.summary[k].as_f64();
            let _ = writeln!(
                w,
                "| {} | {burst} | {answers} | {} | {} | {expected} | {} | {} | {} |",
                b.target,
                or_dash(b.token_reviews.map(|v| v.to_string())),
                or_dash(b.access_reviews.map(|v| v.to_string())),
                fmt_ms(ms("p50Ms")),
                fmt_ms(ms("p99Ms")),
                fmt_ms(ms("maxMs")),
            );
        }
        let _ = writeln!(w);
    }

    if !run.dets.is_empty() {
        deterministic_markdown(w, run, &meta);
    }

    let _ = writeln!(w, "## How it is measured\n");
    let _ = writeln!(
        w,
        "`bench/run` installs nginx (apt-get) and oha (`cargo install oha --locked`) when they are \
         missing, builds `kubelet-auth-proxy` and `examples/bench_helper` with `cargo build \
         --release`, makes throwaway certificates with the demo's PKI code (`src/tools/demo/pki.rs`: one \
         CA, ECDSA P-256 keys), and starts everything on 127.0.0.1 in a temporary directory \
         (`$WORK` below). Each proxy is started fresh for each case and stopped after it.\n\n\
         - **Upstream**: nginx, TLS with client certificates required, HTTP/1.1 and HTTP/2, \
         keep-alive; `/healthz` is a 1 KiB file, `/metrics/cadvisor` 1 MiB, \
         `/containerLogs/…` the stream file.\n\
         - **x509 setup** of the proxy: client certificates from the bench CA, \
         `--authorization-mode=Policy` with a ClusterRole granting the load client's group \
         `get` on the kubelet subresources.\n\
         - **token setup**: `--authentication-token-webhook --authorization-mode=Webhook` against \
         the stand-in API server (reviews answered after {} ms; default cache TTLs: 2 min for \
         tokens, 5 min for allowed decisions).\n\
         - **Another proxy or build** runs in place of ours with `--proxy LABEL=TEMPLATE`; \
         placeholders for ports and certificate paths are listed by `bench/run --help`; `{{args}}` \
         expands to our own flags for the setup, so `--proxy 'old=/path/to/old/kubelet-auth-proxy \
         {{args}}'` compares two builds in one run.\n",
        meta("apiserver_delay_ms")
    );
    let reference_conf = std::fs::read_to_string(work_dir.join("raw/nginx-reference.conf"))
        .map(|c| hide(&c))
        .unwrap_or_default();
    if !reference_conf.is_empty() {
        let _ = writeln!(
            w,
            "The nginx reference proxy's configuration, as run:\n\n```nginx\n{}```\n",
            reference_conf.trim_start()
        );
    }
    md
}

/// Figures with a thousands separator: 152,340.
fn fmt_count(v: Option<f64>) -> String {
    or_dash(v.map(|v| {
        let digits = format!("{:.0}", v.round());
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    }))
}

fn fmt_per_request(v: Option<f64>) -> String {
    or_dash(v.map(|v| format!("{v:.2}")))
}

/// Section 5: instructions, context switches and syscalls per request.
fn deterministic_markdown(w: &mut String, run: &Run, meta: &dyn Fn(&str) -> String) {
    let _ = writeln!(
        w,
        "## 5. Counted per request: instructions, context switches, syscalls\n"
    );
    let _ = writeln!(
        w,
        "Counts that do not depend on how busy the machine is, for the requests of cases (a) \
         (x509) and (b) (warm token): `GET /healthz`, 1 KiB, keep-alive, HTTP/1.1, with oha \
         `-n {n} -c C`, after an unmeasured `-n {warm} -c C` on a freshly started target \
         (section run: {secs} s). Each figure is a total over the {n} measured requests divided \
         by the responses.\n\n\
         - **Instructions** (Ir): the target runs under `valgrind --tool=callgrind` ({valgrind}); \
         after the warm-up `callgrind_control -z` zeroes its counters, the measured requests \
         run, `callgrind_control -d` dumps, and the dump's `totals:` is divided by the \
         responses. All threads are counted (callgrind runs them one at a time). The C TLS \
         handshakes of the measured run are included (oha opens its connections anew), so \
         per-request figures at 64 connections carry 64 handshakes spread over {n} requests.\n\
         - **Context switches**: the target started again without valgrind, warmed up the same \
         way; `voluntary_ctxt_switches` and `nonvoluntary_ctxt_switches` summed over \
         `/proc/<pid>/task/*/status` before and after {n} requests. Threads that end in between \
         take their counts with them (none should: the proxy's runtime threads live as long as \
         it does).\n\
         - **Syscalls**: on that same process, a further {n} requests with {tool} attached to \
         every thread (`{how}`); counted from attaching to detaching, so the idle second around \
         the run is included.\n\
         - **The nginx reference** runs as one process here (`master_process off; \
         worker_processes 1;`, otherwise the configuration below): the process that serves is \
         the one callgrind runs and the one counted, without a fork to follow \
         (`--trace-children`) or a master's counts to add. The proxy runs as it always does \
         (one process: a serving thread per core, each with its own event loop and kubelet \
         connections, and the main runtime that accepts and hands connections to them).\n",
        n = meta("det_requests"),
        warm = meta("det_warmup"),
        secs = meta("det_wall_s"),
        valgrind = meta("valgrind"),
        tool = meta("syscall_tool_version"),
        how = match meta("syscall_tool").as_str() {
            "perf" => "perf stat -e raw_syscalls:sys_enter -p PID",
            _ => "strace -c -f -p PID",
        },
    );
    let setups = [("x509", "x509"), ("token", "warm token")];
    let mut connections: Vec<u64> = run.dets.iter().map(|d| d.connections).collect();
    connections.sort_unstable();
    connections.dedup();
    let proxies = run.proxies();

    let _ = writeln!(w, "### Instructions per request\n");
    let mut header = "| Case | Connections |".to_owned();
    let mut rule = "|---|---:|".to_owned();
    for p in &proxies {
        let _ = write!(header, " {p} |");
        rule.push_str("---:|");
    }
    let _ = write!(header, " {REFERENCE} |");
    rule.push_str("---:|");
    for p in &proxies {
        let _ = write!(header, " {p} ÷ nginx |");
        rule.push_str("---:|");
    }
    let _ = writeln!(w, "{header}\n{rule}");
    for (setup, title) in setups {
        for c in &connections {
            let Some(reference) = run.det(setup, *c, REFERENCE) else {
                continue;
            };
            let nginx = reference.instructions_per_request();
            let mut row = format!("| {title} | {c} |");
            let mut ratios = String::new();
            for p in &proxies {
                let ours = run.det(setup, *c, p);
                let ir = ours.and_then(Det::instructions_per_request);
                let _ = write!(row, " {} |", fmt_count(ir));
                let _ = write!(
                    ratios,
                    " {} |",
                    or_dash(ratio(ir, nginx).map(|r| format!("{r:.2}×")))
                );
            }
            let _ = writeln!(w, "{row} {} |{ratios}", fmt_count(nginx));
        }
    }

    let _ = writeln!(
        w,
        "\n### Instructions per request on an open connection, and per connection\n\n\
         The figures above, split: *per request* is (Ir of the {n}-request run − Ir of a \
         {short}-request run just before it, same process, same connection count, counters \
         zeroed in between) ÷ the difference in responses, so the handshakes, equal in both, \
         cancel out. *Per connection* is what is left of the {n}-request run's Ir per connection \
         opened: the TLS handshake with client certificate, accepting and closing.\n",
        n = meta("det_requests"),
        short = meta("det_requests")
            .parse::<u64>()
            .map(|n| (n / 5).to_string())
            .unwrap_or_default(),
    );
    let mut header = "| Case | Connections |".to_owned();
    let mut rule = "|---|---:|".to_owned();
    for t in proxies.iter().copied().chain([REFERENCE]) {
        let _ = write!(header, " {t}: per request |");
        rule.push_str("---:|");
    }
    for p in &proxies {
        let _ = write!(header, " {p} ÷ nginx |");
        rule.push_str("---:|");
    }
    for t in proxies.iter().copied().chain([REFERENCE]) {
        let _ = write!(header, " {t}: per connection |");
        rule.push_str("---:|");
    }
    let _ = writeln!(w, "{header}\n{rule}");
    for (setup, title) in setups {
        for c in &connections {
            let Some(reference) = run.det(setup, *c, REFERENCE) else {
                continue;
            };
            let nginx = reference.marginal_instructions_per_request();
            let mut row = format!("| {title} | {c} |");
            for p in &proxies {
                let ir = run
                    .det(setup, *c, p)
                    .and_then(Det::marginal_instructions_per_request);
                let _ = write!(row, " {} |", fmt_count(ir));
            }
            let _ = write!(row, " {} |", fmt_count(nginx));
            for p in &proxies {
                let ir = run
                    .det(setup, *c, p)
                    .and_then(Det::marginal_instructions_per_request);
                let _ = write!(
                    row,
                    " {} |",
                    or_dash(ratio(ir, nginx).map(|r| format!("{r:.2}×")))
                );
            }
            for t in proxies.iter().copied().chain([REFERENCE]) {
                let per = run
                    .det(setup, *c, t)
                    .and_then(Det::instructions_per_connection);
                let _ = write!(row, " {} |", fmt_count(per));
            }
            let _ = writeln!(w, "{row}");
        }
    }

    let _ = writeln!(
        w,
        "\n### Context switches and syscalls per request\n\n\
         *Switches*: voluntary + nonvoluntary, per request.\n"
    );
    let targets: Vec<&str> = proxies.iter().copied().chain([REFERENCE]).collect();
    let mut header = "| Case | Connections |".to_owned();
    let mut rule = "|---|---:|".to_owned();
    for t in &targets {
        let _ = write!(header, " {t}: switches | {t}: syscalls |");
        rule.push_str("---:|---:|");
    }
    let _ = writeln!(w, "{header}\n{rule}");
    for (setup, title) in setups {
        for c in &connections {
            if !targets.iter().any(|t| run.det(setup, *c, t).is_some()) {
                continue;
            }
            let mut row = format!("| {title} | {c} |");
            for t in &targets {
                match run.det(setup, *c, t) {
                    Some(d) => {
                        let _ = write!(
                            row,
                            " {} + {} | {} |",
                            fmt_per_request(d.voluntary_per_request()),
                            fmt_per_request(d.nonvoluntary_per_request()),
                            fmt_per_request(d.syscalls_per_request())
                        );
                    }
                    None => row.push_str(" | |"),
                }
            }
            let _ = writeln!(w, "{row}");
        }
    }

    let mut notes = Vec::new();
    for d in &run.dets {
        let label = format!("{}, {}, {} connection(s)", d.target, d.setup, d.connections);
        if d.status != "ok" {
            notes.push(format!("{label}: {}", d.status));
        }
        for (what, a) in [
            ("callgrind", d.cg),
            ("short callgrind", d.cg_short),
            ("switches", d.ctx),
            ("syscalls", d.sys),
        ] {
            if a.failed > 0 || a.responses == 0 {
                notes.push(format!(
                    "{label}, {what} run: {} responses, {} failed",
                    a.responses, a.failed
                ));
            }
        }
        if d.setup == "token" && d.target != REFERENCE {
            match (d.token_reviews, d.access_reviews) {
                (Some(0), Some(0)) => {}
                (t, s) => notes.push(format!(
                    "{label}: the stand-in API server got {} TokenReviews and {} SARs during \
                     the run under callgrind (expected none: warm caches)",
                    or_dash(t.map(|v| v.to_string())),
                    or_dash(s.map(|v| v.to_string()))
                )),
            }
        }
    }
    if notes.is_empty() {
        let _ = writeln!(
            w,
            "\nEvery measured request got a 200, and in the token case the stand-in API server \
             received no review during the measured requests: the token and the decision came \
             from the caches.\n"
        );
    } else {
        let _ = writeln!(w, "\nNotes:\n");
        for n in notes {
            let _ = writeln!(w, "- {n}");
        }
        let _ = writeln!(w);
    }
}

/// `s` with the run's temporary directories named, not spelled: the work directory as `$WORK`,
/// the stand-in API server's (where its kubeconfig lies) as `$APISERVER`, so the report holds no
/// path of the machine it ran on.
fn hide_paths(s: &str, work_dir: &Path) -> String {
    const APISERVER_DIR: &str = "/kap-e2e-";
    let mut out = s.replace(&work_dir.display().to_string(), "$WORK");
    while let Some(start) = out.find(APISERVER_DIR) {
        let dir_start = out[..start].rfind(['=', ' ']).map_or(0, |i| i + 1);
        let dir_end = out[start + 1..]
            .find('/')
            .map_or(out.len(), |i| start + 1 + i);
        out.replace_range(dir_start..dir_end, "$APISERVER");
    }
    out
}

fn results_json(run: &Run, work_dir: &Path) -> Value {
    let hide = |s: &str| hide_paths(s, work_dir);
    let loads: Vec<Value> = run
        .loads
        .iter()
        .map(|l| {
            let direct = run.load(&l.case, DIRECT).and_then(|d| d.rps);
            json!({
                "case": l.case,
                "target": l.target,
                "status": l.status,
                "requests": l.requests,
                "failed": l.errors,
                "requestsPerSec": l.rps,
                "p50Ms": l.p50_ms,
                "p99Ms": l.p99_ms,
                "ratioToDirect": ratio(l.rps, direct),
                "cpuMicrosPerRequest": l.cpu_us_per_request,
                "peakRssKib": l.peak_rss_kib,
                "upstreamConnectionsOpened": l.upstream_connections,
                "rounds": l.rounds,
            })
        })
        .collect();
    let direct_stream = run.median_stream(DIRECT);
    let streams: Vec<Value> = run
        .targets()
        .iter()
        .filter(|t| run.streams.iter().any(|s| &s.target == *t))
        .map(|t| {
            let runs: Vec<Value> = run
                .streams
                .iter()
                .filter(|s| &s.target == t)
                .map(|s| {
                    json!({
                        "status": s.status,
                        "bytes": s.bytes,
                        "seconds": s.seconds,
                        "mbPerSec": s.mb_per_s(),
                        "cpuSeconds": s.cpu_seconds,
                        "peakRssKib": s.peak_rss_kib,
                    })
                })
                .collect();
            json!({
                "target": t,
                "medianMbPerSec": run.median_stream(t),
                "ratioToDirect": ratio(run.median_stream(t), direct_stream),
                "runs": runs,
            })
        })
        .collect();
    let conns: Vec<Value> = run
        .targets()
        .iter()
        .filter(|t| !run.conn_steps(t).is_empty())
        .map(|t| {
            let steps: Vec<Value> = run
                .conn_steps(t)
                .iter()
                .map(|c| {
                    json!({
                        "idleConnections": c.idle,
                        "status": c.status,
                        "established": c.established,
                        "rssKib": c.rss_kib,
                        "peakRssKib": c.hwm_kib,
                    })
                })
                .collect();
            json!({
                "target": t,
                "perConnectionKib": run.per_connection_kib(t),
                "steps": steps,
            })
        })
        .collect();
    let bursts: Vec<Value> = run
        .bursts
        .iter()
        .map(|b| {
            json!({
                "target": b.target,
                "tokens": b.kind,
                "status": b.status,
                "tokenReviews": b.token_reviews,
                "subjectAccessReviews": b.access_reviews,
                "summary": b.summary,
            })
        })
        .collect();
    let dets: Vec<Value> = run
        .dets
        .iter()
        .map(|d| {
            let nginx = run
                .det(&d.setup, d.connections, REFERENCE)
                .and_then(Det::instructions_per_request);
            json!({
                "case": d.setup,
                "connections": d.connections,
                "target": d.target,
                "status": d.status,
                "instructionsPerRequest": d.instructions_per_request(),
                "ratioToReference": ratio(d.instructions_per_request(), nginx),
                "instructionsPerRequestOnOpenConnection": d.marginal_instructions_per_request(),
                "instructionsPerConnection": d.instructions_per_connection(),
                "voluntarySwitchesPerRequest": d.voluntary_per_request(),
                "nonvoluntarySwitchesPerRequest": d.nonvoluntary_per_request(),
                "syscallsPerRequest": d.syscalls_per_request(),
                "callgrind": {
                    "instructions": d.instructions,
                    "responses": d.cg.responses,
                    "failed": d.cg.failed,
                    "shortRunInstructions": d.instructions_short,
                    "shortRunResponses": d.cg_short.responses,
                    "shortRunFailed": d.cg_short.failed,
                    "tokenReviews": d.token_reviews,
                    "subjectAccessReviews": d.access_reviews,
                },
                "switches": {
                    "voluntary": d.voluntary,
                    "nonvoluntary": d.nonvoluntary,
                    "responses": d.ctx.responses,
                    "failed": d.ctx.failed,
                },
                "syscalls": {
                    "calls": d.syscalls,
                    "responses": d.sys.responses,
                    "failed": d.sys.failed,
                },
            })
        })
        .collect();
    let goals: Vec<Value> = goals(run)
        .into_iter()
        .map(|g| json!({"proxy": g.proxy, "target": g.target, "figure": g.figure, "met": g.met}))
        .collect();
    let proxies: BTreeMap<&str, String> = run
        .proxies
        .iter()
        .map(|(l, t)| (l.as_str(), hide(t)))
        .collect();
    let meta: BTreeMap<&str, String> = run
        .meta
        .iter()
        .map(|(k, v)| (k.as_str(), hide(v)))
        .collect();
    json!({
        "meta": meta,
        "proxies": proxies,
        "targets": goals,
        "requests": loads,
        "streaming": streams,
        "connections": conns,
        "bursts": bursts,
        "deterministic": dets,
    })
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

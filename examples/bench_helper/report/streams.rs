//! Section 2, streams from a kubelet-like upstream: the records of `bench_helper stream`
//! transfers folded into medians per case and target, their Markdown tables, their JSON, and the
//! stream targets. Kept apart from the request figures because a stream's costs are per byte
//! (CPU per GB, bytes per receive) and a followed log's are per line (latency).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};

use super::format::{all_of, fmt_kib, fmt_pct, fmt_times, or_dash};
use super::records::{clk_tck, median, num, ratio};
use super::{DIRECT, REFERENCE, Run};

/// The stream cases in report order: id, what the stand-in kubelet sends.
pub(super) const STREAM_CASES: &[(&str, &str)] = &[
    ("log", "log read, a chunk per line"),
    ("follow", "followed log, a line every interval"),
    ("exec-ws", "exec stdout, WebSocket"),
    ("exec-spdy", "exec stdout, SPDY/3.1"),
    ("pf-ws-down", "port-forward to the client, WebSocket"),
    ("pf-ws-up", "port-forward from the client, WebSocket"),
    ("pf-spdy-down", "port-forward to the client, SPDY/3.1"),
    ("pf-spdy-up", "port-forward from the client, SPDY/3.1"),
];

/// Cases whose data flows from the client: its receives say nothing of the target's writes.
fn upwards(case: &str) -> bool {
    case.ends_with("-up")
}

/// One transfer (`stream` record).
#[derive(Debug, Clone)]
pub(super) struct Stream {
    case: String,
    target: String,
    round: Option<u64>,
    status: String,
    bytes: Option<u64>,
    seconds: Option<f64>,
    cpu_seconds: Option<f64>,
    peak_rss_kib: Option<u64>,
    /// The client's socket reads that returned data, and their bytes (TLS records included).
    receives: Option<u64>,
    received_bytes: Option<u64>,
    /// Followed log: line latencies, µs.
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    max_us: Option<f64>,
}

impl Stream {
    /// `stream <case> <target> <round> <status> <bytes> <seconds> <cpu ticks> <VmHWM KiB>
    /// <receives> <received bytes> <p50 µs> <p99 µs> <max µs>`.
    pub(super) fn from_record(f: &[&str], meta: &BTreeMap<String, String>) -> Stream {
        Stream {
            case: f[1].to_owned(),
            target: f[2].to_owned(),
            round: num(f.get(3)),
            status: f[4].to_owned(),
            bytes: num(f.get(5)),
            seconds: num(f.get(6)),
            cpu_seconds: num::<f64>(f.get(7)).map(|t| t / clk_tck(meta)),
            peak_rss_kib: num(f.get(8)),
            receives: num(f.get(9)),
            received_bytes: num(f.get(10)),
            p50_us: num(f.get(11)),
            p99_us: num(f.get(12)),
            max_us: num(f.get(13)),
        }
    }

    fn ok(&self) -> bool {
        self.status == "ok"
    }

    fn mb_per_s(&self) -> Option<f64> {
        match (self.bytes, self.seconds) {
            (Some(b), Some(s)) if s > 0.0 && self.case != "follow" => Some(b as f64 / s / 1e6),
            _ => None,
        }
    }

    /// CPU seconds of the target per 10⁹ payload bytes.
    fn cpu_per_gb(&self) -> Option<f64> {
        match (self.cpu_seconds, self.bytes) {
            (Some(cpu), Some(b)) if b > 0 && self.case != "follow" => Some(cpu / (b as f64 / 1e9)),
            _ => None,
        }
    }

    fn kb_per_receive(&self) -> Option<f64> {
        match (self.received_bytes, self.receives) {
            (Some(b), Some(r)) if r > 0 && !upwards(&self.case) => Some(b as f64 / r as f64 / 1e3),
            _ => None,
        }
    }
}

/// The transfers of one case and target, folded: medians over the rounds that succeeded.
#[derive(Debug, Default)]
pub(super) struct Summary {
    pub(super) mb_per_s: Option<f64>,
    pub(super) cpu_per_gb: Option<f64>,
    pub(super) kb_per_receive: Option<f64>,
    pub(super) peak_rss_kib: Option<u64>,
    pub(super) p50_us: Option<f64>,
    pub(super) p99_us: Option<f64>,
    pub(super) max_us: Option<f64>,
    /// Each round's MB/s (or p50 for a followed log), or what went wrong.
    runs: Vec<String>,
}

impl Run {
    fn transfers(&self, case: &str, target: &str) -> impl Iterator<Item = &Stream> {
        self.streams
            .iter()
            .filter(move |s| s.case == case && s.target == target)
    }

    /// The case's figures for the target, `None` when it has no record at all.
    pub(super) fn stream(&self, case: &str, target: &str) -> Option<Summary> {
        let all: Vec<&Stream> = self.transfers(case, target).collect();
        if all.is_empty() {
            return None;
        }
        let ok: Vec<&Stream> = all.iter().copied().filter(|s| s.ok()).collect();
        let med = |f: fn(&Stream) -> Option<f64>| median(ok.iter().filter_map(|s| f(s)).collect());
        Some(Summary {
            mb_per_s: med(Stream::mb_per_s),
            cpu_per_gb: med(Stream::cpu_per_gb),
            kb_per_receive: med(Stream::kb_per_receive),
            peak_rss_kib: ok.iter().filter_map(|s| s.peak_rss_kib).max(),
            p50_us: med(|s| s.p50_us),
            p99_us: med(|s| s.p99_us),
            max_us: ok.iter().filter_map(|s| s.max_us).reduce(f64::max),
            runs: all
                .iter()
                .map(|s| match (s.ok(), s.mb_per_s(), s.p50_us) {
                    (true, Some(v), _) => format!("{v:.0}"),
                    (true, None, Some(p50)) => format!("{p50:.0} µs"),
                    _ => s.status.clone(),
                })
                .collect(),
        })
    }

    /// The stream cases that have records, in report order.
    fn stream_cases(&self) -> Vec<&'static (&'static str, &'static str)> {
        STREAM_CASES
            .iter()
            .filter(|(case, _)| self.streams.iter().any(|s| s.case == *case))
            .collect()
    }
}

fn fmt_mbps(v: Option<f64>) -> String {
    or_dash(v.map(|v| format!("{v:.0}")))
}

fn fmt_cpu_gb(v: Option<f64>) -> String {
    or_dash(v.map(|v| format!("{v:.2} s")))
}

fn fmt_us(v: Option<f64>) -> String {
    or_dash(v.map(|v| format!("{v:.0} µs")))
}

/// A latency added to direct's, signed.
fn fmt_added(v: Option<f64>) -> String {
    or_dash(v.map(|v| format!("{v:+.0} µs")))
}

/// How much the target's p50 (or other) is above direct's.
fn added(run: &Run, target: &str, figure: fn(&Summary) -> Option<f64>) -> Option<f64> {
    let of = |t: &str| run.stream("follow", t).as_ref().and_then(figure);
    Some(of(target)? - of(DIRECT)?)
}

/// Writes section 2 when the run has stream records.
pub(super) fn streams_markdown(w: &mut String, run: &Run, meta: &dyn Fn(&str) -> String) {
    if run.streams.is_empty() {
        return;
    }
    let _ = writeln!(w, "## 2. Streams from a kubelet-like upstream\n");
    let _ = writeln!(
        w,
        "The upstream is `bench_helper kubelet`, a stand-in that writes as a real kubelet does \
         (HTTPS, client certificates required, HTTP/1.1). A kubelet's log handler wraps the \
         response in a flush-writer, so **every log line is one write and one flush**: one HTTP \
         chunk, one TLS record, one send. The stand-in does the same: its lines (an RFC 3339 \
         timestamp with nanoseconds, a level, a message; 80 to 250 bytes, about 130 on average) \
         are each a chunk the stand-in writes and flushes on the connection itself, one TLS \
         record and one `writev` per line, as fast as the real kubelet (section 7 reads both with \
         curl). **Exec stdout and port-forward data go in frames of at most 32 KiB** \
         (Go's `io.Copy` buffer), each one write and one flush: WebSocket binary frames with \
         Kubernetes' channel byte (stdout on channel 1 then the exec status on channel 3 and a \
         close frame; port-forward data on channel 0, after the port announced on channels 0 and \
         1), or SPDY/3 DATA frames on one stream (the stand-in skips the SYN_STREAM setup: after \
         the 101 a proxy copies opaque bytes, so only the frame sizes and write pattern matter). \
         The `-up` cases send the data from the client in the same frames (WebSocket ones masked) \
         and the stand-in answers with a small last frame once it has all of it.\n"
    );
    let _ = writeln!(
        w,
        "The client, `bench_helper stream`, speaks HTTP/1.1 by hand over rustls with the bench \
         client certificate, on one thread, reads the socket 64 KiB at a time (as curl), checks \
         that it got exactly the bytes asked for (it sleeps between records, so a sender writing \
         a record per line wakes it for each: direct, it reads the log slower than curl does), and times each transfer from sending the request to the \
         last byte. Sizes: the log {} MiB, each exec and port-forward {} MiB; the followed log {} \
         lines, one every {} ms. {} round(s), each case through every target in turn, each round \
         starting with the next target, after one unmeasured 16 MiB log through each; medians \
         shown. The proxies are started once for the section (x509 setup, their upstream the \
         stand-in); the nginx reference is configured as operators do for `kubectl logs -f`, \
         exec and port-forward: `proxy_buffering off`, `Upgrade`/`Connection` passed on, \
         `proxy_read_timeout 600s` (configuration below).\n\n\
         *CPU per GB*: the target's CPU seconds (its process tree) per 10⁹ payload bytes. *KB per \
         receive*: bytes the client's socket reads returned, per read: small when every line or \
         frame arrives in its own TLS record and send, large when the target coalesces (not shown \
         for the `-up` cases, where the client receives next to nothing). *Peak RSS*: the target's \
         highest over the section. Direct's CPU is not counted (it would be the stand-in's own).\n",
        meta("stream_mib"),
        meta("exec_mib"),
        meta("follow_lines"),
        meta("follow_interval_ms"),
        meta("stream_reps"),
    );
    let _ = writeln!(
        w,
        "| Case | Target | MB/s (median) | vs direct | CPU per GB | KB per receive | Peak RSS | runs (MB/s) |\n\
         |---|---|---:|---:|---:|---:|---:|---|"
    );
    for &(case, what) in run.stream_cases() {
        if case == "follow" {
            continue;
        }
        let direct = run.stream(case, DIRECT).and_then(|s| s.mb_per_s);
        for target in run.targets() {
            let Some(s) = run.stream(case, &target) else {
                continue;
            };
            let _ = writeln!(
                w,
                "| {case} ({what}) | {target} | {} | {} | {} | {} | {} | {} |",
                fmt_mbps(s.mb_per_s),
                fmt_pct(ratio(s.mb_per_s, direct)),
                fmt_cpu_gb(s.cpu_per_gb),
                or_dash(s.kb_per_receive.map(|k| format!("{k:.1}"))),
                fmt_kib(s.peak_rss_kib),
                s.runs.join(", ")
            );
        }
    }
    let _ = writeln!(w);
    if run.stream_cases().iter().any(|(case, _)| *case == "follow") {
        let _ = writeln!(
            w,
            "Followed log: each line carries the wall-clock time the stand-in sent it; its latency \
             is the client's receive time less that (same machine, same clock). *Added*: above \
             direct's median.\n\n\
             | Target | p50 | p99 | max | added p50 | added p99 | KB per receive | runs (p50) |\n\
             |---|---:|---:|---:|---:|---:|---:|---|"
        );
        for target in run.targets() {
            let Some(s) = run.stream("follow", &target) else {
                continue;
            };
            let _ = writeln!(
                w,
                "| {target} | {} | {} | {} | {} | {} | {} | {} |",
                fmt_us(s.p50_us),
                fmt_us(s.p99_us),
                fmt_us(s.max_us),
                fmt_added(added(run, &target, |s| s.p50_us)),
                fmt_added(added(run, &target, |s| s.p99_us)),
                or_dash(s.kb_per_receive.map(|k| format!("{k:.2}"))),
                s.runs.join(", ")
            );
        }
        let _ = writeln!(w);
    }
}

/// The stream targets of one proxy: (target, figure, met).
pub(super) fn stream_goals(run: &Run, proxy: &str) -> Vec<(&'static str, String, Option<bool>)> {
    if run.streams.is_empty() {
        return Vec::new();
    }
    let bulk: Vec<&str> = run
        .stream_cases()
        .iter()
        .map(|(case, _)| *case)
        .filter(|case| *case != "follow")
        .collect();
    let (mut speed, mut speed_met) = (Vec::new(), Some(true));
    let (mut cpu, mut cpu_met) = (Vec::new(), Some(true));
    for case in &bulk {
        let figure =
            |t: &str, f: fn(&Summary) -> Option<f64>| run.stream(case, t).as_ref().and_then(f);
        let r = ratio(
            figure(proxy, |s| s.mb_per_s),
            figure(DIRECT, |s| s.mb_per_s),
        );
        speed.push(format!("{case} {}", fmt_pct(r)));
        speed_met = all_of(speed_met, r.map(|r| r >= 0.9));
        let (ours, theirs) = (
            figure(proxy, |s| s.cpu_per_gb),
            figure(REFERENCE, |s| s.cpu_per_gb),
        );
        let r = ratio(ours, theirs);
        cpu.push(format!(
            "{case} {} vs {} ({})",
            fmt_cpu_gb(ours),
            fmt_cpu_gb(theirs),
            fmt_times(r)
        ));
        cpu_met = all_of(cpu_met, r.map(|r| r <= 0.6));
    }
    let mut goals = Vec::new();
    if !bulk.is_empty() {
        goals.push((
            "streams ≥ 90% of direct's MB/s (every stream case)",
            speed.join("; "),
            speed_met,
        ));
        goals.push((
            "stream CPU per GB ≤ 0.6 × the nginx reference's (every stream case)",
            cpu.join("; "),
            cpu_met,
        ));
    }
    if run.stream("follow", proxy).is_some() {
        let (ours, theirs) = (
            added(run, proxy, |s| s.p50_us),
            added(run, REFERENCE, |s| s.p50_us),
        );
        goals.push((
            "followed log: added p50 line latency ≤ the nginx reference's + 50 µs",
            format!(
                "{} (nginx reference {})",
                fmt_added(ours),
                fmt_added(theirs)
            ),
            ours.zip(theirs).map(|(o, t)| o <= t + 50.0),
        ));
    }
    goals
}

/// The results JSON's `streaming`: per case, per target, the medians and every transfer.
pub(super) fn streams_json(run: &Run) -> Value {
    let cases: Vec<Value> = run
        .stream_cases()
        .iter()
        .map(|&&(case, what)| {
            let direct = run.stream(case, DIRECT).and_then(|s| s.mb_per_s);
            let targets: Vec<Value> = run
                .targets()
                .iter()
                .filter_map(|t| {
                    let s = run.stream(case, t)?;
                    let transfers: Vec<Value> = run
                        .transfers(case, t)
                        .map(|x| {
                            json!({
                                "round": x.round,
                                "status": x.status,
                                "bytes": x.bytes,
                                "seconds": x.seconds,
                                "mbPerSec": x.mb_per_s(),
                                "cpuSeconds": x.cpu_seconds,
                                "cpuSecondsPerGb": x.cpu_per_gb(),
                                "receives": x.receives,
                                "receivedBytes": x.received_bytes,
                                "kbPerReceive": x.kb_per_receive(),
                                "peakRssKib": x.peak_rss_kib,
                                "p50Micros": x.p50_us,
                                "p99Micros": x.p99_us,
                                "maxMicros": x.max_us,
                            })
                        })
                        .collect();
                    Some(json!({
                        "target": t,
                        "medianMbPerSec": s.mb_per_s,
                        "ratioToDirect": ratio(s.mb_per_s, direct),
                        "medianCpuSecondsPerGb": s.cpu_per_gb,
                        "medianKbPerReceive": s.kb_per_receive,
                        "peakRssKib": s.peak_rss_kib,
                        "medianP50Micros": s.p50_us,
                        "medianP99Micros": s.p99_us,
                        "maxMicros": s.max_us,
                        "transfers": transfers,
                    }))
                })
                .collect();
            json!({"case": case, "what": what, "targets": targets})
        })
        .collect();
    Value::Array(cases)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two rounds of `log` and one `follow`, for direct, a proxy and the reference.
    fn run() -> Run {
        let mut raw = String::from("proxy\tp\tcmd\nmeta\tclk_tck\t100\n");
        for (target, secs, cpu, reads, p50) in [
            (DIRECT, 1.0, "-", 1000, 100),
            ("p", 1.25, "50", 4000, 180),
            (REFERENCE, 2.0, "200", 100, 300),
        ] {
            for round in [1, 2] {
                raw.push_str(&format!(
                    "stream\tlog\t{target}\t{round}\tok\t1000000000\t{secs}\t{cpu}\t8000\t{reads}\t2000000000\t-\t-\t-\n"
                ));
            }
            raw.push_str(&format!(
                "stream\tfollow\t{target}\t1\tok\t30000\t2.0\t-\t-\t200\t34000\t{p50}\t{}\t{}\n",
                p50 * 2,
                p50 * 3
            ));
        }
        raw.push_str("stream\tlog\tp\t3\tfailed: boom\t-\t-\t-\t-\t-\t-\t-\t-\t-\n");
        Run::parse(&raw)
    }

    #[test]
    fn transfers_fold_into_medians_per_case_and_target() {
        let run = run();
        let p = run.stream("log", "p").unwrap();
        assert_eq!(p.mb_per_s, Some(800.0));
        assert_eq!(p.cpu_per_gb, Some(0.5));
        assert_eq!(p.kb_per_receive, Some(500.0));
        assert_eq!(p.runs, ["800", "800", "failed: boom"]);
        let follow = run.stream("follow", "p").unwrap();
        assert_eq!((follow.mb_per_s, follow.p50_us), (None, Some(180.0)));
        assert!(run.stream("exec-ws", "p").is_none());
    }

    #[test]
    fn stream_targets_show_every_case() {
        let goals = stream_goals(&run(), "p");
        assert_eq!(goals.len(), 3);
        assert_eq!(goals[0].1, "log 80%");
        assert_eq!(goals[0].2, Some(false));
        assert_eq!(goals[1].1, "log 0.50 s vs 2.00 s (0.25×)");
        assert_eq!(goals[1].2, Some(true));
        // +80 µs against the reference's +200 µs.
        assert_eq!(goals[2].1, "+80 µs (nginx reference +200 µs)");
        assert_eq!(goals[2].2, Some(true));
        let mut md = String::new();
        streams_markdown(&mut md, &run(), &|_| "?".to_owned());
        assert!(
            md.contains(
                "| log (log read, a chunk per line) | p | 800 | 80% | 0.50 s | 500.0 | 8000 KiB"
            ),
            "{md}"
        );
    }
}

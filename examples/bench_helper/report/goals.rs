//! The targets the project set itself (throughput, CPU, memory and counted costs against the
//! nginx reference), each with the run's figure and whether it is met.

use super::format::{
    against_reference, all_of, fmt_count, fmt_kib, fmt_ms, fmt_pct, fmt_rps, fmt_us, or_dash,
};
use super::records::ratio;
use super::streams::stream_goals;
use super::{CASES, DIRECT, Det, REFERENCE, Run};

/// A target for one proxy: what it asks, the figure, and whether it is met.
pub(super) struct Goal {
    pub(super) proxy: String,
    pub(super) target: &'static str,
    pub(super) figure: String,
    pub(super) met: Option<bool>,
}

pub(super) fn goals(run: &Run) -> Vec<Goal> {
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
        for (target, figure, met) in stream_goals(run, proxy) {
            push(target, figure, met);
        }
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

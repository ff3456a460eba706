//! Reading the raw records: each line of `bench/run`'s output folded into the run's loads,
//! streams, connection steps, bursts and counted measurements, rounds folded into medians.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{Answers, Burst, ConnStep, DIRECT, Det, Load, REFERENCE, Run, Stream};

pub(super) fn num<T: std::str::FromStr>(field: Option<&&str>) -> Option<T> {
    field.and_then(|f| f.parse().ok())
}

pub(super) fn read_json(path: &str) -> Value {
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
    /// - `stream <case> <target> <round> <status> <bytes> <seconds> <cpu ticks> <VmHWM KiB>
    ///   <receives> <received bytes> <p50 µs> <p99 µs> <max µs>` (see [`Stream`]);
    /// - `conn <target> <idle connections> <status> <established> <VmRSS KiB> <VmHWM KiB>`;
    /// - `burst <target> <x509|one|distinct> <status> <TokenReviews> <SARs> <summary json file>`;
    /// - `det <x509|token> <connections> <target> <status> <oha json under callgrind> <Ir>
    ///   <TokenReviews> <SARs> <oha json> <voluntary switches> <nonvoluntary switches>
    ///   <oha json> <syscalls> <oha json of the short run under callgrind> <its Ir>`.
    ///
    /// A status other than `ok` says what went wrong; unknown lines are skipped.
    pub(super) fn parse(text: &str) -> Run {
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
                Some("stream") if f.len() >= 14 => {
                    run.streams.push(Stream::from_record(&f, &run.meta));
                }
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

    pub(super) fn load(&self, case: &str, target: &str) -> Option<&Load> {
        self.loads
            .iter()
            .find(|l| l.case == case && l.target == target)
    }

    /// Every target in the order first measured, the direct connection first, the reference last.
    pub(super) fn targets(&self) -> Vec<String> {
        let mut targets = vec![DIRECT.to_owned()];
        targets.extend(self.proxies.iter().map(|(label, _)| label.clone()));
        targets.push(REFERENCE.to_owned());
        targets
    }

    /// The proxies under test: every target but the direct connection and the reference.
    pub(super) fn proxies(&self) -> Vec<&str> {
        self.proxies.iter().map(|(l, _)| l.as_str()).collect()
    }

    pub(super) fn conn_steps(&self, target: &str) -> Vec<&ConnStep> {
        self.conns.iter().filter(|c| c.target == target).collect()
    }

    /// KiB of RSS per idle connection at the largest step, against the idle proxy.
    pub(super) fn per_connection_kib(&self, target: &str) -> Option<f64> {
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

    pub(super) fn det(&self, setup: &str, connections: u64, target: &str) -> Option<&Det> {
        self.dets
            .iter()
            .find(|d| d.setup == setup && d.connections == connections && d.target == target)
    }

    pub(super) fn burst(&self, target: &str, kind: &str) -> Option<&Burst> {
        self.bursts
            .iter()
            .find(|b| b.target == target && b.kind == kind)
    }
}

pub(super) fn clk_tck(meta: &BTreeMap<String, String>) -> f64 {
    meta.get("clk_tck")
        .and_then(|t| t.parse().ok())
        .unwrap_or(100.0)
}

impl Load {
    pub(super) fn from_record(f: &[&str], meta: &BTreeMap<String, String>) -> Load {
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
    pub(super) fn fold(rounds: Vec<Load>) -> Option<Load> {
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

pub(super) fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

pub(super) fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

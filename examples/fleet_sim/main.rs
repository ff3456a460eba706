//! The fleet simulation (issue 19, `docs/FLEET.md`): thousands of proxies, each scraped by
//! Prometheus-like clients, all asking one API server; how many reviews per second it gets under
//! the caches' rules, compared with a fixed TTL (the kubelet's rule) and other baselines.
//! Deterministic: a seeded generator and a virtual clock; a few seconds in a release build.
//!
//! `cargo run --release --example fleet_sim -- --out target/fleet` writes `fleet.csv` (reviews
//! per second of every run), `fleet.png` (the plot) and prints the summary table.
//!
//! `--mode rbac` models the RBAC mode instead (lists and watches of the RBAC objects, no
//! reviews of access; `watch`, `rbac`) and writes `fleet-rbac.csv`; `--mode both` runs both and
//! sets their figures side by side.

mod model;
mod png;
mod rbac;
mod watch;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use kubelet_auth_proxy::apiserver::cache::policy::{self, Fill};

use model::{Params, Record, Rule, Scraper, Sim, Start};
use rbac::{RbacOptions, Reviews};
use watch::RbacSet;

/// Which authorization mode's API server load to model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// Reviews: SubjectAccessReviews and TokenReviews through the caches.
    Webhook,
    /// Lists and watches of the RBAC objects; access decided on the node.
    Rbac,
    /// Both, and a table of their figures side by side.
    Both,
}

fn rbac_set(name: &str) -> Result<RbacSet, String> {
    watch::preset(name).ok_or_else(|| {
        format!(
            "unknown RBAC set {name:?}; one of {}",
            watch::PRESETS.join(", ")
        )
    })
}

/// Simulates a fleet of proxies and the reviews they send to the API server.
#[derive(Debug, Parser)]
#[command(name = "fleet_sim")]
struct Cli {
    /// Nodes, one proxy each.
    #[arg(long, default_value_t = 5000)]
    nodes: u32,
    /// Seed of the generator: the same seed, the same figures.
    #[arg(long, default_value_t = 19)]
    seed: u64,
    /// Where fleet.csv and fleet.png go.
    #[arg(long, default_value = "target/fleet")]
    out: PathBuf,
    /// Reviews per second the API server serves the proxies' flow; beyond, 429.
    #[arg(long, default_value_t = 250)]
    capacity: u32,
    /// The Retry-After of the API server's 429s, in seconds.
    #[arg(long, default_value_t = 1)]
    retry_after: u64,
    /// Prometheus' scrape targets per node (the kubelet's /metrics, /metrics/cadvisor,
    /// /metrics/probes, /metrics/resource), every 30 s, each at its own phase.
    #[arg(long, default_value_t = 4)]
    targets: u32,
    /// Prometheus' scrape interval, in milliseconds: also the width of the windows the peak is
    /// measured over (at least a second).
    #[arg(long, default_value_t = 30_000)]
    interval_ms: u64,
    /// How long the API server takes to answer a review, in milliseconds.
    #[arg(long, default_value_t = 20)]
    review_ms: u64,
    /// Also a metrics-server scraping /metrics/resource every 15 s with its own token.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    metrics_server: bool,
    /// Which mode's load: webhook (reviews), rbac (lists and watches) or both.
    #[arg(long, value_enum, default_value_t = Mode::Webhook)]
    mode: Mode,
    /// The RBAC sets to model: small (100 ClusterRoles, 100 ClusterRoleBindings), large (5,000
    /// of each); with -pod (`--pod-scoped-authz`) Roles and RoleBindings too (small: 50 and 200,
    /// large: 2,000 and 20,000).
    #[arg(long, value_delimiter = ',', value_parser = rbac_set,
          default_value = "small,large,large-pod")]
    rbac_sets: Vec<RbacSet>,
    /// `--rbac-start-jitter`, in milliseconds: each process waits a uniform part of it before
    /// its first lists.
    #[arg(long, default_value_t = 5_000)]
    rbac_start_jitter_ms: u64,
    /// How long the API server takes to answer one list page (500 objects) from its watch
    /// cache, in milliseconds.
    #[arg(long, default_value_t = 50)]
    rbac_page_ms: u64,
    /// How long the RBAC mode's outage lasts, in seconds (the Webhook mode's is 10 minutes).
    #[arg(long, default_value_t = 600)]
    rbac_outage_s: u64,
}

/// The default `--authentication-token-webhook-cache-ttl`.
const TOKEN_TTL: Duration = Duration::from_secs(120);
/// The default `--authorization-webhook-cache-authorized-ttl`.
const ACCESS_TTL: Duration = Duration::from_secs(300);
/// When the rotation and the outage happen.
const EVENT_AT: Duration = Duration::from_secs(15 * 60);
const OUTAGE: Duration = Duration::from_secs(10 * 60);
const RUN: Duration = Duration::from_secs(75 * 60);

/// The kubelet's rule, and the proxy's before issue 19: every entry lives its TTL.
fn fixed(ttl: Duration, _fill: Fill, _draw: f64) -> Duration {
    ttl
}

/// Every entry lives 90–100 % of its TTL: a jitter narrower than a scrape interval.
fn jitter_tenth(ttl: Duration, _fill: Fill, draw: f64) -> Duration {
    ttl.mul_f64(1.0 - 0.1 * draw)
}

/// Every entry lives 50–100 % of its TTL.
fn jitter_half(ttl: Duration, _fill: Fill, draw: f64) -> Duration {
    ttl.mul_f64(1.0 - 0.5 * draw)
}

/// A new key's entry lives 0–100 % of its TTL, a renewal all of it.
fn first_uniform(ttl: Duration, fill: Fill, draw: f64) -> Duration {
    match fill {
        Fill::New => ttl.mul_f64(1.0 - draw),
        Fill::Renewal => ttl,
    }
}

const FIXED: Rule = Rule {
    name: "fixed-ttl",
    lifetime: fixed,
    refresh_ahead: false,
};
const PROXY: Rule = Rule {
    name: "proxy",
    lifetime: policy::lifetime,
    refresh_ahead: true,
};
const BASELINES: [Rule; 4] = [
    Rule {
        name: "jitter-10%",
        lifetime: jitter_tenth,
        refresh_ahead: false,
    },
    Rule {
        name: "jitter-50%",
        lifetime: jitter_half,
        refresh_ahead: false,
    },
    Rule {
        name: "first-uniform",
        lifetime: first_uniform,
        refresh_ahead: false,
    },
    Rule {
        name: "proxy-no-ahead",
        lifetime: policy::lifetime,
        refresh_ahead: false,
    },
];

struct Scenario {
    name: &'static str,
    params: Params,
    /// Where "from the third TTL on" starts counting: the event, or the outage's end.
    settled_from: Duration,
    baselines: bool,
}

struct Run {
    scenario: &'static str,
    rule: &'static str,
    record: Record,
    settled_from: Duration,
    /// The scrape interval: the width of the windows the peak is measured over.
    window: Duration,
    outage_end: Option<Duration>,
}

fn main() -> std::io::Result<()> {
    let cli = Cli::parse();
    std::fs::create_dir_all(&cli.out)?;
    let webhook = (cli.mode != Mode::Rbac)
        .then(|| run_webhook(&cli))
        .transpose()?;
    if cli.mode != Mode::Webhook {
        run_rbac(&cli, webhook.as_ref())?;
    }
    Ok(())
}

/// The Webhook mode's figures, for the side-by-side table: the proxy's rule, with access
/// reviewed (Webhook) and decided on the node (what is left in the RBAC mode: TokenReviews).
struct WebhookFigures {
    webhook: Reviews,
    token_only: Reviews,
}

/// The review model, every scenario and rule: fleet.csv, fleet.png and the summary table.
fn run_webhook(cli: &Cli) -> std::io::Result<WebhookFigures> {
    let base = Params {
        nodes: cli.nodes,
        seed: cli.seed,
        duration: RUN,
        // Prometheus: the kubelet's /metrics, /metrics/cadvisor, /metrics/probes and
        // /metrics/resource, each its own target; metrics-server: /metrics/resource.
        scrapers: [
            Some(Scraper {
                interval: Duration::from_millis(cli.interval_ms),
                targets: cli.targets,
            }),
            cli.metrics_server.then_some(Scraper {
                interval: Duration::from_secs(15),
                targets: 1,
            }),
        ]
        .into_iter()
        .flatten()
        .collect(),
        token_ttl: TOKEN_TTL,
        access_ttl: ACCESS_TTL,
        review_latency: Duration::from_millis(cli.review_ms),
        capacity: cli.capacity,
        retry_after: Duration::from_secs(cli.retry_after),
        request_timeout: Duration::from_secs(10),
        start: Start::Spread(ACCESS_TTL),
        rotation: None,
        outage: None,
        local_access: false,
    };
    let third_ttl = ACCESS_TTL * 3;
    let scenarios = [
        Scenario {
            name: "steady",
            params: base.clone(),
            settled_from: third_ttl,
            baselines: false,
        },
        Scenario {
            name: "restart",
            params: Params {
                start: Start::Together,
                ..base.clone()
            },
            settled_from: third_ttl,
            baselines: true,
        },
        Scenario {
            name: "rotation",
            params: Params {
                rotation: Some(EVENT_AT),
                ..base.clone()
            },
            settled_from: EVENT_AT + third_ttl,
            baselines: true,
        },
        Scenario {
            name: "outage",
            params: Params {
                outage: Some((EVENT_AT, OUTAGE)),
                ..base.clone()
            },
            settled_from: EVENT_AT + OUTAGE + third_ttl,
            baselines: false,
        },
    ];
    let mut runs = Vec::new();
    for scenario in &scenarios {
        let mut rules = vec![FIXED, PROXY];
        if scenario.baselines {
            rules.extend(BASELINES);
        }
        for rule in rules {
            runs.push(Run {
                scenario: scenario.name,
                rule: rule.name,
                record: Sim::run(&scenario.params, rule),
                settled_from: scenario.settled_from,
                window: Duration::from_millis(cli.interval_ms),
                outage_end: scenario.params.outage.map(|(from, length)| from + length),
            });
        }
    }
    std::fs::write(cli.out.join("fleet.csv"), csv(&runs))?;
    std::fs::write(cli.out.join("fleet.png"), plot(&runs).encode())?;
    print!("{}", summary(cli, &runs));
    println!(
        "\nwrote {} and {}",
        cli.out.join("fleet.csv").display(),
        cli.out.join("fleet.png").display()
    );
    let outage_end = EVENT_AT + OUTAGE;
    let proxy = |scenario: &str| {
        runs.iter()
            .find(|r| r.scenario == scenario && r.rule == PROXY.name)
            .map(|r| &r.record)
    };
    let (Some(steady), Some(restart), Some(outage)) =
        (proxy("steady"), proxy("restart"), proxy("outage"))
    else {
        unreachable!("every scenario runs the proxy's rule");
    };
    let webhook = Reviews::of(steady, restart, outage, third_ttl, outage_end);
    // The RBAC mode keeps the TokenReviews: the same scenarios with access decided locally.
    let mut token_only = scenarios.iter().filter(|s| s.name != "rotation").map(|s| {
        let params = Params {
            local_access: true,
            ..s.params.clone()
        };
        Sim::run(&params, PROXY)
    });
    let (Some(steady), Some(restart), Some(outage)) =
        (token_only.next(), token_only.next(), token_only.next())
    else {
        unreachable!("three scenarios");
    };
    let token_only = Reviews::of(&steady, &restart, &outage, third_ttl, outage_end);
    Ok(WebhookFigures {
        webhook,
        token_only,
    })
}

/// The RBAC mode's model for every set: fleet-rbac.csv and its table, beside the Webhook mode's
/// figures when they ran.
fn run_rbac(cli: &Cli, webhook: Option<&WebhookFigures>) -> std::io::Result<()> {
    let options = RbacOptions {
        nodes: cli.nodes,
        seed: cli.seed,
        duration: RUN,
        event_at: EVENT_AT,
        outage: Duration::from_secs(cli.rbac_outage_s),
        start_jitter: Duration::from_millis(cli.rbac_start_jitter_ms),
        page_latency: Duration::from_millis(cli.rbac_page_ms),
    };
    let runs = rbac::run(&options, &cli.rbac_sets);
    std::fs::write(cli.out.join("fleet-rbac.csv"), rbac::csv(&runs))?;
    println!(
        "\nfleet_sim RBAC mode: {} nodes, seed {}, start jitter {} s, list pages of 500 in {} ms, \
         watch timeouts 300-600 s, outage {} s{}\n",
        cli.nodes,
        cli.seed,
        options.start_jitter.as_secs_f64(),
        cli.rbac_page_ms,
        cli.rbac_outage_s,
        if webhook.is_some() {
            "; Webhook: the proxy's rule above, outage 600 s; RBAC reviews: TokenReviews only"
        } else {
            ""
        }
    );
    print!(
        "{}",
        rbac::table(
            &options,
            &runs,
            webhook.map(|w| &w.webhook),
            webhook.map(|w| &w.token_only)
        )
    );
    print!("\n{}", rbac::restart_profile(&runs));
    println!("\nwrote {}", cli.out.join("fleet-rbac.csv").display());
    Ok(())
}

/// Calls per scrape-interval window from `from` on: (peak, mean), in calls per second.
fn windows(calls: &[u32], from: Duration, width: Duration) -> (f64, f64) {
    let width = usize::try_from(width.as_secs().max(1)).unwrap_or(1);
    let start = usize::try_from(from.as_secs()).unwrap_or(usize::MAX);
    let sums: Vec<u64> = calls
        .get(start..)
        .unwrap_or_default()
        .chunks_exact(width)
        .map(|w| w.iter().map(|&c| u64::from(c)).sum())
        .collect();
    let peak = sums.iter().copied().max().unwrap_or(0) as f64 / width as f64;
    let mean = sums.iter().sum::<u64>() as f64 / (sums.len().max(1) * width) as f64;
    (peak, mean)
}

/// The latency below which `share` of the answered requests were, in milliseconds.
fn percentile(histogram: &[u64], share: f64) -> usize {
    let total: u64 = histogram.iter().sum();
    let wanted = (total as f64 * share).ceil() as u64;
    let mut seen = 0;
    for (ms, &count) in histogram.iter().enumerate() {
        seen += count;
        if seen >= wanted.max(1) {
            return ms;
        }
    }
    histogram.len()
}

fn summary(cli: &Cli, runs: &[Run]) -> String {
    let mut out = format!(
        "fleet_sim: {} nodes, seed {}, Prometheus {} targets/{}s{}, \
         TTLs token {}s / access {}s, API server {} reviews/s then 429 Retry-After {}s\n\n",
        cli.nodes,
        cli.seed,
        cli.targets,
        cli.interval_ms as f64 / 1000.0,
        if cli.metrics_server {
            " + metrics-server 1 target/15s"
        } else {
            ""
        },
        TOKEN_TTL.as_secs(),
        ACCESS_TTL.as_secs(),
        cli.capacity,
        cli.retry_after
    );
    out.push_str(
        "| scenario | rule | reviews | settled mean/s | settled peak/s | peak/mean | requests failed | p50 ms | p99 ms | p99.9 ms | max ms | refreshes ahead | back after outage s |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for run in runs {
        let record = &run.record;
        let (peak, mean) = windows(&record.calls, run.settled_from, run.window);
        let total: u64 = record.calls.iter().map(|&c| u64::from(c)).sum();
        let failed: u64 = record.failed.iter().map(|&c| u64::from(c)).sum();
        let back = run.outage_end.map_or_else(
            || "-".to_owned(),
            |end| {
                let end = usize::try_from(end.as_secs()).unwrap_or(usize::MAX);
                let last = record
                    .failed
                    .iter()
                    .enumerate()
                    .rfind(|&(_, &f)| f > 0)
                    .map_or(0, |(second, _)| second);
                last.saturating_sub(end).to_string()
            },
        );
        out.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.2} | {} | {} | {} | {} | {} | {} | {} |\n",
            run.scenario,
            run.rule,
            total,
            mean,
            peak,
            peak / mean.max(f64::MIN_POSITIVE),
            failed,
            percentile(&record.latency_ms, 0.5),
            percentile(&record.latency_ms, 0.99),
            percentile(&record.latency_ms, 0.999),
            percentile(&record.latency_ms, 1.0),
            record.refreshes,
            back
        ));
    }
    out
}

fn csv(runs: &[Run]) -> String {
    let mut out = String::from("second");
    for run in runs {
        for column in ["calls", "throttled", "refused", "served", "failed"] {
            out.push_str(&format!(",{}/{}/{}", run.scenario, run.rule, column));
        }
    }
    out.push('\n');
    let seconds = runs.first().map_or(0, |r| r.record.calls.len());
    for second in 0..seconds {
        out.push_str(&second.to_string());
        for run in runs {
            let r = &run.record;
            for series in [&r.calls, &r.throttled, &r.refused, &r.served, &r.failed] {
                out.push_str(&format!(",{}", series[second]));
            }
        }
        out.push('\n');
    }
    out
}

/// One panel per scenario, reviews per second over the run: the fixed TTL in red, the proxy's
/// rules in blue. The y axis ends at 4× the fixed TTL's settled mean (its value is written at
/// the top left; higher seconds are drawn at the top); a tick every 5 minutes, labelled every 15.
fn plot(runs: &[Run]) -> png::Canvas {
    const WIDTH: usize = 1500;
    const PANEL: usize = 260;
    const LEFT: i64 = 70;
    const TOP: i64 = 20;
    let scenarios: Vec<&str> = runs
        .iter()
        .map(|r| r.scenario)
        .fold(Vec::new(), |mut seen, s| {
            if !seen.contains(&s) {
                seen.push(s);
            }
            seen
        });
    let mut canvas = png::Canvas::new(WIDTH, PANEL * scenarios.len());
    let (grey, black) = ([200, 200, 200], [0, 0, 0]);
    for (i, scenario) in scenarios.iter().enumerate() {
        let top = i64::try_from(i * PANEL).unwrap_or(0) + TOP;
        let bottom = top + i64::try_from(PANEL).unwrap_or(0) - 2 * TOP;
        let right = i64::try_from(WIDTH).unwrap_or(0) - 20;
        let find = |rule| {
            runs.iter()
                .find(|r| r.scenario == *scenario && r.rule == rule)
        };
        let (Some(fixed), Some(proxy)) = (find(FIXED.name), find(PROXY.name)) else {
            continue;
        };
        let (_, mean) = windows(&fixed.record.calls, fixed.settled_from, fixed.window);
        let ymax = (mean * 4.0).max(1.0);
        let seconds = fixed.record.calls.len();
        let x_of = |second: usize| {
            LEFT + i64::try_from(second).unwrap_or(0) * (right - LEFT)
                / i64::try_from(seconds.max(1)).unwrap_or(1)
        };
        let y_of = |calls: u32| {
            let share = (f64::from(calls) / ymax).min(1.0);
            bottom - (share * (bottom - top) as f64) as i64
        };
        for minute in (0..=seconds / 60).step_by(5) {
            let x = x_of(minute * 60);
            canvas.line((x, top), (x, bottom), grey);
            if minute.is_multiple_of(15) {
                canvas.number((x - 4, bottom + 6), minute as u64, 2, black);
            }
        }
        canvas.line((LEFT, bottom), (right, bottom), black);
        canvas.line((LEFT, top), (LEFT, bottom), black);
        canvas.number((4, top), ymax.round() as u64, 2, black);
        canvas.number((4, bottom - 10), 0, 2, black);
        // Which scenario: 1 to 4 dots at the right of the axis' top.
        for dot in 0..=i {
            canvas.number((LEFT + 8 + 10 * dot as i64, top + 2), 1, 1, black);
        }
        for (run, colour) in [(fixed, [220, 50, 40]), (proxy, [30, 80, 220])] {
            let mut last = None;
            for (second, &calls) in run.record.calls.iter().enumerate() {
                let point = (x_of(second), y_of(calls));
                if let Some(previous) = last {
                    canvas.line(previous, point, colour);
                }
                last = Some(point);
            }
        }
    }
    canvas
}

//! Measures the `RBAC` authorization mode against a running real kube-apiserver (run by hand, not
//! by CI): how fast grants and revocations take effect, what the proxy costs the API server in
//! steady state, what it answers through an API server outage and how its watches resume, and its
//! memory with a large RBAC set. Each phase starts its own proxy process (the binary given with
//! `--proxy-binary`) in front of a stand-in kubelet (plain HTTP, in this process), with
//! `--authorization-mode=Node,RBAC --rbac-start-jitter=0s` and the proxy kubeconfig; callers
//! present client certificates of a CA made here. 403 is refused, anything else allowed.
//!
//! Where the API server is comes from flags or the `KAP_REAL_APISERVER_KUBECONFIG_*` variables
//! that `.ci/run` sets (see `tests/support/real_apiserver.rs`). To reproduce (the API server files are
//! not part of this repository; `start-apiserver.sh` is the one beside the CI checkout, and the
//! outage phase needs its PID file):
//!
//! ```text
//! start-apiserver.sh /tmp/real-rbac > /tmp/real-rbac.env
//! export KAP_REAL_APISERVER_KUBECONFIG_ADMIN=/tmp/real-rbac/admin.kubeconfig
//! export KAP_REAL_APISERVER_KUBECONFIG_PROXY=/tmp/real-rbac/proxy.kubeconfig
//! cargo build --release
//! cargo run --release --example rbac_live -- --proxy-binary target/release/kubelet-auth-proxy \
//!     --apiserver-pid-file /tmp/real-rbac/run/kube-apiserver.pid
//! # quick: --changes 20 --steady-secs 30 --outage-secs 20 --cluster-roles 500 \
//! #        --cluster-role-bindings 500 --namespaces 100 --role-bindings 2000
//! # one phase: --phases latency (latency, steady, outage, scale; comma-separated)
//! # the staleness bound in an outage: --phases outage --outage-secs 60 \
//! #        --proxy-flag=--rbac-max-staleness=30s
//! start-apiserver.sh /tmp/real-rbac stop
//! ```
//!
//! The scale phase leaves its objects behind (without the namespace controller, which this API
//! server does not run, its namespaces could not go anyway); use a throwaway API server. The outage phase stops the API server process (SIGTERM, SIGKILL if
//! it is still there 10 s later, as `start-apiserver.sh` stops it; etcd keeps running, so
//! resource versions survive) and starts it again with exactly its command line,
//! environment and working directory read from `/proc` beforehand, writing the new PID to the PID
//! file so `start-apiserver.sh DIR stop` still stops it.

#[allow(dead_code)] // Shared with the end-to-end tests; this tool uses only part of it.
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use http::StatusCode;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding, RoleRef};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use support::client::{Client, Connection, H2_AND_HTTP1, Reply, empty, plain_get, request};
use support::process::{Deployment, ProcessSpec, ProxyProcess};
use support::real_apiserver::{
    self, OWNER_LABEL, cluster_role, cluster_role_binding, core_rule, meta, user_subject,
};

/// Measures the RBAC mode against a real kube-apiserver.
#[derive(Debug, Parser)]
#[command(name = "rbac_live")]
struct Cli {
    /// The admin kubeconfig (system:masters): creates and deletes the objects.
    #[arg(long, env = "KAP_REAL_APISERVER_KUBECONFIG_ADMIN")]
    admin_kubeconfig: PathBuf,
    /// The proxy's --kubeconfig (list and watch of the RBAC kinds).
    #[arg(long, env = "KAP_REAL_APISERVER_KUBECONFIG_PROXY")]
    proxy_kubeconfig: PathBuf,
    /// The proxy binary to measure.
    #[arg(long, default_value = "target/release/kubelet-auth-proxy")]
    proxy_binary: PathBuf,
    /// The kube-apiserver's PID file (start-apiserver.sh's DIR/run/kube-apiserver.pid): the
    /// outage phase stops that process and writes the restarted one's PID there.
    #[arg(long)]
    apiserver_pid_file: Option<PathBuf>,
    /// Phases to run, comma-separated: latency, steady, outage, scale.
    #[arg(
        long,
        default_value = "latency,steady,outage,scale",
        value_delimiter = ','
    )]
    phases: Vec<String>,
    /// Grants and revocations measured (each).
    #[arg(long, default_value_t = 20)]
    changes: usize,
    /// How often the proxy is asked while a change is awaited, in milliseconds.
    #[arg(long, default_value_t = 2)]
    poll_ms: u64,
    /// Steady-state duration, in seconds.
    #[arg(long, default_value_t = 120)]
    steady_secs: u64,
    /// How long the API server stays down, in seconds.
    #[arg(long, default_value_t = 300)]
    outage_secs: u64,
    /// Scale phase: ClusterRoles (half granting nodes/proxy or nodes/stats, half configmaps).
    #[arg(long, default_value_t = 5000)]
    cluster_roles: usize,
    /// Scale phase: ClusterRoleBindings.
    #[arg(long, default_value_t = 5000)]
    cluster_role_bindings: usize,
    /// Scale phase: namespaces.
    #[arg(long, default_value_t = 2000)]
    namespaces: usize,
    /// Scale phase: RoleBindings (of the ClusterRoles), spread over the namespaces.
    #[arg(long, default_value_t = 20000)]
    role_bindings: usize,
    /// A further flag for every proxy started (repeatable), e.g. `--proxy-flag=--rbac-max-staleness=60s`.
    #[arg(long = "proxy-flag", allow_hyphen_values = true)]
    proxy_flags: Vec<String>,
    /// Scale phase: creations in flight at once.
    #[arg(long, default_value_t = 48)]
    concurrency: usize,
}

/// What every phase shares: the admin client and a run id naming its objects.
struct Ctx {
    cli: Cli,
    kube: kube::Client,
    run: String,
}

impl Ctx {
    fn name(&self, what: &str) -> String {
        format!("kap-live-{}-{what}", self.run)
    }

    fn owner(&self, phase: &str) -> String {
        format!("kap-live-{}-{phase}", self.run)
    }

    /// A proxy process with the mode (and `extra` flags) in front of its own stand-in kubelet.
    async fn proxy(&self, name: &str, extra: &[&str]) -> Proxy {
        let deployment = ProcessSpec::new(name).prepare().await;
        let mut args = vec![
            "--authorization-mode=Node,RBAC".to_owned(),
            format!("--kubeconfig={}", self.cli.proxy_kubeconfig.display()),
            "--rbac-start-jitter=0s".to_owned(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        args.extend(self.cli.proxy_flags.iter().cloned());
        let process = deployment
            .start_from(&self.cli.proxy_binary, name, &args)
            .await;
        Proxy {
            deployment,
            process,
        }
    }

    /// Deletes the ClusterRoles and ClusterRoleBindings labelled as `phase`'s.
    async fn cleanup(&self, phase: &str) -> anyhow::Result<()> {
        let selector =
            ListParams::default().labels(&format!("{OWNER_LABEL}={}", self.owner(phase)));
        let bindings: Api<ClusterRoleBinding> = Api::all(self.kube.clone());
        bindings
            .delete_collection(&DeleteParams::default(), &selector)
            .await?;
        let roles: Api<ClusterRole> = Api::all(self.kube.clone());
        roles
            .delete_collection(&DeleteParams::default(), &selector)
            .await?;
        Ok(())
    }

    /// A ClusterRole granting `resources` (get, create) for `phase`.
    async fn grant_role(&self, phase: &str, role: &str, resources: &[&str]) -> anyhow::Result<()> {
        let roles: Api<ClusterRole> = Api::all(self.kube.clone());
        let rules = vec![core_rule(resources, &["get", "create"])];
        roles
            .create(
                &PostParams::default(),
                &cluster_role(role, &self.owner(phase), &[], rules),
            )
            .await?;
        Ok(())
    }

    async fn bind(&self, phase: &str, binding: &str, role: &str, user: &str) -> anyhow::Result<()> {
        let bindings: Api<ClusterRoleBinding> = Api::all(self.kube.clone());
        bindings
            .create(
                &PostParams::default(),
                &cluster_role_binding(binding, &self.owner(phase), role, vec![user_subject(user)]),
            )
            .await?;
        Ok(())
    }
}

/// A proxy process and what it was started from.
struct Proxy {
    deployment: Deployment,
    process: ProxyProcess,
}

impl Proxy {
    fn client(&self, user: &str) -> Client {
        self.deployment
            .client(self.process.addr(), user, H2_AND_HTTP1)
    }

    async fn metrics(&self) -> String {
        plain_get(self.process.admin_addr(), "/metrics")
            .await
            .text()
    }

    async fn metric(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        // + 0.0: an empty sum is -0.0, printed "-0".
        support::metrics::total(&self.metrics().await, metric, labels) + 0.0
    }

    async fn synced(&self, kinds: &[&str]) -> bool {
        let text = self.metrics().await;
        kinds.iter().all(|kind| {
            support::metrics::total(&text, "kubelet_auth_proxy_rbac_synced", &[("kind", kind)])
                == 1.0
        })
    }

    /// Waits until `kinds` are synced, at most `limit`; how long it took.
    async fn wait_synced(&self, kinds: &[&str], limit: Duration) -> anyhow::Result<Duration> {
        let start = Instant::now();
        while !self.synced(kinds).await {
            if start.elapsed() > limit {
                bail!("not synced within {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(start.elapsed())
    }

    async fn stop(mut self) {
        self.process.terminate();
        self.process.wait().await;
    }
}

/// A kept-open connection asking one request again and again as one user.
struct Asker {
    client: Client,
    conn: Option<Connection>,
    method: &'static str,
    target: String,
}

impl Asker {
    fn new(client: Client, method: &'static str, target: &str) -> Asker {
        Asker {
            client,
            conn: None,
            method,
            target: target.to_owned(),
        }
    }

    /// The proxy's answer, or `None` when it could not be had (the connection is then reopened
    /// on the next call).
    async fn ask(&mut self) -> Option<StatusCode> {
        if self.conn.is_none() {
            self.conn = self.client.connect().await.ok();
        }
        let conn = self.conn.as_mut()?;
        let req = request(self.method, &self.target).body(empty()).unwrap();
        let answer = match conn.send(req).await {
            Ok(response) => Reply::read(response).await.ok().map(|r| r.status),
            Err(_) => None,
        };
        if answer.is_none() {
            self.conn = None;
        }
        answer
    }

    async fn allowed(&mut self) -> Option<bool> {
        self.ask().await.map(|s| s != StatusCode::FORBIDDEN)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    anyhow::ensure!(
        cli.proxy_binary.exists(),
        "{}: no such binary (cargo build --release)",
        cli.proxy_binary.display()
    );
    let kube = real_apiserver::client_of(&cli.admin_kubeconfig).await;
    let run = format!("{:x}", std::process::id());
    let phases = cli.phases.clone();
    let ctx = Ctx { cli, kube, run };
    println!(
        "rbac_live: proxy {}, {} (run {})",
        ctx.cli.proxy_binary.display(),
        ctx.cli.admin_kubeconfig.display(),
        ctx.run
    );
    for phase in &phases {
        let outcome = match phase.as_str() {
            "latency" => latency(&ctx).await,
            "steady" => steady(&ctx).await,
            "outage" => outage(&ctx).await,
            "scale" => scale(&ctx).await,
            other => Err(anyhow::anyhow!("unknown phase {other}")),
        };
        if phase != "scale" {
            ctx.cleanup(phase).await.context("cleaning up")?;
        }
        outcome.with_context(|| format!("phase {phase}"))?;
    }
    Ok(())
}

/// Percentiles of `samples` (milliseconds): p50, p99, max.
fn summary(samples: &mut [f64]) -> String {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
        samples[rank - 1]
    };
    format!(
        "n={} p50={:.1}ms p99={:.1}ms max={:.1}ms min={:.1}ms",
        samples.len(),
        at(0.50),
        at(0.99),
        samples[samples.len() - 1],
        samples[0]
    )
}

/// Grant and revocation latency: a ClusterRoleBinding created (deleted), from the API server's
/// acknowledgement (the create or delete call returning) to the first answer of the proxy that
/// shows the change, the proxy being asked every `--poll-ms` on a kept-open connection.
async fn latency(ctx: &Ctx) -> anyhow::Result<()> {
    const PHASE: &str = "latency";
    println!(
        "\n== latency: {} grants and {} revocations",
        ctx.cli.changes, ctx.cli.changes
    );
    let proxy = ctx.proxy("latency", &[]).await;
    proxy
        .wait_synced(
            &["clusterroles", "clusterrolebindings"],
            Duration::from_secs(60),
        )
        .await?;
    let role = ctx.name("latency-role");
    ctx.grant_role(PHASE, &role, &["nodes/proxy"]).await?;
    let user = ctx.name("latency-user");
    let mut asker = Asker::new(proxy.client(&user), "GET", "/pods");
    let bindings: Api<ClusterRoleBinding> = Api::all(ctx.kube.clone());
    let poll = Duration::from_millis(ctx.cli.poll_ms);
    let (mut grants, mut revocations) = (Vec::new(), Vec::new());
    let (mut grant_calls, mut revoke_calls) = (Vec::new(), Vec::new());
    for i in 0..ctx.cli.changes {
        let binding = ctx.name(&format!("latency-{i}"));
        anyhow::ensure!(
            asker.allowed().await == Some(false),
            "allowed before the grant"
        );
        let sent = Instant::now();
        ctx.bind(PHASE, &binding, &role, &user).await?;
        let acked = Instant::now();
        grant_calls.push(ms(acked - sent));
        grants.push(ms(until(&mut asker, true, acked, poll).await?));
        let sent = Instant::now();
        bindings.delete(&binding, &DeleteParams::default()).await?;
        let acked = Instant::now();
        revoke_calls.push(ms(acked - sent));
        revocations.push(ms(until(&mut asker, false, acked, poll).await?));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "measured: from the create/delete call returning (the API server's acknowledgement) to the \
         first proxy answer showing the change; asked every {}ms (GET /pods, HTTP/2, kept-open TLS \
         connection, client certificate); includes one request's round trip",
        ctx.cli.poll_ms
    );
    println!("grant      {}", summary(&mut grants));
    println!("revocation {}", summary(&mut revocations));
    println!(
        "(API call itself: create {}; delete {})",
        summary(&mut grant_calls),
        summary(&mut revoke_calls)
    );
    let builds = proxy
        .metric("kubelet_auth_proxy_rbac_lists_total", &[])
        .await;
    println!("lists during the phase: {builds}");
    proxy.stop().await;
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Asks every `poll` until the answer is `want`; the time from `from` to that answer.
async fn until(
    asker: &mut Asker,
    want: bool,
    from: Instant,
    poll: Duration,
) -> anyhow::Result<Duration> {
    let mut next = Instant::now();
    loop {
        if asker.allowed().await == Some(want) {
            return Ok(from.elapsed());
        }
        if from.elapsed() > Duration::from_secs(30) {
            bail!("the proxy's answer did not become {want} within 30 s");
        }
        next += poll;
        tokio::time::sleep_until(next.into()).await;
    }
}

/// `apiserver_request_total` by (verb, resource, subresource), from the API server's /metrics.
async fn apiserver_requests(kube: &kube::Client) -> BTreeMap<(String, String, String), f64> {
    let text = real_apiserver::apiserver_metrics(kube).await;
    let mut by = BTreeMap::new();
    for (labels, value) in support::metrics::samples(&text, "apiserver_request_total") {
        let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
        *by.entry((get("verb"), get("resource"), get("subresource")))
            .or_insert(0.0) += value;
    }
    by
}

/// Steady state: a scraper (GET /metrics/cadvisor, 1/s) and an exec user (POST /exec, 0.2/s),
/// both allowed by RBAC, for `--steady-secs`; the API server's request counters and the proxy's
/// own API-call metrics before and after.
async fn steady(ctx: &Ctx) -> anyhow::Result<()> {
    const PHASE: &str = "steady";
    let secs = ctx.cli.steady_secs;
    println!(
        "\n== steady state: {secs} s, scraper 1 req/s + exec user 0.2 req/s, both allowed by RBAC"
    );
    let role = ctx.name("steady-role");
    ctx.grant_role(
        PHASE,
        &role,
        &["nodes/proxy", "nodes/metrics", "nodes/stats"],
    )
    .await?;
    let scraper = ctx.name("steady-scraper");
    let exec = ctx.name("steady-exec");
    ctx.bind(PHASE, &ctx.name("steady-scraper"), &role, &scraper)
        .await?;
    ctx.bind(PHASE, &ctx.name("steady-exec"), &role, &exec)
        .await?;
    let proxy = ctx.proxy("steady", &[]).await;
    proxy
        .wait_synced(
            &["clusterroles", "clusterrolebindings"],
            Duration::from_secs(60),
        )
        .await?;
    let mut scrape = Asker::new(proxy.client(&scraper), "GET", "/metrics/cadvisor");
    let mut execs = Asker::new(
        proxy.client(&exec),
        "POST",
        "/exec/default/pod/c?command=true",
    );
    // Wait until both are allowed (the bindings may still be arriving as events).
    let started = Instant::now();
    while scrape.allowed().await != Some(true) || execs.allowed().await != Some(true) {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "never allowed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = apiserver_requests(&ctx.kube).await;
    let proxy_before = proxy.metrics().await;
    let start = Instant::now();
    let mut answers: BTreeMap<(&str, Option<u16>), u64> = BTreeMap::new();
    let mut tick = 0u64;
    while start.elapsed() < Duration::from_secs(secs) {
        let status = scrape.ask().await.map(|s| s.as_u16());
        *answers
            .entry(("scraper GET /metrics/cadvisor", status))
            .or_default() += 1;
        if tick.is_multiple_of(5) {
            let status = execs.ask().await.map(|s| s.as_u16());
            *answers.entry(("exec POST /exec/...", status)).or_default() += 1;
        }
        tick += 1;
        tokio::time::sleep_until((start + Duration::from_secs(tick)).into()).await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let after = apiserver_requests(&ctx.kube).await;
    let proxy_after = proxy.metrics().await;
    println!("answers: {answers:?}");
    println!(
        "API server requests during {elapsed:.0} s (apiserver_request_total deltas, all clients: the \
         API server's own loops and these two /metrics reads included), per minute:"
    );
    let per_minute = 60.0 / elapsed;
    for (key, value) in &after {
        let delta = value - before.get(key).copied().unwrap_or(0.0);
        if delta > 0.0 {
            println!(
                "  {:<8} {:<30} {:<12} {:>8.2}/min",
                key.0,
                key.1,
                key.2,
                delta * per_minute
            );
        }
    }
    let d = |name: &str, labels: &[(&str, &str)]| {
        support::metrics::total(&proxy_after, name, labels)
            - support::metrics::total(&proxy_before, name, labels)
    };
    let sar_total = |m: &BTreeMap<(String, String, String), f64>| {
        m.iter()
            .filter(|(k, _)| k.1 == "subjectaccessreviews")
            .map(|(_, v)| v)
            .sum::<f64>()
    };
    println!(
        "SubjectAccessReviews on the API server: {} (whole phase); the proxy's own calls: \
         SubjectAccessReview {}, TokenReview {}; RBAC lists {}, watches started {}, watch failures {}",
        sar_total(&after) - sar_total(&before),
        d(
            "kubelet_auth_proxy_apiserver_calls_total",
            &[("kind", "SubjectAccessReview")]
        ),
        d(
            "kubelet_auth_proxy_apiserver_calls_total",
            &[("kind", "TokenReview")]
        ),
        d("kubelet_auth_proxy_rbac_lists_total", &[]),
        d("kubelet_auth_proxy_rbac_watches_total", &[]),
        d("kubelet_auth_proxy_rbac_watch_failures_total", &[]),
    );
    println!(
        "decisions: RBAC allowed {}, none {}",
        d(
            "kubelet_auth_proxy_authorization_decisions_total",
            &[("mode", "RBAC")]
        ),
        d(
            "kubelet_auth_proxy_authorization_decisions_total",
            &[("mode", "none")]
        ),
    );
    proxy.stop().await;
    Ok(())
}

/// The API server process: what it was started with.
struct Launch {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: PathBuf,
    log: Option<PathBuf>,
}

impl Launch {
    fn of(pid: u32) -> anyhow::Result<Launch> {
        let split = |bytes: Vec<u8>| -> Vec<String> {
            bytes
                .split(|b| *b == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        };
        let argv = split(std::fs::read(format!("/proc/{pid}/cmdline"))?);
        let env = split(std::fs::read(format!("/proc/{pid}/environ"))?)
            .into_iter()
            .filter_map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
            })
            .collect();
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd"))?;
        let log = std::fs::read_link(format!("/proc/{pid}/fd/2"))
            .ok()
            .filter(|p| p.is_absolute() && p.exists());
        anyhow::ensure!(
            argv.first().is_some_and(|a| a.ends_with("kube-apiserver")),
            "process {pid} is not kube-apiserver: {argv:?}"
        );
        Ok(Launch {
            argv,
            env,
            cwd,
            log,
        })
    }

    fn start(&self) -> anyhow::Result<u32> {
        use std::os::unix::process::CommandExt as _;
        let log = match &self.log {
            Some(path) => std::fs::OpenOptions::new().append(true).open(path)?,
            None => std::fs::File::create("/dev/null")?,
        };
        let child = std::process::Command::new(&self.argv[0])
            .args(&self.argv[1..])
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.cwd)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()?;
        Ok(child.id())
    }
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
}

/// The outage: the API server stopped for `--outage-secs`, the proxy asked once a second as an
/// allowed and a refused user; then the API server started again with the same command line, and
/// the time until the watches resumed.
async fn outage(ctx: &Ctx) -> anyhow::Result<()> {
    const PHASE: &str = "outage";
    let secs = ctx.cli.outage_secs;
    println!("\n== outage: the API server stopped for {secs} s");
    let pid_file = ctx
        .cli
        .apiserver_pid_file
        .as_ref()
        .context("the outage phase needs --apiserver-pid-file")?;
    let pid: u32 = std::fs::read_to_string(pid_file)?.trim().parse()?;
    let launch = Launch::of(pid)?;
    let role = ctx.name("outage-role");
    ctx.grant_role(PHASE, &role, &["nodes/proxy"]).await?;
    let allowed_user = ctx.name("outage-allowed");
    ctx.bind(PHASE, &ctx.name("outage-allowed"), &role, &allowed_user)
        .await?;
    let proxy = ctx.proxy("outage", &[]).await;
    let kinds = ["clusterroles", "clusterrolebindings"];
    proxy.wait_synced(&kinds, Duration::from_secs(60)).await?;
    let mut allowed = Asker::new(proxy.client(&allowed_user), "GET", "/pods");
    let mut refused = Asker::new(proxy.client(&ctx.name("outage-refused")), "GET", "/pods");
    let started = Instant::now();
    while allowed.allowed().await != Some(true) {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "never allowed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = proxy.metrics().await;
    let watches_before =
        support::metrics::total(&before, "kubelet_auth_proxy_rbac_watches_total", &[]);

    // Stop the API server as start-apiserver.sh does: SIGTERM (it stops listening at once, then
    // drains), SIGKILL if it has not exited 10 s later.
    let stopped_at = Instant::now();
    let signal = |name: &str| {
        std::process::Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .status()
    };
    anyhow::ensure!(signal("TERM")?.success(), "kill -TERM {pid}");
    println!("sent SIGTERM to kube-apiserver (pid {pid}); t counts from then");
    let mut timeline: Vec<String> = Vec::new();
    let mut last = String::new();
    let mut record = |t: f64, line: String, timeline: &mut Vec<String>| {
        if line != last {
            timeline.push(format!("  t={t:>6.1}s {line}"));
            last = line;
        }
    };
    let mut tick = 0u64;
    let mut killed = false;
    let mut exited = None;
    while stopped_at.elapsed() < Duration::from_secs(secs) || exited.is_none() {
        if exited.is_none() && !alive(pid) {
            exited = Some(stopped_at.elapsed());
            timeline.push(format!(
                "  t={:>6.1}s   (kube-apiserver exited{})",
                stopped_at.elapsed().as_secs_f64(),
                if killed {
                    ", after SIGKILL at 10 s"
                } else {
                    ""
                }
            ));
        } else if exited.is_none() && !killed && stopped_at.elapsed() > Duration::from_secs(10) {
            let _ = signal("KILL");
            killed = true;
        }
        anyhow::ensure!(
            exited.is_some() || stopped_at.elapsed() < Duration::from_secs(30),
            "the API server did not stop"
        );
        let a = allowed.ask().await.map(|s| s.as_u16());
        let r = refused.ask().await.map(|s| s.as_u16());
        let text = proxy.metrics().await;
        let synced: Vec<f64> = kinds
            .iter()
            .map(|k| {
                support::metrics::total(&text, "kubelet_auth_proxy_rbac_synced", &[("kind", k)])
            })
            .collect();
        let failures =
            support::metrics::total(&text, "kubelet_auth_proxy_rbac_watch_failures_total", &[])
                + 0.0;
        let rbac_allowed = support::metrics::total(
            &text,
            "kubelet_auth_proxy_authorization_decisions_total",
            &[("mode", "RBAC")],
        );
        record(
            stopped_at.elapsed().as_secs_f64(),
            format!("allowed user {a:?}, refused user {r:?}, rbac_synced {synced:?}"),
            &mut timeline,
        );
        if tick.is_multiple_of(30) {
            timeline.push(format!(
                "  t={:>6.1}s   (watch failures so far {failures}, RBAC-allowed decisions {rbac_allowed})",
                stopped_at.elapsed().as_secs_f64()
            ));
        }
        tick += 1;
        tokio::time::sleep_until((stopped_at + Duration::from_secs(tick)).into()).await;
    }
    println!("during the outage (a line when the answers change; every 30 s the counters):");
    for line in &timeline {
        println!("{line}");
    }

    // Start it again, exactly as it was.
    let restarted_at = Instant::now();
    let new_pid = launch.start()?;
    std::fs::write(pid_file, format!("{new_pid}\n"))?;
    println!(
        "started kube-apiserver again (pid {new_pid}, same command line, environment and cwd)"
    );
    let mut ready_after = None;
    let mut resumed_after = None;
    let mut answers_after: Vec<String> = Vec::new();
    let mut last = String::new();
    while restarted_at.elapsed() < Duration::from_secs(120) {
        if ready_after.is_none() {
            let probe = tokio::time::timeout(
                Duration::from_secs(1),
                ctx.kube
                    .request_text(http::Request::get("/readyz").body(Vec::new())?),
            )
            .await;
            if matches!(probe, Ok(Ok(ref body)) if body.trim() == "ok") {
                ready_after = Some(restarted_at.elapsed());
            }
        }
        let text = proxy.metrics().await;
        let synced = kinds.iter().all(|k| {
            support::metrics::total(&text, "kubelet_auth_proxy_rbac_synced", &[("kind", k)]) == 1.0
        });
        let watches = support::metrics::total(&text, "kubelet_auth_proxy_rbac_watches_total", &[]);
        let a = allowed.ask().await.map(|s| s.as_u16());
        let r = refused.ask().await.map(|s| s.as_u16());
        let line = format!("allowed user {a:?}, refused user {r:?}");
        if line != last {
            answers_after.push(format!(
                "  t={:>6.1}s {line}",
                restarted_at.elapsed().as_secs_f64()
            ));
            last = line;
        }
        if synced && watches >= watches_before + kinds.len() as f64 {
            resumed_after = Some(restarted_at.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("after the restart:");
    for line in &answers_after {
        println!("{line}");
    }
    let after = proxy.metrics().await;
    let delta = |name: &str, labels: &[(&str, &str)]| {
        support::metrics::total(&after, name, labels)
            - support::metrics::total(&before, name, labels)
    };
    println!(
        "API server ready (its /readyz ok) {} after the restart; watches resumed (rbac_synced 1 for \
         both kinds and a new watch each) {} after the restart",
        ready_after.map_or("not within 120 s".to_owned(), |d| format!(
            "{:.2} s",
            d.as_secs_f64()
        )),
        resumed_after.map_or("not within 120 s".to_owned(), |d| format!(
            "{:.2} s",
            d.as_secs_f64()
        )),
    );
    println!(
        "over the outage: watches started {}, watch failures {}, lists start {} / gone {} / failed {}",
        delta("kubelet_auth_proxy_rbac_watches_total", &[]),
        delta("kubelet_auth_proxy_rbac_watch_failures_total", &[]),
        delta(
            "kubelet_auth_proxy_rbac_lists_total",
            &[("reason", "start")]
        ),
        delta("kubelet_auth_proxy_rbac_lists_total", &[("reason", "gone")]),
        delta(
            "kubelet_auth_proxy_rbac_lists_total",
            &[("reason", "failed")]
        ),
    );
    // Fresh again: new grants take effect (each from the create call returning).
    let mut after_restart = Vec::new();
    for i in 0..5 {
        let late = ctx.name(&format!("outage-late-{i}"));
        let mut late_asker = Asker::new(proxy.client(&late), "GET", "/pods");
        anyhow::ensure!(late_asker.allowed().await == Some(false), "allowed before");
        ctx.bind(PHASE, &late, &role, &late).await?;
        let acked = Instant::now();
        let granted = until(&mut late_asker, true, acked, Duration::from_millis(2)).await?;
        after_restart.push(format!("{:.1} ms", ms(granted)));
    }
    println!(
        "bindings created after the watches resumed, allowed after: {}",
        after_restart.join(", ")
    );
    proxy.stop().await;
    Ok(())
}

/// Runs `make(i)` for i in 0..count, `concurrency` at a time; how long it took.
async fn create_all<F, Fut>(
    count: usize,
    concurrency: usize,
    what: &str,
    make: F,
) -> anyhow::Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), kube::Error>> + Send + 'static,
{
    let start = Instant::now();
    let gate = Arc::new(Semaphore::new(concurrency));
    let mut tasks = JoinSet::new();
    for i in 0..count {
        let permit = Arc::clone(&gate).acquire_owned().await?;
        let fut = make(i);
        tasks.spawn(async move {
            let outcome = fut.await;
            drop(permit);
            outcome
        });
        while let Some(done) = tasks.try_join_next() {
            done??;
        }
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "created {count} {what} in {secs:.1} s ({:.0}/s)",
        count as f64 / secs
    );
    Ok(())
}

/// Memory with a large RBAC set: the objects created first, then a proxy with
/// `--pod-scoped-authz` (all four kinds watched) started; its RSS before and after the first
/// sync, and how long the sync took.
async fn scale(ctx: &Ctx) -> anyhow::Result<()> {
    const PHASE: &str = "scale";
    let cli = &ctx.cli;
    println!(
        "\n== scale: {} ClusterRoles, {} ClusterRoleBindings, {} RoleBindings in {} namespaces, --pod-scoped-authz",
        cli.cluster_roles, cli.cluster_role_bindings, cli.role_bindings, cli.namespaces
    );
    let owner = ctx.owner(PHASE);
    let c = cli.concurrency;
    let ns_name = |i: usize| ctx.name(&format!("ns-{i}"));
    let role_name = |i: usize| ctx.name(&format!("scale-role-{i}"));
    {
        let api: Api<Namespace> = Api::all(ctx.kube.clone());
        let owner = owner.clone();
        create_all(cli.namespaces, c, "namespaces", |i| {
            let api = api.clone();
            let ns = Namespace {
                metadata: meta(&ns_name(i), &owner, &[]),
                ..Namespace::default()
            };
            async move { api.create(&PostParams::default(), &ns).await.map(drop) }
        })
        .await?;
    }
    {
        let api: Api<ClusterRole> = Api::all(ctx.kube.clone());
        create_all(cli.cluster_roles, c, "ClusterRoles", |i| {
            let api = api.clone();
            let rules = match i % 4 {
                0 => vec![core_rule(&["nodes/proxy"], &["get", "create"])],
                1 => vec![core_rule(&["nodes/stats", "nodes/metrics"], &["get"])],
                _ => vec![core_rule(&["configmaps"], &["get", "list", "watch"])],
            };
            let role = cluster_role(&role_name(i), &owner, &[], rules);
            async move { api.create(&PostParams::default(), &role).await.map(drop) }
        })
        .await?;
    }
    {
        let api: Api<ClusterRoleBinding> = Api::all(ctx.kube.clone());
        create_all(cli.cluster_role_bindings, c, "ClusterRoleBindings", |i| {
            let api = api.clone();
            let binding = cluster_role_binding(
                &ctx.name(&format!("scale-crb-{i}")),
                &owner,
                &role_name(i % cli.cluster_roles.max(1)),
                vec![user_subject(&ctx.name(&format!("scale-user-{i}")))],
            );
            async move { api.create(&PostParams::default(), &binding).await.map(drop) }
        })
        .await?;
    }
    {
        let kube = ctx.kube.clone();
        create_all(cli.role_bindings, c, "RoleBindings", |i| {
            let ns = ns_name(i % cli.namespaces.max(1));
            let api: Api<RoleBinding> = Api::namespaced(kube.clone(), &ns);
            let binding = RoleBinding {
                metadata: meta(&ctx.name(&format!("scale-rb-{i}")), &owner, &[]),
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".to_owned()),
                    kind: "ClusterRole".to_owned(),
                    name: role_name(i % cli.cluster_roles.max(1)),
                },
                subjects: Some(vec![user_subject(&ctx.name(&format!("scale-ns-user-{i}")))]),
            };
            async move { api.create(&PostParams::default(), &binding).await.map(drop) }
        })
        .await?;
    }

    let kinds = [
        "clusterroles",
        "clusterrolebindings",
        "roles",
        "rolebindings",
    ];
    let spawned = Instant::now();
    let proxy = ctx.proxy("scale", &["--pod-scoped-authz"]).await;
    let pid = proxy.process.pid();
    let serving = spawned.elapsed();
    let at_serving = support::procfs::usage(pid).rss_kib;
    let lists_at_serving = proxy
        .metric("kubelet_auth_proxy_rbac_lists_total", &[])
        .await;
    let mut peak = at_serving;
    let start = Instant::now();
    loop {
        peak = peak.max(support::procfs::usage(pid).rss_kib);
        if proxy.synced(&kinds).await {
            break;
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(300),
            "not synced in 300 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let synced_after = spawned.elapsed();
    let just_synced = support::procfs::usage(pid).rss_kib;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let settled = support::procfs::usage(pid).rss_kib;
    let text = proxy.metrics().await;
    println!(
        "proxy serving {:.2} s after spawn, RSS then {} KiB (complete lists by then: {lists_at_serving})",
        serving.as_secs_f64(),
        at_serving
    );
    println!(
        "first sync complete (rbac_synced 1 for all four kinds) {:.2} s after spawn; RSS just after \
         {just_synced} KiB, 5 s later {settled} KiB, peak seen while syncing {peak} KiB",
        synced_after.as_secs_f64()
    );
    for kind in kinds {
        println!(
            "  rbac_objects{{kind={kind}}} = {}",
            support::metrics::total(&text, "kubelet_auth_proxy_rbac_objects", &[("kind", kind)])
        );
    }
    // A decision at that size: a bound user allowed, an unbound one refused.
    let mut bound = Asker::new(proxy.client(&ctx.name("scale-user-0")), "GET", "/pods");
    let mut unbound = Asker::new(proxy.client(&ctx.name("scale-nobody")), "GET", "/pods");
    println!(
        "scale-user-0 (bound to a nodes/proxy role): {:?}; an unbound user: {:?}",
        bound.ask().await,
        unbound.ask().await
    );
    println!("RSS of a proxy with no RBAC mode, for comparison:");
    let plain = ProcessSpec::new("plain").prepare().await;
    let plain_process = plain.start_from(&cli.proxy_binary, "plain", &[]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!(
        "  AlwaysAllow proxy: {} KiB",
        support::procfs::usage(plain_process.pid()).rss_kib
    );
    drop(plain_process);
    proxy.stop().await;
    Ok(())
}

//! `bench_helper fleet-live`: issue 19's five situations rerun with real proxy processes on
//! loopback, against the stand-in API server, which logs every TokenReview and
//! SubjectAccessReview call (arrival, answer, status). The fleet simulation (`examples/fleet_sim`)
//! models thousands of nodes on a virtual clock; this checks the same rules in the real binary,
//! with its real clocks, sockets and retries, at the scale one machine holds. It prints a
//! Markdown table: what each situation measured, the issue's figure from before, the target, and
//! whether it was met. `docs/FLEET.md` ("Measured with real processes") shows a run.

mod figures;
mod node;
mod scrape;
mod situations;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use kubelet_auth_proxy::tools::demo::kubelet::StandInKubelet;

use crate::support::apiserver::{ApiServer, Fault, Flavour, Target, TokenUser, Verdict};
use crate::support::pki::{Authority, CertSpec};

use node::{ProxyLaunch, WorkDir};
use scrape::Dialer;

/// Options of `bench_helper fleet-live`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The kubelet-auth-proxy binary to run. Default: the one built next to this helper
    /// (`<target>/<profile>/kubelet-auth-proxy`).
    #[arg(long)]
    proxy: Option<PathBuf>,
    /// Which situations to run (1 steady, 2 Retry-After, 3 one new token under 429s, 4 twenty
    /// proxies started at once, 5 one hot key with slow reviews).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5")]
    situations: Vec<u8>,
    /// Token cache TTL of every proxy, in milliseconds (the issue's runs: 3 s).
    #[arg(long, default_value_t = 3000)]
    token_ttl_ms: u64,
    /// Allowed-decision cache TTL of every proxy, in milliseconds (the issue's runs: 4 s).
    #[arg(long, default_value_t = 4000)]
    authorized_ttl_ms: u64,
    /// Keep the work directory (certificates, kubeconfigs, the proxies' logs).
    #[arg(long)]
    keep: bool,
}

/// What one situation found, for one row of the table.
pub struct Outcome {
    /// The situation's number in the issue's table.
    pub number: u8,
    /// The situation, in a few words.
    pub situation: &'static str,
    /// What was measured in this run.
    pub measured: String,
    /// The issue's figure from before the change.
    pub before: &'static str,
    /// What must hold.
    pub target: String,
    /// Whether it held.
    pub met: bool,
}

/// What every situation shares: the work directory, the certificates, the stand-in kubelet, the
/// client's dialer and the proxies' settings. A situation starts its own stand-in API server and
/// its own proxies, so its call log and the proxies' caches and hold-offs start empty.
pub struct Stage {
    dir: WorkDir,
    binary: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    kubelet: StandInKubelet,
    dialer: Arc<Dialer>,
    /// The token cache TTL.
    pub token_ttl: Duration,
    /// The allowed-decision cache TTL.
    pub authorized_ttl: Duration,
}

impl Stage {
    async fn new(args: &Args) -> anyhow::Result<Stage> {
        let binary = match &args.proxy {
            Some(path) => path.clone(),
            None => default_binary()?,
        };
        anyhow::ensure!(
            binary.is_file(),
            "no proxy binary at {}: build it (cargo build --bin kubelet-auth-proxy) or pass --proxy",
            binary.display()
        );
        anyhow::ensure!(
            args.token_ttl_ms > 0 && args.authorized_ttl_ms > 0,
            "the TTLs must be positive"
        );
        let dir = WorkDir::create(args.keep)?;
        let ca = Authority::root("kubelet-auth-proxy fleet-live CA");
        let serving = ca.issue(&CertSpec::server());
        let cert = dir.write("proxy.crt", serving.chain_pem())?;
        let key = dir.write("proxy.key", serving.key_pem())?;
        let kubelet = StandInKubelet::start(None)
            .await
            .context("starting the stand-in kubelet")?;
        let dialer = Arc::new(Dialer::new(ca.cert())?);
        Ok(Stage {
            dir,
            binary,
            cert,
            key,
            kubelet,
            dialer,
            token_ttl: Duration::from_millis(args.token_ttl_ms),
            authorized_ttl: Duration::from_millis(args.authorized_ttl_ms),
        })
    }

    /// A stand-in API server that knows every token (as a user of the same name), allows every
    /// access, and answers each review after `delay`.
    pub async fn api_server(&self, delay: Duration) -> ApiServer {
        let api = ApiServer::start().await;
        api.set_token_rule(|token| Ok(TokenUser::new(&format!("user-{token}"))));
        api.set_rules(|_| Verdict::allow());
        answer_normally(&api, delay);
        api
    }

    /// Starts `count` proxies against `api`, named `<label>-<i>`.
    pub async fn proxies(
        &self,
        api: &ApiServer,
        label: &str,
        count: usize,
    ) -> anyhow::Result<Vec<node::Proxy>> {
        let kubeconfig = api.kubeconfig(Flavour::ClientCertificate);
        let upstream = self
            .kubelet
            .addr()
            .context("the stand-in kubelet has no TCP address")?;
        let launch = ProxyLaunch {
            binary: &self.binary,
            upstream,
            cert: &self.cert,
            key: &self.key,
            kubeconfig: &kubeconfig,
            token_ttl: self.token_ttl,
            authorized_ttl: self.authorized_ttl,
        };
        let mut proxies = Vec::with_capacity(count);
        for i in 0..count {
            proxies.push(node::Proxy::start(&launch, &self.dir, &format!("{label}-{i}")).await?);
        }
        Ok(proxies)
    }

    /// The clients' dialer.
    pub fn dialer(&self) -> &Arc<Dialer> {
        &self.dialer
    }
}

/// From now on every review is answered normally, after `delay`.
pub fn answer_normally(api: &ApiServer, delay: Duration) {
    api.clear_faults();
    api.inject(Target::Both, Fault::Slow(delay), usize::MAX);
}

/// From now on every review is answered 429 with `Retry-After: <seconds>`.
pub fn answer_too_many_requests(api: &ApiServer, seconds: u32) {
    api.clear_faults();
    api.inject(
        Target::Both,
        Fault::TooManyRequests {
            retry_after_seconds: seconds,
        },
        usize::MAX,
    );
}

/// The proxy built next to this helper: `<target>/<profile>/examples/bench_helper` →
/// `<target>/<profile>/kubelet-auth-proxy`.
fn default_binary() -> anyhow::Result<PathBuf> {
    let helper = std::env::current_exe().context("locating bench_helper itself")?;
    let profile_dir = helper
        .parent()
        .and_then(Path::parent)
        .context("bench_helper is not in <target>/<profile>/examples")?;
    Ok(profile_dir.join("kubelet-auth-proxy"))
}

/// Runs the situations asked for and prints the table. A situation that cannot be run (a proxy
/// that does not start, say) gets a row saying why, the others still run, and the command fails
/// at the end. SIGINT or SIGTERM stops the run: what it started is dropped, so every proxy
/// process is killed.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("listening for SIGINT")?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    tokio::select! {
        result = run_situations(&args) => result,
        _ = interrupt.recv() => anyhow::bail!("interrupted (SIGINT); every proxy was stopped"),
        _ = terminate.recv() => anyhow::bail!("terminated (SIGTERM); every proxy was stopped"),
    }
}

async fn run_situations(args: &Args) -> anyhow::Result<()> {
    if let Some(other) = args.situations.iter().find(|n| !(1..=5).contains(*n)) {
        anyhow::bail!("no situation {other}: the situations are 1 to 5");
    }
    let stage = Stage::new(args).await?;
    eprintln!(
        "fleet-live: proxy {}; token TTL {:?}, authorized TTL {:?}",
        stage.binary.display(),
        stage.token_ttl,
        stage.authorized_ttl
    );
    let mut outcomes = Vec::new();
    let mut failed = Vec::new();
    for &number in &args.situations {
        eprintln!("fleet-live: situation {number}");
        let result = match number {
            1 => situations::steady(&stage).await,
            2 => situations::retry_after(&stage).await,
            3 => situations::one_new_token(&stage).await,
            4 => situations::started_together(&stage).await,
            _ => situations::hot_key(&stage).await,
        };
        let outcome = result.unwrap_or_else(|e| {
            eprintln!("fleet-live: situation {number} could not be run: {e:#}");
            failed.push(number);
            Outcome::not_run(number, &e)
        });
        eprintln!("fleet-live: {}", outcome.measured);
        outcomes.push(outcome);
    }
    println!("{}", table(&outcomes));
    anyhow::ensure!(
        failed.is_empty(),
        "situations {failed:?} could not be run (see their rows)"
    );
    Ok(())
}

impl Outcome {
    /// The row of a situation that could not be run.
    fn not_run(number: u8, error: &anyhow::Error) -> Outcome {
        Outcome {
            number,
            situation: "(could not be run)",
            measured: format!("error: {error:#}")
                .replace('|', "/")
                .replace('\n', " "),
            before: "",
            target: String::new(),
            met: false,
        }
    }
}

/// The Markdown table of the outcomes.
fn table(outcomes: &[Outcome]) -> String {
    let mut text = String::from(
        "| # | situation | measured now | before (issue 19) | target | met |\n|---|---|---|---|---|---|\n",
    );
    for o in outcomes {
        text.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            o.number,
            o.situation,
            o.measured,
            o.before,
            o.target,
            if o.met { "met" } else { "**not met**" }
        ));
    }
    text
}

//! The real binary, run as an operator runs it: as a server that is stopped with SIGTERM, or as a
//! command (`check-config`) that exits. Output goes to files, so a chatty process never blocks on
//! a full pipe; every wait is bounded. [`ProcessSpec`] writes what a server needs (certificates,
//! a configuration file, a stand-in kubelet), so a scenario states only what differs.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use kubelet_auth_proxy::tools::demo::kubelet::StandInKubelet;

use super::apiserver::{ApiServer, Flavour};
use super::client::{ANY_TLS, Client, Identity};
use super::harness::NODE_NAME;
use super::pki::{Authority, CertSpec, Issued};
use super::{STEP_TIMEOUT, TempDir, within};

/// The binary under test. Cargo names it only to integration tests; the benchmark helper, which
/// compiles this support code too but never runs the binary, falls back to the bare name.
pub const BINARY: &str = match option_env!("CARGO_BIN_EXE_kubelet-auth-proxy") {
    Some(path) => path,
    None => "kubelet-auth-proxy",
};
/// How often a child's state and output are looked at.
const POLL: Duration = Duration::from_millis(20);

/// What a finished run printed and how it ended.
pub struct Finished {
    /// The exit status.
    pub status: ExitStatus,
    /// Everything written to stdout.
    pub stdout: String,
    /// Everything written to stderr.
    pub stderr: String,
}

impl Finished {
    /// Asserts that the run exited with `code`, showing its stderr when it did not.
    #[track_caller]
    pub fn assert_code(&self, code: i32) {
        assert_eq!(self.status.code(), Some(code), "{}", self.stderr);
    }
}

/// Runs the binary with `args` to completion (killed, and the test failed, after
/// [`STEP_TIMEOUT`]).
pub async fn run(dir: &TempDir, name: &str, args: &[String]) -> Finished {
    run_within(dir, name, args, STEP_TIMEOUT).await
}

/// [`run`] with the environment variables `env` set.
pub async fn run_with_env(
    dir: &TempDir,
    name: &str,
    args: &[String],
    env: &[(&str, &OsStr)],
) -> Finished {
    let mut process = Spawned::spawn(BINARY.as_ref(), dir, name, args, env);
    let status = process.wait_within(STEP_TIMEOUT).await;
    Finished {
        status,
        stdout: process.stdout(),
        stderr: process.stderr(),
    }
}

/// [`run`] with a longer bound, for commands that legitimately take longer (the demo).
pub async fn run_within(dir: &TempDir, name: &str, args: &[String], limit: Duration) -> Finished {
    let mut process = Spawned::spawn(BINARY.as_ref(), dir, name, args, &[]);
    let status = process.wait_within(limit).await;
    Finished {
        status,
        stdout: process.stdout(),
        stderr: process.stderr(),
    }
}

/// A child process of the binary with its output files; killed if still running when dropped.
struct Spawned {
    child: Child,
    name: String,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Spawned {
    fn spawn(
        binary: &Path,
        dir: &TempDir,
        name: &str,
        args: &[String],
        env: &[(&str, &OsStr)],
    ) -> Spawned {
        let stdout = dir.path().join(format!("{name}.stdout"));
        let stderr = dir.path().join(format!("{name}.stderr"));
        let mut command = Command::new(binary);
        command
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap());
        for (key, value) in env {
            command.env(key, value);
        }
        Spawned {
            child: command.spawn().unwrap(),
            name: name.to_owned(),
            stdout,
            stderr,
        }
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits for the exit, at most [`STEP_TIMEOUT`]; kills the child and fails otherwise.
    async fn wait(&mut self) -> ExitStatus {
        self.wait_within(STEP_TIMEOUT).await
    }

    async fn wait_within(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{}: still running after {limit:?}; stderr: {}",
                    self.name,
                    self.stderr()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The binary serving: its addresses, read from its start-up log line.
pub struct ProxyProcess {
    spawned: Spawned,
    addr: SocketAddr,
    admin_addr: SocketAddr,
}

impl ProxyProcess {
    /// Starts the binary with `args` (plus `--log-format=json`, to read its addresses) and the
    /// environment variables `env`, and waits until it serves.
    pub async fn start(
        dir: &TempDir,
        name: &str,
        args: &[String],
        env: &[(&str, &OsStr)],
    ) -> ProxyProcess {
        ProxyProcess::start_logging(dir, name, args, env, "json").await
    }

    /// [`ProxyProcess::start`] of the executable at `binary` (a link to the binary under test,
    /// which a scenario can point elsewhere to stand for an upgraded file).
    pub async fn start_from(
        binary: &Path,
        dir: &TempDir,
        name: &str,
        args: &[String],
    ) -> ProxyProcess {
        let mut args = args.to_vec();
        args.push("--log-format=json".to_owned());
        let spawned = Spawned::spawn(binary, dir, name, &args, &[]);
        ProxyProcess::serving(spawned, name, "json").await
    }

    /// [`ProxyProcess::start`] with `--log-format=<format>` (`json` or `text`): the addresses
    /// are read from the start-up line in either format.
    pub async fn start_logging(
        dir: &TempDir,
        name: &str,
        args: &[String],
        env: &[(&str, &OsStr)],
        format: &str,
    ) -> ProxyProcess {
        let mut args = args.to_vec();
        args.push(format!("--log-format={format}"));
        let spawned = Spawned::spawn(BINARY.as_ref(), dir, name, &args, env);
        ProxyProcess::serving(spawned, name, format).await
    }

    /// Waits until `spawned` logs that it serves.
    async fn serving(mut spawned: Spawned, name: &str, format: &str) -> ProxyProcess {
        let deadline = Instant::now() + STEP_TIMEOUT;
        let (addr, admin_addr) = loop {
            let log = spawned.stderr();
            let found = match format {
                "json" => serving_addresses(&log),
                _ => serving_addresses_text(&log),
            };
            if let Some(addresses) = found {
                break addresses;
            }
            if let Some(status) = spawned.child.try_wait().unwrap() {
                panic!("{name} exited with {status}: {}", spawned.stderr());
            }
            if Instant::now() > deadline {
                panic!(
                    "{name}: not serving after {STEP_TIMEOUT:?}: {}",
                    spawned.stderr()
                );
            }
            tokio::time::sleep(POLL).await;
        };
        ProxyProcess {
            spawned,
            addr,
            admin_addr,
        }
    }

    /// The kubelet API address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The process id, for `/proc/<pid>`.
    pub fn pid(&self) -> u32 {
        self.spawned.child.id()
    }

    /// The admin address (`/healthz`, `/readyz`, `/metrics`).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// Sends SIGTERM, as systemd and the kubelet do to stop a service or a container.
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    /// Sends the signal named `name` (`TERM`, `USR2`).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.spawned.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{name} failed: {status}");
    }

    /// Waits (bounded) for the process to exit.
    pub async fn wait(&mut self) -> ExitStatus {
        self.spawned.wait().await
    }

    /// Everything written to stdout so far.
    pub fn stdout(&self) -> String {
        self.spawned.stdout()
    }

    /// Everything written to stderr so far.
    pub fn stderr(&self) -> String {
        self.spawned.stderr()
    }
}

/// The addresses in the "serving the kubelet API" line of a JSON log, once it is there.
fn serving_addresses(log: &str) -> Option<(SocketAddr, SocketAddr)> {
    log.lines().find_map(|line| {
        let entry: serde_json::Value = serde_json::from_str(line).ok()?;
        let fields = &entry["fields"];
        if fields["message"] != "serving the kubelet API" {
            return None;
        }
        Some((
            fields["addr"].as_str()?.parse().ok()?,
            fields["admin_addr"].as_str()?.parse().ok()?,
        ))
    })
}

/// The addresses in the "serving the kubelet API" line of a text log, once it is there.
fn serving_addresses_text(log: &str) -> Option<(SocketAddr, SocketAddr)> {
    let line = log
        .lines()
        .find(|line| line.contains("serving the kubelet API"))?;
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|word| word.strip_prefix(name))
            .and_then(|value| value.parse().ok())
    };
    Some((field("addr=")?, field("admin_addr=")?))
}

/// Writes `serving` (certificate chain and key) into `dir` as `tls.crt` and `tls.key` and returns
/// `--tls-cert-file` and `--tls-private-key-file` naming them.
pub fn serving_flags(dir: &TempDir, serving: &Issued) -> [String; 2] {
    [
        dir.flag("--tls-cert-file", "tls.crt", serving.chain_pem()),
        dir.flag("--tls-private-key-file", "tls.key", serving.key_pem()),
    ]
}

/// Writes what the binary needs to serve `upstream` (a serving certificate and key from `ca`, `ca`
/// as the client CA) and a ProxyConfiguration naming them by paths relative to it, with
/// `AlwaysAllow`, [`NODE_NAME`], loopback ports chosen by the kernel, and `extra` (YAML lines)
/// appended. Returns the configuration file's path, for `--config`.
pub fn proxy_config(dir: &TempDir, ca: &Authority, upstream: &str, extra: &str) -> String {
    let serving = ca.issue(&CertSpec::server());
    dir.write("serving.crt", serving.chain_pem());
    dir.write("serving.key", serving.key_pem());
    dir.write("ca.crt", ca.pem());
    let config = format!(
        "apiVersion: kubelet-auth-proxy/v1alpha1
kind: ProxyConfiguration
upstream: {upstream}
tlsCertFile: serving.crt
tlsPrivateKeyFile: serving.key
clientCaFile: ca.crt
authorizationMode: [AlwaysAllow]
nodeName: {NODE_NAME}
listenAddress: 127.0.0.1:0
adminListenAddress: 127.0.0.1:0
{extra}"
    );
    dir.write("proxy.yaml", config).display().to_string()
}

/// What the binary is started with, written for the scenario: a CA of its own, the files and
/// ProxyConfiguration of [`proxy_config`] and, unless [`ProcessSpec::upstream`] names another, a
/// stand-in kubelet over plain HTTP as the upstream. A scenario states only the configuration
/// lines that differ here, and the flags that differ at [`Deployment::start`].
pub struct ProcessSpec {
    label: String,
    upstream: Option<String>,
    config: String,
    /// Files written beside the configuration and named in it: (field, file name, contents).
    files: Vec<(String, String, String)>,
}

impl ProcessSpec {
    /// The defaults, with `label` naming the scenario's directory and CA.
    pub fn new(label: &str) -> ProcessSpec {
        ProcessSpec {
            label: label.to_owned(),
            upstream: None,
            config: String::new(),
            files: Vec::new(),
        }
    }

    /// Appends `yaml` (whole lines) to the ProxyConfiguration.
    pub fn config(mut self, yaml: &str) -> ProcessSpec {
        self.config.push_str(yaml);
        self
    }

    /// Names the kubeconfig of `api` (client-certificate flavour) as the configuration's
    /// `kubeconfig`: TokenReviews and SubjectAccessReviews go to the stand-in API server.
    pub fn apiserver(self, api: &ApiServer) -> ProcessSpec {
        let path = api.kubeconfig(Flavour::ClientCertificate);
        let line = format!("kubeconfig: {}\n", path.display());
        self.config(&line)
    }

    /// Writes `contents` to `name` in the scenario's directory and names the file's path as the
    /// configuration's `field` (`upstreamCaFile`, `upstreamClientKeyFile`, ...).
    pub fn config_file(
        mut self,
        field: &str,
        name: &str,
        contents: impl Into<String>,
    ) -> ProcessSpec {
        self.files
            .push((field.to_owned(), name.to_owned(), contents.into()));
        self
    }

    /// `url` as the upstream instead of a stand-in kubelet: a kubelet the scenario started itself,
    /// or an address nothing listens on for commands that never reach it (`explain`).
    pub fn upstream(mut self, url: &str) -> ProcessSpec {
        self.upstream = Some(url.to_owned());
        self
    }

    /// Starts the stand-in kubelet (unless an upstream was named) and writes the files; the
    /// binary is started from the [`Deployment`], as often as the scenario needs.
    pub async fn prepare(self) -> Deployment {
        let kubelet = match self.upstream {
            Some(_) => None,
            None => Some(
                within("starting the stand-in kubelet", StandInKubelet::start(None))
                    .await
                    .unwrap(),
            ),
        };
        let upstream = match (&self.upstream, &kubelet) {
            (Some(url), _) => url.clone(),
            (None, Some(kubelet)) => format!("http://{}", kubelet.addr().unwrap()),
            (None, None) => unreachable!("a kubelet is started when no upstream is named"),
        };
        let dir = TempDir::new(&self.label);
        let ca = Authority::root(&format!("{} CA", self.label));
        let mut extra = self.config;
        for (field, name, contents) in &self.files {
            let path = dir.write(name, contents);
            extra.push_str(&format!("{field}: {}\n", path.display()));
        }
        let config = proxy_config(&dir, &ca, &upstream, &extra);
        Deployment {
            dir,
            ca,
            config,
            _kubelet: kubelet,
        }
    }
}

/// The files of a [`ProcessSpec`] and the stand-in kubelet they point at, for as long as the
/// scenario holds it: start the binary from it once, or twice for an upgrade.
pub struct Deployment {
    /// Where the certificates, the configuration and every process's output live.
    pub dir: TempDir,
    /// The CA of the serving certificate and the client CA: clients trust it and present its
    /// certificates.
    pub ca: Authority,
    /// The ProxyConfiguration's path, for `--config`.
    pub config: String,
    _kubelet: Option<StandInKubelet>,
}

impl Deployment {
    /// `--config <file>` followed by `args`: on the command line a flag wins over the file.
    pub fn command_line(&self, args: &[String]) -> Vec<String> {
        let config = ["--config".to_owned(), self.config.clone()];
        config.into_iter().chain(args.iter().cloned()).collect()
    }

    /// Starts the binary as `name` with [`Deployment::command_line`] and waits until it serves.
    pub async fn start(&self, name: &str, args: &[String]) -> ProxyProcess {
        self.start_with_env(name, args, &[]).await
    }

    /// [`Deployment::start`] with the environment variables `env` set.
    pub async fn start_with_env(
        &self,
        name: &str,
        args: &[String],
        env: &[(&str, &OsStr)],
    ) -> ProxyProcess {
        ProxyProcess::start(&self.dir, name, &self.command_line(args), env).await
    }

    /// [`Deployment::start`] of the executable at `binary` (see [`ProxyProcess::start_from`]).
    pub async fn start_from(&self, binary: &Path, name: &str, args: &[String]) -> ProxyProcess {
        ProxyProcess::start_from(binary, &self.dir, name, &self.command_line(args)).await
    }

    /// A client of the proxy at `addr` presenting a certificate of [`Deployment::ca`] for `name`
    /// and offering `alpn`.
    pub fn client(&self, addr: SocketAddr, name: &str, alpn: &[&[u8]]) -> Client {
        let cert = self.ca.issue(&CertSpec::client(name));
        Client::configured(self.ca.cert(), addr, Identity::of(&cert), alpn, ANY_TLS)
    }

    /// A client of the proxy at `addr` without a certificate.
    pub fn anonymous(&self, addr: SocketAddr) -> Client {
        Client::new(self.ca.cert(), addr, Identity::None)
    }
}

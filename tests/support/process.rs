//! The real binary, run as an operator runs it: as a server that is stopped with SIGTERM, or as a
//! command (`check-config`) that exits. Output goes to files, so a chatty process never blocks on
//! a full pipe; every wait is bounded.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::harness::NODE_NAME;
use super::pki::{Authority, CertSpec};
use super::{STEP_TIMEOUT, TempDir};

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

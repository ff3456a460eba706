//! One node of the live fleet: a real `kubelet-auth-proxy` process, started from the binary the
//! operator names, with its output in files, in front of the in-process stand-in kubelet, and
//! killed when dropped, so no process outlives the run, whatever step failed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// How long a proxy may take to log that it serves (debug builds on a busy machine included).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a starting proxy's log is looked at.
const POLL: Duration = Duration::from_millis(20);

/// A directory of the run's own (certificates, kubeconfigs, proxy logs), removed when dropped
/// unless the run asked to keep it.
pub struct WorkDir {
    path: PathBuf,
    keep: bool,
}

impl WorkDir {
    /// Creates `<temp>/kap-fleet-live-<pid>`.
    pub fn create(keep: bool) -> anyhow::Result<WorkDir> {
        let path = std::env::temp_dir().join(format!("kap-fleet-live-{}", std::process::id()));
        std::fs::create_dir_all(&path)
            .with_context(|| format!("creating the work directory {}", path.display()))?;
        Ok(WorkDir { path, keep })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `contents` to `name` in the directory; returns its path.
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> anyhow::Result<PathBuf> {
        let path = self.path.join(name);
        std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("fleet-live: work directory kept: {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// What every proxy of a situation is started with.
pub struct ProxyLaunch<'a> {
    /// The binary.
    pub binary: &'a Path,
    /// The stand-in kubelet's address (plain HTTP).
    pub upstream: SocketAddr,
    /// Serving certificate chain and key files.
    pub cert: &'a Path,
    /// See [`ProxyLaunch::cert`].
    pub key: &'a Path,
    /// The stand-in API server's kubeconfig.
    pub kubeconfig: &'a Path,
    /// `--authentication-token-webhook-cache-ttl`.
    pub token_ttl: Duration,
    /// `--authorization-webhook-cache-authorized-ttl`.
    pub authorized_ttl: Duration,
}

/// A running proxy process; killed (and reaped) when dropped.
pub struct Proxy {
    child: Child,
    name: String,
    stderr: PathBuf,
    addr: SocketAddr,
}

impl Proxy {
    /// Starts the proxy as `name` (its log files are `<name>.stdout` / `<name>.stderr` in `dir`)
    /// and waits until it logs the address it serves on.
    pub async fn start(
        launch: &ProxyLaunch<'_>,
        dir: &WorkDir,
        name: &str,
    ) -> anyhow::Result<Proxy> {
        let stdout = dir.path().join(format!("{name}.stdout"));
        let stderr = dir.path().join(format!("{name}.stderr"));
        let file = |path: &Path| {
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))
        };
        let child = Command::new(launch.binary)
            .args(args(launch))
            .env_remove("RUST_LOG")
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(file(&stdout)?)
            .stderr(file(&stderr)?)
            .spawn()
            .with_context(|| format!("starting {} ({name})", launch.binary.display()))?;
        let mut proxy = Proxy {
            child,
            name: name.to_owned(),
            stderr,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        proxy.addr = proxy.wait_serving().await?;
        Ok(proxy)
    }

    /// The kubelet API address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    async fn wait_serving(&mut self) -> anyhow::Result<SocketAddr> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(addr) = serving_address(&self.log()) {
                return Ok(addr);
            }
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!("{} exited with {status}: {}", self.name, self.log());
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "{}: not serving after {START_TIMEOUT:?}: {}",
                    self.name,
                    self.log()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The proxy's command line: bearer tokens reviewed and every request authorized by the API
/// server (no client CA: the scrapers authenticate with tokens only), the given TTLs.
fn args(launch: &ProxyLaunch<'_>) -> Vec<String> {
    let go_duration = |d: Duration| format!("{}ms", d.as_millis());
    vec![
        format!("--upstream=http://{}", launch.upstream),
        format!("--tls-cert-file={}", launch.cert.display()),
        format!("--tls-private-key-file={}", launch.key.display()),
        "--listen-address=127.0.0.1:0".to_owned(),
        "--admin-listen-address=127.0.0.1:0".to_owned(),
        "--node-name=fleet-live-node".to_owned(),
        format!("--kubeconfig={}", launch.kubeconfig.display()),
        "--authentication-token-webhook".to_owned(),
        "--authorization-mode=Webhook".to_owned(),
        format!(
            "--authentication-token-webhook-cache-ttl={}",
            go_duration(launch.token_ttl)
        ),
        format!(
            "--authorization-webhook-cache-authorized-ttl={}",
            go_duration(launch.authorized_ttl)
        ),
        "--log-format=json".to_owned(),
    ]
}

/// The address in the JSON log's "serving the kubelet API" line, once it is there.
fn serving_address(log: &str) -> Option<SocketAddr> {
    log.lines().find_map(|line| {
        let entry: serde_json::Value = serde_json::from_str(line).ok()?;
        let fields = &entry["fields"];
        if fields["message"] != "serving the kubelet API" {
            return None;
        }
        fields["addr"].as_str()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serving_address_is_read_from_the_json_log() {
        let log = "{\"fields\":{\"message\":\"loading\"}}\nnot json\n\
                   {\"fields\":{\"message\":\"serving the kubelet API\",\"addr\":\"127.0.0.1:4321\",\"admin_addr\":\"127.0.0.1:1\"}}\n";
        assert_eq!(serving_address(log), Some(([127, 0, 0, 1], 4321).into()));
        assert_eq!(serving_address("{\"fields\":{}}"), None);
    }
}

//! The real binary as its own process in front of a stand-in kubelet (HTTPS) that can be stopped
//! and started again on the same port (through a [`Relay`]): for the scenarios that measure what
//! the proxy holds from outside (`/proc/<pid>`: descriptors, threads, memory), which an in-process
//! proxy sharing the test binary with other scenarios could not show.

use std::ffi::OsStr;
use std::sync::Arc;

use kubelet_auth_proxy::tools::demo::kubelet::StandInKubelet;
use rustls::ServerConfig;

use super::client::{Client, Identity, Reply, plain_get};
use super::harness::{NODE_NAME, kubelet_tls};
use super::metrics;
use super::pki::{Authority, CertSpec};
use super::process::{ProxyProcess, serving_flags};
use super::procfs::{self, Usage};
use super::relay::Relay;
use super::{TempDir, within};

/// The binary, the stand-in kubelet behind it, and their files.
pub struct Standalone {
    /// The CA of every certificate: the proxy's client CA and the kubelet's serving CA.
    pub ca: Authority,
    /// Where the certificates and the binary's output live, for as long as it runs.
    _dir: TempDir,
    process: ProxyProcess,
    serving_key_pem: String,
    kubelet: Option<StandInKubelet>,
    kubelet_tls: Arc<ServerConfig>,
    relay: Relay,
}

impl Standalone {
    /// Starts the stand-in kubelet and the binary with the harness's usual flags (serving
    /// certificate, client CA, `--upstream` the kubelet's fixed port, loopback ports) plus
    /// `args`, `--log-format=<format>`, and the environment `env`.
    pub async fn start(args: &[&str], env: &[(&str, &OsStr)], format: &str) -> Standalone {
        let dir = TempDir::new("standalone");
        let ca = Authority::root("kubelet-auth-proxy standalone CA");
        let kubelet_serving = ca.issue(&CertSpec::server().common_name("stand-in kubelet"));
        let kubelet_tls = kubelet_tls(&kubelet_serving, None);
        let kubelet = start_kubelet(&kubelet_tls).await;
        let relay = Relay::start(kubelet.addr().unwrap()).await;
        let serving = ca.issue(&CertSpec::server());
        let mut command_line = vec![
            format!("--upstream=https://{}", relay.addr()),
            dir.flag("--upstream-ca-file", "ca.crt", ca.pem()),
            dir.flag("--client-ca-file", "client-ca.crt", ca.pem()),
            "--listen-address=127.0.0.1:0".to_owned(),
            "--admin-listen-address=127.0.0.1:0".to_owned(),
            format!("--node-name={NODE_NAME}"),
        ];
        command_line.extend(serving_flags(&dir, &serving));
        command_line.extend(args.iter().map(|a| (*a).to_owned()));
        let process = ProxyProcess::start_logging(&dir, "proxy", &command_line, env, format).await;
        Standalone {
            ca,
            _dir: dir,
            process,
            serving_key_pem: serving.key_pem(),
            kubelet: Some(kubelet),
            kubelet_tls,
            relay,
        }
    }

    /// The binary.
    pub fn process(&self) -> &ProxyProcess {
        &self.process
    }

    /// The private key of the proxy's serving certificate, as PEM: a secret that must never be
    /// printed.
    pub fn serving_key_pem(&self) -> &str {
        &self.serving_key_pem
    }

    /// Stops the binary with SIGTERM and waits (bounded) for it to exit, so that everything it
    /// buffered (the audit log) is written.
    pub async fn stop(&mut self) -> std::process::ExitStatus {
        self.process.terminate();
        self.process.wait().await
    }

    /// Descriptors, threads and memory of the binary now.
    pub fn usage(&self) -> Usage {
        procfs::usage(self.process.pid())
    }

    /// A client presenting `identity`.
    pub fn client(&self, identity: Identity) -> Client {
        Client::new(self.ca.cert(), self.process.addr(), identity)
    }

    /// A client presenting `identity` offering only HTTP/1.1.
    pub fn http1_client(&self, identity: Identity) -> Client {
        Client::http1(self.ca.cert(), self.process.addr(), identity)
    }

    /// `GET path` on the admin listener.
    pub async fn admin_get(&self, path: &str) -> Reply {
        plain_get(self.process.admin_addr(), path).await
    }

    /// The sum of the samples of `metric` whose labels include all of `labels`.
    pub async fn metric(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        metrics::total(&self.admin_get("/metrics").await.text(), metric, labels)
    }

    /// Stops the stand-in kubelet: its port refuses connections, open ones are closed.
    pub async fn stop_kubelet(&mut self) {
        self.relay.stop().await;
        let kubelet = self.kubelet.take().expect("the kubelet is running");
        within("stopping the kubelet", kubelet.shutdown()).await;
    }

    /// Starts a new stand-in kubelet (same certificate) on the port the proxy was given.
    pub async fn restart_kubelet(&mut self) {
        let kubelet = start_kubelet(&self.kubelet_tls).await;
        self.relay.restart(kubelet.addr().unwrap()).await;
        self.kubelet = Some(kubelet);
    }
}

async fn start_kubelet(tls: &Arc<ServerConfig>) -> StandInKubelet {
    within(
        "starting the stand-in kubelet",
        StandInKubelet::start(Some(Arc::clone(tls))),
    )
    .await
    .unwrap()
}

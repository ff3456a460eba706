//! A fixed loopback port in front of a stand-in kubelet, so that a scenario can restart "the
//! kubelet" on the port the proxy was configured with: stopping the relay closes its listener and
//! every connection through it (new connections are refused, open ones end, as when the kubelet
//! process exits); restarting it listens on the same port again, relaying to a new stand-in. TLS
//! passes through untouched: the proxy still verifies the stand-in's certificate.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use super::within;

/// A running (or stopped) relay; stops when dropped.
pub struct Relay {
    addr: SocketAddr,
    running: Option<Running>,
}

/// The accept loop of a listening relay and its stop signal.
struct Running {
    stop: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl Relay {
    /// Listens on `127.0.0.1:<free port>`, relaying every connection to `target`.
    pub async fn start(target: SocketAddr) -> Relay {
        let listener = within(
            "binding the relay",
            TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)),
        )
        .await
        .unwrap();
        Relay {
            addr: listener.local_addr().unwrap(),
            running: Some(spawn(listener, target)),
        }
    }

    /// The address the proxy is given as its upstream.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops listening and closes every relayed connection; returns once they are all closed.
    pub async fn stop(&mut self) {
        let running = self.running.take().expect("the relay is running");
        running.stop.send_replace(true);
        within("stopping the relay", running.accept).await.unwrap();
    }

    /// Listens on the same address again, relaying to `target`.
    pub async fn restart(&mut self, target: SocketAddr) {
        assert!(self.running.is_none(), "the relay is running");
        let listener = within("rebinding the relay", TcpListener::bind(self.addr))
            .await
            .unwrap();
        self.running = Some(spawn(listener, target));
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(running) = &self.running {
            running.stop.send_replace(true);
        }
    }
}

fn spawn(listener: TcpListener, target: SocketAddr) -> Running {
    let (stop, mut stopped) = watch::channel(false);
    let accept = tokio::spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                _ = stopped.changed() => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                accepted = listener.accept() => {
                    if let Ok((inbound, _)) = accepted {
                        connections.spawn(relay(inbound, target));
                    }
                }
            }
        }
        drop(listener);
        // Aborting the tasks drops both sockets of every relayed connection.
        connections.shutdown().await;
    });
    Running { stop, accept }
}

async fn relay(mut inbound: TcpStream, target: SocketAddr) {
    if let Ok(mut outbound) = TcpStream::connect(target).await {
        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
    }
}

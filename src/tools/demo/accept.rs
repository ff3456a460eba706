//! The stand-ins' accept loop (the demo's kubelet and API server, and the test suite's): each
//! connection served on a task of its own until the stand-in is told to stop, then aborted and
//! waited for, so a stopped stand-in holds no socket open.

use std::future::Future;
use std::io;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// A listening socket, as the accept loop sees it.
pub trait Listen {
    /// What one accepted connection is.
    type Connection;
    /// The next connection.
    fn next(&self) -> impl Future<Output = io::Result<Self::Connection>> + Send;
}

impl Listen for TcpListener {
    type Connection = TcpStream;

    async fn next(&self) -> io::Result<TcpStream> {
        Ok(self.accept().await?.0)
    }
}

/// Accepts on `listener` until `stop` changes, serving each connection with `serve` on a task of
/// its own; a failed accept (too many open files) backs off briefly. Then closes `listener`,
/// aborts the connections' tasks, and returns once they are gone.
pub async fn until_stopped<L: Listen, F>(
    listener: L,
    mut stop: watch::Receiver<bool>,
    serve: impl Fn(L::Connection) -> F,
) where
    F: Future<Output = ()> + Send + 'static,
{
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.next() => match accepted {
                Ok(connection) => {
                    connections.spawn(serve(connection));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
        }
    }
    drop(listener);
    connections.shutdown().await;
}

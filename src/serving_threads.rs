//! The threads that serve client connections (`--serving-threads`). Each runs a single-threaded
//! Tokio runtime of its own and accepts on its own copy (`dup`) of every listening socket, so a
//! connection, the requests on it and the kubelet connections they use are all handled by the
//! thread that accepted it: no request is handed from one thread to another, no task is woken on
//! another thread, and each thread's pool of kubelet connections is used by that thread alone.
//! This is nginx's model (one event loop per worker, one worker per core); with one shared
//! work-stealing runtime a request, its client connection and its pooled upstream connection could
//! each wake on a different thread, which cost context switches and cross-thread wake-ups per
//! request (docs/PERFORMANCE.md has the figures).
//!
//! The kernel signals a new connection to every thread waiting on the socket and the first to
//! call `accept` takes it, so a thread busy with its own connections leaves new ones to an idle
//! one. A connection never moves afterwards: a thread kept busy by some connections delays the
//! others it serves, as in nginx. What is not per connection stays on the main runtime: the admin
//! listener, the file watcher, signals, and the API server clients' connections.

use std::future::Future;
use std::net::TcpListener;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// The most serving threads chosen by default, whatever the CPU count: a node proxy rarely needs
/// more, and every thread keeps its own kubelet connections.
pub const MAX_DEFAULT: usize = 8;

/// The number of serving threads, and a warning about the choice when it deserves one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// At least one.
    pub count: usize,
    /// Set when more threads were asked for than the process has CPUs.
    pub warning: Option<String>,
}

/// Resolves `--serving-threads`: 0 is one per CPU the process may run on (its affinity mask and
/// cgroup CPU quota, as [`std::thread::available_parallelism`] reads them), at most
/// [`MAX_DEFAULT`].
pub fn resolve(flag: u16) -> Resolved {
    resolve_for(
        flag,
        std::thread::available_parallelism().map_or(1, usize::from),
    )
}

fn resolve_for(flag: u16, cpus: usize) -> Resolved {
    let cpus = cpus.max(1);
    match usize::from(flag) {
        0 => Resolved {
            count: cpus.min(MAX_DEFAULT),
            warning: None,
        },
        count if count > cpus => Resolved {
            count,
            warning: Some(format!(
                "{count} serving threads on {cpus} CPU(s) (affinity and cgroup quota): threads beyond the CPUs only add context switches and kubelet connections; leave it at 0 to use one per CPU"
            )),
        },
        count => Resolved {
            count,
            warning: None,
        },
    }
}

/// The running serving threads. Dropped, they stop: each drops its runtime with every connection
/// it still serves.
#[derive(Debug)]
pub struct ServingThreads {
    /// Resolves (or fails, if the thread died) when a thread's serving future has returned.
    accepting: Vec<oneshot::Receiver<()>>,
    /// Cancelled to make every thread drop its runtime and end.
    release: CancellationToken,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl ServingThreads {
    /// Starts `count` threads named `serve-N`, each with a current-thread runtime running
    /// `serve(N, listeners)`, where `listeners` are its own copies of `listeners` (still to be
    /// registered with its runtime: `tokio::net::TcpListener::from_std` inside the future). The
    /// future should return once the thread stops accepting; its runtime keeps running what it
    /// spawned until [`ServingThreads::stop`].
    pub fn start<S, F>(
        count: usize,
        listeners: &[TcpListener],
        serve: S,
    ) -> std::io::Result<ServingThreads>
    where
        S: Fn(usize, Vec<TcpListener>) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let mut started = ServingThreads {
            accepting: Vec::with_capacity(count),
            release: CancellationToken::new(),
            threads: Vec::with_capacity(count),
        };
        // On an error, `started` is dropped on the way out, which stops the threads already
        // running.
        for index in 0..count.max(1) {
            let copies = listeners
                .iter()
                .map(TcpListener::try_clone)
                .collect::<std::io::Result<Vec<_>>>()?;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let serving = serve(index, copies);
            let (accepting, ended) = oneshot::channel();
            let release = started.release.clone();
            let thread = std::thread::Builder::new()
                .name(format!("serve-{index}"))
                .spawn(move || {
                    runtime.block_on(async move {
                        tokio::select! {
                            () = serving => {
                                let _ = accepting.send(());
                                release.cancelled().await;
                            }
                            () = release.cancelled() => {}
                        }
                    });
                    // Dropping the runtime here drops whatever it still runs.
                    drop(runtime);
                })?;
            started.accepting.push(ended);
            started.threads.push(thread);
        }
        Ok(started)
    }

    /// The number of threads.
    pub fn count(&self) -> usize {
        self.threads.len()
    }

    /// Resolves once every thread's serving future has returned (or its thread died).
    pub async fn accepting_ended(&mut self) {
        for ended in &mut self.accepting {
            let _ = ended.await;
        }
    }

    /// Ends every thread, dropping what its runtime still runs, and waits for them to exit.
    pub async fn stop(mut self) {
        self.release.cancel();
        let threads = std::mem::take(&mut self.threads);
        let joined = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        });
        let _ = joined.await;
    }
}

impl Drop for ServingThreads {
    fn drop(&mut self) {
        self.release.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_means_one_per_cpu_up_to_the_default_maximum() {
        assert_eq!(resolve_for(0, 2).count, 2);
        assert_eq!(resolve_for(0, 1).count, 1);
        assert_eq!(resolve_for(0, 96).count, MAX_DEFAULT);
        assert_eq!(resolve_for(0, 96).warning, None);
    }

    #[test]
    fn an_explicit_count_is_kept_and_more_than_the_cpus_is_warned_about() {
        assert_eq!(
            resolve_for(3, 4),
            Resolved {
                count: 3,
                warning: None
            }
        );
        assert_eq!(resolve_for(16, 96).count, 16);
        let over = resolve_for(4, 2);
        assert_eq!(over.count, 4);
        assert!(
            over.warning
                .is_some_and(|w| w.contains("4 serving threads on 2 CPU(s)"))
        );
    }

    #[tokio::test]
    async fn each_thread_accepts_on_its_own_copy_and_stopping_ends_them_all() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (seen, mut names) = tokio::sync::mpsc::unbounded_channel();
        let mut threads = ServingThreads::start(2, &[listener], |index, listeners| {
            let seen = seen.clone();
            async move {
                let listener = tokio::net::TcpListener::from_std(
                    listeners
                        .into_iter()
                        .next()
                        .expect("one listener per thread"),
                )
                .unwrap();
                let _ = listener.accept().await;
                let name = std::thread::current().name().map(str::to_owned);
                let _ = seen.send((index, name));
            }
        })
        .unwrap();
        assert_eq!(threads.count(), 2);
        // Two connections: each thread's accept takes one, whichever is woken first.
        let _a = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _b = tokio::net::TcpStream::connect(addr).await.unwrap();
        threads.accepting_ended().await;
        let mut got = vec![names.recv().await.unwrap(), names.recv().await.unwrap()];
        got.sort();
        assert_eq!(
            got,
            [
                (0, Some("serve-0".to_owned())),
                (1, Some("serve-1".to_owned()))
            ]
        );
        threads.stop().await;
    }
}

//! The threads that serve client connections (`--serving-threads`). Each runs a single-threaded
//! Tokio runtime of its own, so a connection, the requests on it and the kubelet connections they
//! use are all handled by one thread: no request is handed from one thread to another, no task
//! is woken on another thread, and each thread's pool of kubelet connections is used by that
//! thread alone. This is nginx's model (one event loop per worker, one worker per core); with one
//! shared work-stealing runtime a request, its client connection and its pooled upstream
//! connection could each wake on a different thread, which cost context switches and cross-thread
//! wake-ups per request (docs/PERFORMANCE.md has the figures).
//!
//! The listening sockets stay on the main runtime, whose accept loops hand each new connection to
//! the thread serving the fewest ([`Dispatcher`]): one hop between threads per connection, none
//! per request. Letting every thread accept on its own copy of the socket was tried first: the
//! thread that woke first drained the whole queue, and a burst of 64 connections all landed on
//! one thread while the other idled. A connection never moves afterwards: a thread kept busy by
//! some connections delays the others it serves, as in nginx. What is not per connection stays on
//! the main runtime: the admin listener, the file watcher, signals, and the API server clients'
//! connections.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{mpsc, oneshot};
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

/// A place in one thread's count of the connections it serves; dropping it gives the place back.
/// The serving code keeps it as long as the connection lives.
#[derive(Debug)]
pub struct Load(Arc<AtomicUsize>);

impl Drop for Load {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Hands connections (any `T`) to the serving thread with the fewest open. Cheap to clone; once
/// every clone is dropped, the threads' receivers end.
#[derive(Debug)]
pub struct Dispatcher<T> {
    lanes: Arc<[Lane<T>]>,
}

impl<T> Clone for Dispatcher<T> {
    fn clone(&self) -> Self {
        Dispatcher {
            lanes: Arc::clone(&self.lanes),
        }
    }
}

#[derive(Debug)]
struct Lane<T> {
    sender: mpsc::UnboundedSender<(T, Load)>,
    open: Arc<AtomicUsize>,
}

impl<T> Dispatcher<T> {
    /// Sends `item` to the thread serving the fewest connections (the lowest-numbered among
    /// equals), counted as one more there until the [`Load`] that comes with it is dropped.
    /// Gives `item` back only if no thread is left to take it. The channels are unbounded: what
    /// is dispatched is bounded by the caller (the connection slots of `--max-connections`).
    pub fn dispatch(&self, mut item: T) -> Result<(), T> {
        let mut order: Vec<(usize, &Lane<T>)> = self
            .lanes
            .iter()
            .map(|lane| (lane.open.load(Ordering::Relaxed), lane))
            .collect();
        order.sort_by_key(|(open, _)| *open);
        for (_, lane) in order {
            lane.open.fetch_add(1, Ordering::Relaxed);
            match lane.sender.send((item, Load(Arc::clone(&lane.open)))) {
                Ok(()) => return Ok(()),
                // That thread is gone (its load was given back with the message); try the next.
                Err(mpsc::error::SendError((back, _load))) => item = back,
            }
        }
        Err(item)
    }
}

/// The running serving threads. Dropped, they stop: each drops its runtime with every connection
/// it still serves.
#[derive(Debug)]
pub struct ServingThreads {
    /// Resolves (or fails, if the thread died) when a thread's serving future has returned.
    serving: Vec<oneshot::Receiver<()>>,
    /// Cancelled to make every thread drop its runtime and end.
    release: CancellationToken,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl ServingThreads {
    /// Starts `count` threads named `serve-N` (at least one), each with a current-thread runtime
    /// running `serve(N, receiver)`, where `receiver` yields what the returned [`Dispatcher`]
    /// sends that thread. The future should return once its receiver ends (every dispatcher
    /// dropped); the thread's runtime keeps running what it spawned until
    /// [`ServingThreads::stop`].
    pub fn start<T, S, F>(
        count: usize,
        serve: S,
    ) -> std::io::Result<(ServingThreads, Dispatcher<T>)>
    where
        T: Send + 'static,
        S: Fn(usize, mpsc::UnboundedReceiver<(T, Load)>) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let count = count.max(1);
        let mut started = ServingThreads {
            serving: Vec::with_capacity(count),
            release: CancellationToken::new(),
            threads: Vec::with_capacity(count),
        };
        let mut lanes = Vec::with_capacity(count);
        // On an error, `started` is dropped on the way out, which stops the threads already
        // running.
        for index in 0..count {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (sender, receiver) = mpsc::unbounded_channel();
            let serving = serve(index, receiver);
            let (ended, serving_ended) = oneshot::channel();
            let release = started.release.clone();
            let thread = std::thread::Builder::new()
                .name(format!("serve-{index}"))
                .spawn(move || {
                    runtime.block_on(async move {
                        tokio::select! {
                            () = serving => {
                                let _ = ended.send(());
                                release.cancelled().await;
                            }
                            () = release.cancelled() => {}
                        }
                    });
                    // Dropping the runtime here drops whatever it still runs.
                    drop(runtime);
                })?;
            started.serving.push(serving_ended);
            started.threads.push(thread);
            lanes.push(Lane {
                sender,
                open: Arc::new(AtomicUsize::new(0)),
            });
        }
        let dispatcher = Dispatcher {
            lanes: lanes.into(),
        };
        Ok((started, dispatcher))
    }

    /// The number of threads.
    pub fn count(&self) -> usize {
        self.threads.len()
    }

    /// Resolves once every thread's serving future has returned (or its thread died).
    pub async fn serving_ended(&mut self) {
        for ended in &mut self.serving {
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

    /// Items go to the thread with the fewest held, each served on its own named thread; a
    /// place given back makes that thread the next choice; the threads end with the dispatcher.
    #[tokio::test]
    async fn each_item_goes_to_the_least_loaded_thread_and_is_served_there() {
        let (seen, mut served) = mpsc::unbounded_channel();
        let (mut threads, dispatcher) = ServingThreads::start(3, |index, mut receiver| {
            let seen = seen.clone();
            async move {
                while let Some((item, load)) = receiver.recv().await {
                    let name = std::thread::current().name().map(str::to_owned);
                    let _ = seen.send((item, index, name, load));
                }
            }
        })
        .unwrap();
        assert_eq!(threads.count(), 3);
        let mut held = Vec::new();
        for item in 0..6 {
            dispatcher.dispatch(item).unwrap();
            held.push(served.recv().await.unwrap());
        }
        let lanes: Vec<usize> = held.iter().map(|(_, lane, _, _)| *lane).collect();
        assert_eq!(lanes, [0, 1, 2, 0, 1, 2]);
        assert!(
            held.iter()
                .all(|(_, lane, name, _)| *name == Some(format!("serve-{lane}")))
        );
        // Thread 1 gives back both its places: it serves the fewest now.
        held.retain(|(_, lane, _, _)| *lane != 1);
        dispatcher.dispatch(6).unwrap();
        assert_eq!(served.recv().await.unwrap().1, 1);
        drop(dispatcher);
        threads.serving_ended().await;
        threads.stop().await;
    }
}

//! Helpers shared by the end-to-end scenarios: certificates made on the fly ([`pki`]), a TLS HTTP
//! client that can present any chain with any key ([`client`]), and a harness that starts the
//! stand-in kubelet and the real proxy on loopback from a real command line ([`harness`]), and a
//! stand-in API server answering TokenReviews and SubjectAccessReviews ([`apiserver`]); the
//! refusals every scenario expects, worded once ([`answers`]). For the
//! operations scenarios: background traffic ([`load`]), the binary as a process ([`process`]),
//! Kubernetes-style volumes ([`volume`]) and `/metrics` parsing ([`metrics`]). For the failing
//! neighbours: the binary in front of a kubelet that restarts on its port ([`standalone`],
//! [`relay`]), what a process holds ([`procfs`]) and traffic that tallies answers ([`traffic`]).
//! A real kube-apiserver, when the environment names one, or one started for a scenario with its
//! own flags ([`real_apiserver`]); a stand-in OpenID Connect provider that mints the JWTs its
//! `--authentication-config` authenticators verify ([`issuer`]).

pub mod answers;
pub mod apiserver;
pub mod client;
pub mod harness;
pub mod issuer;
pub mod load;
pub mod metrics;
pub mod pki;
pub mod process;
pub mod procfs;
pub mod raw;
pub mod real_apiserver;
pub mod relay;
pub mod standalone;
pub mod streams;
pub mod traffic;
pub mod volume;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The longest any single step of a scenario may take: a bug fails the test, it never hangs it.
/// Generous, because the machine is shared; no scenario asserts anything about timing.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(20);

/// Awaits `future` for at most [`STEP_TIMEOUT`], panicking with `what` when it takes longer.
pub async fn within<F: Future>(what: &str, future: F) -> F::Output {
    match tokio::time::timeout(STEP_TIMEOUT, future).await {
        Ok(output) => output,
        Err(_) => panic!("timed out after {STEP_TIMEOUT:?}: {what}"),
    }
}

/// Asserts that `text` contains `part`, showing all of `text` when it does not.
#[track_caller]
pub fn assert_contains(text: &str, part: &str) {
    assert!(text.contains(part), "{part:?} not in:\n{text}");
}

/// How long a scenario waits for an effect that follows a change it made (a file reloaded, a
/// readiness change): the effect is polled for, never slept for.
pub const POLL_TIMEOUT: Duration = Duration::from_secs(10);

/// Calls `check` every 20 ms until it returns `Some`, for at most [`POLL_TIMEOUT`], panicking
/// with `what` when it never does.
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(POLL_TIMEOUT, what, check).await
}

/// [`eventually`] with another bound, for an effect that takes longer than [`POLL_TIMEOUT`]
/// (a real API server's watch on a shared machine).
pub async fn eventually_within<T, F, Fut>(bound: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("not within {bound:?}: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A directory of its own for one test (certificates, keys, policies, sockets), removed on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `<temp>/kap-e2e-<pid>-<n>-<label>`, unique within and across test processes.
    pub fn new(label: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("kap-e2e-{}-{n}-{label}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        TempDir { path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `contents` to `name` inside the directory and returns the file's path.
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.path.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    /// Writes `contents` to `name` inside the directory and returns `<flag>=<path>`: a flag
    /// naming a file the scenario wrote.
    pub fn flag(&self, flag: &str, name: &str, contents: impl AsRef<[u8]>) -> String {
        format!("{flag}={}", self.write(name, contents).display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

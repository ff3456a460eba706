//! Hot reload of the files the proxy serves from: the serving certificate and key, the client CA
//! bundle, and the local policy files. Each is a [`Reloadable`] value swapped atomically when its
//! files' contents change, so requests never wait on a lock and never see half a change. A
//! broken new file keeps the old value in force, is logged, and is counted.
//!
//! Changes are noticed through inotify on the files' directories (which also sees Kubernetes'
//! atomic `..data` symlink swaps of mounted Secrets and ConfigMaps) and, as a safety net, by a
//! check every minute, as the kubelet re-checks its CA file.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::base::certificates::CertificateSource;

mod metrics;

pub use metrics::ReloadMetrics;

/// How often files are re-checked without a change notification.
const RECHECK_INTERVAL: Duration = Duration::from_secs(60);
/// Changes are applied this long after the last notification, so that a certificate and its key
/// written one after the other are read together.
const SETTLE_DELAY: Duration = Duration::from_millis(200);

/// Why building a value from its files failed, kept as a cause.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

type Build<T> = Box<dyn Fn(&[PathBuf]) -> Result<T, Cause> + Send + Sync>;

/// Why a reloadable value could not be (re)built. Names the file where one is at fault.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// A file could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// A file is empty: almost always one caught between truncation and write.
    #[error("{}: the file is empty", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// A previous reload panicked while holding the reload state.
    #[error("reload state poisoned")]
    Poisoned,
    /// The files were read but the value could not be built from them.
    #[error(transparent)]
    Build(Cause),
}

/// A value built from files, rebuilt when their contents change.
pub struct Reloadable<T> {
    target: &'static str,
    paths: Vec<PathBuf>,
    current: ArcSwap<T>,
    /// SHA-256 over the files' contents at the last successful build; only the reload task
    /// takes this lock.
    fingerprint: Mutex<[u8; 32]>,
    build: Build<T>,
}

impl<T> Reloadable<T> {
    /// Builds the first value; an error here is a configuration error.
    pub fn load<E: Into<Cause>>(
        target: &'static str,
        paths: Vec<PathBuf>,
        build: impl Fn(&[PathBuf]) -> Result<T, E> + Send + Sync + 'static,
    ) -> Result<Reloadable<T>, ReloadError> {
        let build: Build<T> = Box::new(move |paths| build(paths).map_err(Into::into));
        let fingerprint = fingerprint(&paths)?;
        let value = build(&paths).map_err(ReloadError::Build)?;
        Ok(Reloadable {
            target,
            paths,
            current: ArcSwap::from_pointee(value),
            fingerprint: Mutex::new(fingerprint),
            build,
        })
    }

    /// The value in force: a lock-free load, cheap enough for every request.
    pub fn current(&self) -> arc_swap::Guard<Arc<T>> {
        self.current.load()
    }

    /// The value in force, as an owned `Arc`.
    pub fn current_arc(&self) -> Arc<T> {
        self.current.load_full()
    }
}

/// Every reloadable value of a configuration, in the order it was loaded. A value built from
/// another (the serving configuration advertises the client CA's names) can only be loaded after
/// it, so the order of loading is the order of dependencies, and reloads follow it: nobody keeps
/// that order by hand.
#[derive(Default)]
pub struct ReloadRegistry {
    targets: Vec<Arc<dyn ReloadTarget>>,
    certificates: Vec<CertificateSource>,
}

impl ReloadRegistry {
    /// [`Reloadable::load`], recording the value as the registry's next target.
    pub fn load<T: Send + Sync + 'static, E: Into<Cause>>(
        &mut self,
        target: &'static str,
        paths: Vec<PathBuf>,
        build: impl Fn(&[PathBuf]) -> Result<T, E> + Send + Sync + 'static,
    ) -> Result<Arc<Reloadable<T>>, ReloadError> {
        let value = Arc::new(Reloadable::load(target, paths, build)?);
        self.targets
            .push(Arc::clone(&value) as Arc<dyn ReloadTarget>);
        Ok(value)
    }

    /// Records a value loaded elsewhere (the API server credentials, built with their settings)
    /// as the registry's next target.
    pub fn add(&mut self, target: Arc<dyn ReloadTarget>) {
        self.targets.push(target);
    }

    /// Records where certificates in the targets' files are, for their expiry metrics (once
    /// per role and file: two API server clients may share a kubeconfig).
    pub fn certificates(&mut self, source: CertificateSource) {
        if !self
            .certificates
            .iter()
            .any(|s| s.role == source.role && s.file == source.file)
        {
            self.certificates.push(source);
        }
    }

    /// The targets in the order they were loaded, and where their certificates are.
    pub fn into_parts(self) -> (Vec<Arc<dyn ReloadTarget>>, Vec<CertificateSource>) {
        (self.targets, self.certificates)
    }
}

/// What a reload check did.
#[derive(Debug)]
pub enum Reload {
    /// The files are as before.
    Unchanged,
    /// The files changed and the new value is in force.
    Applied,
    /// The files changed but could not be used; the old value stays in force.
    Failed(ReloadError),
}

/// Something [`FileWatcher`] keeps up to date.
pub trait ReloadTarget: Send + Sync {
    /// What it is, for logs and metrics: `serving_certificate`, `client_ca`, `policy`,
    /// `upstream_tls`, `apiserver_credentials`.
    fn target(&self) -> &'static str;
    /// The files it is built from.
    fn paths(&self) -> &[PathBuf];
    /// Rebuilds it if its files changed.
    fn reload_if_changed(&self) -> Reload;
}

impl<T: Send + Sync> ReloadTarget for Reloadable<T> {
    fn target(&self) -> &'static str {
        self.target
    }

    fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    fn reload_if_changed(&self) -> Reload {
        let Ok(mut last) = self.fingerprint.lock() else {
            return Reload::Failed(ReloadError::Poisoned);
        };
        let now = match fingerprint(&self.paths) {
            Ok(now) => now,
            Err(e) => return Reload::Failed(e),
        };
        if now == *last {
            return Reload::Unchanged;
        }
        match (self.build)(&self.paths) {
            Ok(value) => {
                self.current.store(Arc::new(value));
                *last = now;
                Reload::Applied
            }
            Err(e) => Reload::Failed(ReloadError::Build(e)),
        }
    }
}

/// SHA-256 over every file's contents, length-prefixed, in order. An empty file is an error: it
/// is almost always a file caught between truncation and write (`cat >`, an editor), and applying
/// it would, for a policy, refuse every request.
fn fingerprint(paths: &[PathBuf]) -> Result<[u8; 32], ReloadError> {
    let mut hasher = ring::digest::Context::new(&ring::digest::SHA256);
    for path in paths {
        let bytes = std::fs::read(path).map_err(|source| ReloadError::Read {
            path: path.clone(),
            source,
        })?;
        if bytes.is_empty() {
            return Err(ReloadError::Empty { path: path.clone() });
        }
        hasher.update(&(bytes.len() as u64).to_be_bytes());
        hasher.update(&bytes);
    }
    let mut fingerprint = [0; 32];
    fingerprint.copy_from_slice(hasher.finish().as_ref());
    Ok(fingerprint)
}

/// Checks every target, in order (the client CA before the serving configuration that
/// advertises it), logging and counting what happened.
pub fn reload_all(targets: &[Arc<dyn ReloadTarget>], metrics: &ReloadMetrics) {
    for target in targets {
        match target.reload_if_changed() {
            Reload::Unchanged => {}
            Reload::Applied => {
                info!(target = target.target(), "reloaded");
                metrics.observe(target.target(), true);
                metrics
                    .certificates()
                    .reloaded(target.target(), target.paths());
            }
            Reload::Failed(reason) => {
                error!(target = target.target(), %reason, "reload failed; keeping the previous version");
                metrics.observe(target.target(), false);
            }
        }
    }
}

/// The directories to watch: each file's own directory and, when the file is a symlink, the
/// directory its target lives in.
fn watched_directories(targets: &[Arc<dyn ReloadTarget>]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut add = |dir: Option<&Path>| {
        if let Some(dir) = dir {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            if !dirs.iter().any(|d| d == dir) {
                dirs.push(dir.to_owned());
            }
        }
    };
    for target in targets {
        for path in target.paths() {
            add(path.parent());
            if let Ok(resolved) = std::fs::canonicalize(path) {
                add(resolved.parent());
            }
        }
    }
    dirs
}

/// The file names whose changes matter in the watched directories: each file's own name, and for
/// a symlink the name it points through and the name of its final target. A Secret or ConfigMap
/// volume swaps its `..data` symlink, which is among them. Events on anything else (a log file
/// written next to the configuration, an editor's swap file) are ignored, so no other writer can
/// make the watcher work, and nothing it logs can feed it.
fn watched_names(targets: &[Arc<dyn ReloadTarget>]) -> Vec<OsString> {
    let mut names: Vec<OsString> = Vec::new();
    let mut add = |name: Option<&OsStr>| {
        if let Some(name) = name
            && !names.iter().any(|n| n == name)
        {
            names.push(name.to_owned());
        }
    };
    for target in targets {
        for path in target.paths() {
            add(path.file_name());
            if let Ok(link) = std::fs::read_link(path) {
                add(link.components().next().map(|c| c.as_os_str()));
            }
            if let Ok(resolved) = std::fs::canonicalize(path) {
                add(resolved.file_name());
            }
        }
    }
    names
}

/// Whether an event touches one of `names`.
fn concerns(event: &notify::Event, names: &[OsString]) -> bool {
    event
        .paths
        .iter()
        .filter_map(|path| path.file_name())
        .any(|name| names.iter().any(|n| n == name))
}

/// Whether an event can mean new file contents. Reads (`Access`, which includes the opens of the
/// reload itself) and metadata changes cannot; reacting to them would make every reload trigger
/// the next.
fn changes_contents(kind: &notify::EventKind) -> bool {
    use notify::EventKind;
    use notify::event::ModifyKind;
    match kind {
        EventKind::Access(_) | EventKind::Modify(ModifyKind::Metadata(_)) => false,
        EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_) => true,
        EventKind::Any | EventKind::Other => true,
    }
}

/// Keeps `targets` up to date: the directories are watched from [`FileWatcher::new`] on, so
/// nothing written after it returns is missed.
pub struct FileWatcher {
    targets: Vec<Arc<dyn ReloadTarget>>,
    /// Read again after every pass, for their expiry metrics.
    certificates: Arc<[CertificateSource]>,
    /// Kept alive for as long as changes are wanted; dropping it ends the inotify watches.
    _watcher: Option<notify::RecommendedWatcher>,
    changes: mpsc::Receiver<()>,
}

impl FileWatcher {
    /// Starts watching the targets' directories. Watch failures are logged; the once-a-minute
    /// check still applies.
    pub fn new(
        targets: Vec<Arc<dyn ReloadTarget>>,
        certificates: Vec<CertificateSource>,
    ) -> FileWatcher {
        let (tx, changes) = mpsc::channel::<()>(1);
        let names = watched_names(&targets);
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if event.is_ok_and(|event| changes_contents(&event.kind) && concerns(&event, &names)) {
                // One pending notification is enough: the reload reads every file anyway.
                let _ = tx.try_send(());
            }
        });
        let mut watcher = match watcher {
            Ok(watcher) => Some(watcher),
            Err(e) => {
                warn!(error = %e, "cannot watch files; changes are picked up every minute");
                None
            }
        };
        if let Some(watcher) = watcher.as_mut() {
            for dir in watched_directories(&targets) {
                if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
                    warn!(dir = %dir.display(), error = %e, "cannot watch directory; changes are picked up every minute");
                }
            }
        }
        FileWatcher {
            targets,
            certificates: certificates.into(),
            _watcher: watcher,
            changes,
        }
    }

    /// Applies changes until `stop` is cancelled. Checks once at the start, for anything written
    /// between the first load of the files and the start of the watch.
    pub async fn run(mut self, metrics: ReloadMetrics, stop: CancellationToken) {
        if self.targets.is_empty() {
            return;
        }
        // Every target was loaded into force at start, just before this.
        for target in &self.targets {
            metrics.watch(target.target());
            metrics
                .certificates()
                .reloaded(target.target(), target.paths());
        }
        let first = tokio::time::Instant::now() + RECHECK_INTERVAL;
        let mut recheck = tokio::time::interval_at(first, RECHECK_INTERVAL);
        loop {
            let (targets, certificates, reload_metrics) = (
                self.targets.clone(),
                Arc::clone(&self.certificates),
                metrics.clone(),
            );
            // Reading and parsing files blocks; keep it off the request threads.
            let _ = tokio::task::spawn_blocking(move || {
                reload_all(&targets, &reload_metrics);
                reload_metrics.certificates().observe(&certificates);
            })
            .await;
            tokio::select! {
                Some(()) = self.changes.recv() => {
                    tokio::time::sleep(SETTLE_DELAY).await;
                    while self.changes.try_recv().is_ok() {}
                }
                _ = recheck.tick() => {}
                () = stop.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_events_on_watched_files_and_their_links_count() {
        let dir = std::env::temp_dir().join(format!("kap-names-{}", std::process::id()));
        let data = dir.join("..2026_11_24");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("tls.crt"), "x").unwrap();
        std::os::unix::fs::symlink("..2026_11_24", dir.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/tls.crt", dir.join("tls.crt")).unwrap();
        std::fs::write(dir.join("policy.yaml"), "x").unwrap();
        let target = |path: PathBuf| {
            Arc::new(Reloadable::load("t", vec![path], |_| Ok::<_, String>(())).unwrap())
                as Arc<dyn ReloadTarget>
        };
        let names = watched_names(&[target(dir.join("tls.crt")), target(dir.join("policy.yaml"))]);
        let event =
            |name: &str| notify::Event::new(notify::EventKind::Any).add_path(dir.join(name));
        for watched in ["tls.crt", "..data", "policy.yaml"] {
            assert!(concerns(&event(watched), &names), "{watched}");
        }
        for other in ["proxy.log", ".policy.yaml.swp", "..2026_11_25"] {
            assert!(!concerns(&event(other), &names), "{other}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_broken_file_keeps_the_old_value_and_a_fixed_one_is_applied() {
        let dir = std::env::temp_dir().join(format!("kap-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("n.txt");
        std::fs::write(&file, "1").unwrap();
        let value = Reloadable::load("number", vec![file.clone()], |paths| {
            let text = std::fs::read_to_string(&paths[0]).map_err(|e| e.to_string())?;
            text.trim().parse::<u32>().map_err(|e| e.to_string())
        })
        .unwrap();
        assert_eq!(**value.current(), 1);
        assert!(matches!(value.reload_if_changed(), Reload::Unchanged));

        std::fs::write(&file, "two").unwrap();
        assert!(matches!(value.reload_if_changed(), Reload::Failed(_)));
        assert_eq!(**value.current(), 1, "the old value stays in force");

        std::fs::write(&file, "2").unwrap();
        assert!(matches!(value.reload_if_changed(), Reload::Applied));
        assert_eq!(**value.current(), 2);

        std::fs::remove_file(&file).unwrap();
        assert!(matches!(value.reload_if_changed(), Reload::Failed(_)));
        assert_eq!(**value.current(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

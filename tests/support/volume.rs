//! A directory laid out as the kubelet mounts a Secret or ConfigMap volume (its `AtomicWriter`):
//! the files live in a timestamped `..<time>` directory, `..data` is a symlink to it, and each
//! visible name is a symlink through `..data`. An update writes a new timestamped directory and
//! swaps `..data` with one `rename` of a new symlink, so a reader sees the old set or the new set,
//! never a mix; then the old directory is removed.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The symlink every visible file goes through.
const DATA: &str = "..data";
/// The new symlink, before it is renamed over [`DATA`].
const DATA_TMP: &str = "..data_tmp";

/// A Kubernetes-style volume directory.
pub struct Volume {
    dir: PathBuf,
    /// The timestamped directory `..data` points to now.
    current: PathBuf,
}

impl Volume {
    /// Creates `dir` with `files` (name, contents) published through `..data`.
    pub fn create(dir: PathBuf, files: &[(&str, String)]) -> Volume {
        std::fs::create_dir_all(&dir).unwrap();
        let current = write_generation(&dir, files);
        symlink(current.file_name().unwrap(), dir.join(DATA)).unwrap();
        for (name, _) in files {
            symlink(Path::new(DATA).join(name), dir.join(name)).unwrap();
        }
        Volume { dir, current }
    }

    /// The visible path of `name` (a symlink through `..data`), as a flag names it.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Publishes a new version of the same files at once, as the kubelet does when the Secret
    /// changes: new timestamped directory, `..data_tmp` → it, `rename(..data_tmp, ..data)`, old
    /// directory removed.
    pub fn update(&mut self, files: &[(&str, String)]) {
        let next = write_generation(&self.dir, files);
        let tmp = self.dir.join(DATA_TMP);
        symlink(next.file_name().unwrap(), &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join(DATA)).unwrap();
        std::fs::remove_dir_all(&self.current).unwrap();
        self.current = next;
    }
}

/// Writes `files` into a new `..<time>` directory of `dir` and returns it.
fn write_generation(dir: &Path, files: &[(&str, String)]) -> PathBuf {
    static GENERATION: AtomicUsize = AtomicUsize::new(0);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let name = format!(
        "..{}_{:09}.{}",
        now.as_secs(),
        now.subsec_nanos(),
        GENERATION.fetch_add(1, Ordering::Relaxed)
    );
    let generation = dir.join(name);
    std::fs::create_dir(&generation).unwrap();
    for (file, contents) in files {
        std::fs::write(generation.join(file), contents).unwrap();
    }
    generation
}

//! The directory `--handover-socket` lives in must be reachable by the proxy's user alone: whoever
//! can connect there can ask for the listening sockets, and whoever can create files there can
//! answer in the proxy's place.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// Why the directory of `--handover-socket` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    /// The path names no file in a directory.
    #[error("{}: not a path to a file in a directory", path.display())]
    NoDirectory {
        /// The flag's value.
        path: PathBuf,
    },
    /// The directory cannot be read (missing, or no permission).
    #[error(
        "{}: cannot read its directory {}: {source}; create it (a hostPath \
         volume of type DirectoryOrCreate in the DaemonSet) with mode 0700 for the proxy's user",
        path.display(),
        directory.display()
    )]
    Unreadable {
        /// The flag's value.
        path: PathBuf,
        /// Its directory.
        directory: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// Another user could reach the socket or put one in its place.
    #[error(
        "{}: its directory {} is {why}: another user could ask for the \
         listening sockets or answer in the proxy's place; {hint}",
        path.display(),
        directory.display()
    )]
    Shared {
        /// The flag's value.
        path: PathBuf,
        /// Its directory.
        directory: PathBuf,
        /// What is wrong.
        why: String,
        /// What to do.
        hint: String,
    },
}

/// Checks, reading only, that the directory of `path` is a directory that only this process's
/// user (and root) can reach: owned by root or this user, no access for others, and group access
/// only for this process's own group (not checked when this process is root, as `check-config`
/// run by an operator may be: it cannot tell which group the proxy runs as). The DaemonSet's init container makes the host directory so
/// (`chgrp` to the pod's group, `chmod 0770`); a systemd unit's `RuntimeDirectory=` is 0755 by
/// default, hence `RuntimeDirectoryMode=0700`.
pub fn check_directory(path: &Path) -> Result<(), DirectoryError> {
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() && path.file_name().is_some() => parent,
        _ => {
            return Err(DirectoryError::NoDirectory {
                path: path.to_owned(),
            });
        }
    };
    let unreadable = |source| DirectoryError::Unreadable {
        path: path.to_owned(),
        directory: directory.to_owned(),
        source,
    };
    let meta = std::fs::metadata(directory).map_err(unreadable)?;
    if !meta.is_dir() {
        return Err(unreadable(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            "not a directory",
        )));
    }
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    let shared = |why: String, hint: String| DirectoryError::Shared {
        path: path.to_owned(),
        directory: directory.to_owned(),
        why,
        hint,
    };
    let mode = meta.mode() & 0o7777;
    if meta.uid() != 0 && meta.uid() != uid {
        return Err(shared(
            format!(
                "owned by user {}, not by root or this proxy's user {uid}",
                meta.uid()
            ),
            format!("chown {uid} {}", directory.display()),
        ));
    }
    if mode & 0o007 != 0 {
        return Err(shared(
            format!("open to other users (mode {mode:04o})"),
            format!("chmod o-rwx {}", directory.display()),
        ));
    }
    // Root (check-config run by an operator) cannot tell which group the proxy will run as.
    if mode & 0o070 != 0 && meta.gid() != gid && uid != 0 {
        return Err(shared(
            format!(
                "open to group {} (mode {mode:04o}), not this proxy's group {gid}",
                meta.gid()
            ),
            format!("chmod g-rwx {} (or chgrp {gid})", directory.display()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    /// A directory under the system temp dir with `mode`, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str, mode: u32) -> TempDir {
            let path = std::env::temp_dir().join(format!(
                "kubelet-auth-proxy-handover-{name}-{}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            TempDir(path)
        }

        fn socket(&self) -> PathBuf {
            self.0.join("handover.sock")
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_directory_of_the_proxy_s_own_is_accepted() {
        check_directory(&TempDir::new("own", 0o700).socket()).unwrap();
        check_directory(&TempDir::new("group", 0o770).socket()).unwrap();
    }

    #[test]
    fn a_directory_others_can_reach_is_refused_with_the_fix() {
        let error = check_directory(&TempDir::new("others", 0o755).socket())
            .unwrap_err()
            .to_string();
        assert!(error.contains("open to other users (mode 0755)"), "{error}");
        assert!(error.contains("chmod o-rwx"), "{error}");
        assert!(matches!(
            check_directory(&TempDir::new("sticky", 0o1777).socket()),
            Err(DirectoryError::Shared { .. })
        ));
    }

    #[test]
    fn a_missing_directory_or_a_bare_name_is_refused() {
        let error = check_directory(Path::new("/nonexistent/handover.sock"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("DirectoryOrCreate"), "{error}");
        assert!(matches!(
            check_directory(Path::new("handover.sock")),
            Err(DirectoryError::NoDirectory { .. })
        ));
    }
}

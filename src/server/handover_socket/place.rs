//! The path of `--handover-socket` and the name beside it, where this process binds its socket
//! before renaming it over the path: what is there, and taking them. Only a socket of the proxy's
//! own user is the proxy's (a running proxy's, or one a proxy that ended left); anything else
//! (a directory, a file, a symbolic link, a socket of another user) was put there by someone
//! else, and is never deleted, followed or replaced: the handover socket is off instead.

use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use super::is_our_user;

/// Why the path of `--handover-socket`, or the name beside it, cannot be the proxy's.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    /// Something that is not the proxy's socket is there.
    #[error(
        "--handover-socket {}: {} is {what}, not a socket of this proxy's user {ours}: left \
         as it is (never deleted nor followed); remove it (rm -r {}) and check who can write to \
         its directory",
        path.display(),
        at.display(),
        at.display()
    )]
    Taken {
        /// The flag's value.
        path: PathBuf,
        /// The path or the name beside it.
        at: PathBuf,
        /// What is there, and whose it is: `a directory of uid 20001`.
        what: String,
        /// This process's user.
        ours: u32,
    },
    /// Looking at, binding or renaming failed.
    #[error("--handover-socket {}: {}: {source}", path.display(), at.display())]
    Io {
        /// The flag's value.
        path: PathBuf,
        /// The path or the name beside it.
        at: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
}

impl PlaceError {
    /// The `cause` label of the handover-socket-off metric: `taken` or `io`.
    pub fn cause(&self) -> &'static str {
        match self {
            PlaceError::Taken { .. } => "taken",
            PlaceError::Io { .. } => "io",
        }
    }
}

/// The name this process binds its socket under before renaming it over `path`:
/// `.<name>.<pid>` in the same directory.
fn beside(path: &Path) -> PathBuf {
    let mut name = std::ffi::OsString::from(".");
    name.push(path.file_name().unwrap_or_default());
    name.push(format!(".{}", std::process::id()));
    path.with_file_name(name)
}

/// Checks, reading only and following no link, that `path` and the name beside it hold nothing
/// or a socket of the proxy's user.
pub(super) fn examine(path: &Path) -> Result<(), PlaceError> {
    for at in [path.to_owned(), beside(path)] {
        let meta = match std::fs::symlink_metadata(&at) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(PlaceError::Io {
                    path: path.to_owned(),
                    at,
                    source,
                });
            }
        };
        let kind = meta.file_type();
        if kind.is_socket() && is_our_user(meta.uid()) {
            continue;
        }
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_symlink() {
            "a symbolic link"
        } else if kind.is_file() {
            "a regular file"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "a special file"
        };
        return Err(PlaceError::Taken {
            path: path.to_owned(),
            at,
            what: format!("{what} of uid {}", meta.uid()),
            ours: rustix::process::geteuid().as_raw(),
        });
    }
    Ok(())
}

/// The path, held by a socket of this process as long as no other process took it over.
pub(super) struct Place {
    path: PathBuf,
    pub(super) listener: UnixListener,
    /// The socket file's inode, which tells whether the path still names it.
    inode: u64,
}

impl Place {
    /// Binds a socket beside `path`, readable and writable by this user alone, and renames it
    /// over `path`: the path never names nothing, and a socket another process of this user left
    /// there is replaced, never reused. Anything else there, or beside it, is left alone
    /// ([`examine`]).
    pub(super) fn take(path: &Path) -> Result<Place, PlaceError> {
        examine(path)?;
        let beside = beside(path);
        let io = |at: &Path| {
            let at = at.to_owned();
            move |source| PlaceError::Io {
                path: path.to_owned(),
                at,
                source,
            }
        };
        match std::fs::remove_file(&beside) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&beside)(e)),
            _ => {}
        }
        let listener = UnixListener::bind(&beside).map_err(io(&beside))?;
        std::fs::set_permissions(&beside, std::fs::Permissions::from_mode(0o600))
            .map_err(io(&beside))?;
        std::fs::rename(&beside, path).map_err(io(path))?;
        let inode = std::fs::symlink_metadata(path).map_err(io(path))?.ino();
        Ok(Place {
            path: path.to_owned(),
            listener,
            inode,
        })
    }

    /// Takes the path back if another process took it over and did not keep it (a new process
    /// that failed after binding).
    pub(super) fn reclaim(&mut self) -> Result<(), PlaceError> {
        let ours = std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.inode);
        if !ours {
            *self = Place::take(&self.path)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_fixtures::TempDir;

    /// Puts something at `at`.
    type Put = fn(&Path);

    fn directory(at: &Path) {
        std::fs::create_dir(at).unwrap();
    }
    fn file(at: &Path) {
        std::fs::write(at, "not a socket").unwrap();
    }
    fn symlink_to_a_socket(at: &Path) {
        let target = at.with_extension("target");
        std::mem::forget(std::os::unix::net::UnixListener::bind(&target).unwrap());
        std::os::unix::fs::symlink(&target, at).unwrap();
    }
    fn dangling_symlink(at: &Path) {
        std::os::unix::fs::symlink("/nonexistent", at).unwrap();
    }
    fn fifo(at: &Path) {
        rustix::fs::mkfifoat(rustix::fs::CWD, at, rustix::fs::Mode::RUSR).unwrap();
    }
    fn socket_of_another_user(at: &Path) {
        std::mem::forget(std::os::unix::net::UnixListener::bind(at).unwrap());
        rustix::fs::chownat(
            rustix::fs::CWD,
            at,
            Some(rustix::process::Uid::from_raw(20001)),
            None,
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .unwrap();
    }
    fn our_stale_socket(at: &Path) {
        drop(std::os::unix::net::UnixListener::bind(at).unwrap());
    }

    #[tokio::test]
    async fn anything_but_a_socket_of_ours_at_the_path_or_beside_it_is_named_and_left_alone() {
        let root = rustix::process::geteuid().is_root();
        // (what is put there, how, the words naming it or None if the place is the proxy's)
        let cases: [(&str, Put, Option<&str>); 7] = [
            ("a directory", directory, Some("a directory of uid")),
            ("a regular file", file, Some("a regular file of uid")),
            (
                "a symlink to a socket",
                symlink_to_a_socket,
                Some("a symbolic link of uid"),
            ),
            (
                "a dangling symlink",
                dangling_symlink,
                Some("a symbolic link of uid"),
            ),
            ("a fifo", fifo, Some("a special file of uid")),
            (
                "a socket of uid 20001",
                socket_of_another_user,
                Some("a socket of uid 20001"),
            ),
            ("a socket of ours nobody listens on", our_stale_socket, None),
        ];
        for (what, put, named) in cases {
            if what == "a socket of uid 20001" && !root {
                println!("{what}: only root can give a socket away: not run");
                continue;
            }
            for at_path in [true, false] {
                let dir = TempDir::new("examine");
                let path = dir.0.join("handover.sock");
                let at = if at_path { path.clone() } else { beside(&path) };
                let case = format!("{what} at {}", at.display());
                put(&at);
                let before = std::fs::symlink_metadata(&at).unwrap();
                match (Place::take(&path), named) {
                    (Ok(place), None) => {
                        assert_eq!(
                            std::fs::symlink_metadata(&path).unwrap().ino(),
                            place.inode,
                            "{case}: the path is the new socket"
                        );
                    }
                    (Err(e), Some(words)) => {
                        let said = e.to_string();
                        assert_eq!(e.cause(), "taken", "{case}: {said}");
                        assert!(said.contains(words), "{case}: {said}");
                        assert!(said.contains(&*at.to_string_lossy()), "{case}: {said}");
                        assert!(said.contains("rm -r"), "{case}: {said}");
                        let after = std::fs::symlink_metadata(&at).unwrap();
                        assert_eq!(after.ino(), before.ino(), "{case}: replaced");
                        assert!(examine(&path).is_err(), "{case}");
                    }
                    (Ok(_), Some(_)) => panic!("{case}: taken over"),
                    (Err(e), None) => panic!("{case}: refused: {e}"),
                }
            }
        }
    }
}

//! The directory `--handover-socket` lives in must be reachable by the proxy's user alone: whoever
//! can connect there can ask for the listening sockets, and whoever can create files there can
//! answer in the proxy's place.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use super::acl::{self, Acl, AclError, Named};

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
    /// The directory's ACL cannot be read or made sense of.
    #[error(
        "{}: its directory {}: {source}; look at it with getfacl {} (setfacl -b {} removes \
         every entry)",
        path.display(),
        directory.display(),
        directory.display(),
        directory.display()
    )]
    Acl {
        /// The flag's value.
        path: PathBuf,
        /// Its directory.
        directory: PathBuf,
        /// What went wrong.
        #[source]
        source: AclError,
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
/// run by an operator may be: it cannot tell which group the proxy runs as), all of it as the
/// kernel decides it, its POSIX ACL included (`super::acl`): no named user but root or this one,
/// and no named group but this one (unchecked by root too), gets any access through it. The DaemonSet's init container
/// makes the host directory so (`chgrp` to the pod's group, `chmod 0770`); a systemd unit's
/// `RuntimeDirectory=` is 0755 by default, hence `RuntimeDirectoryMode=0700`.
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
    let acl = acl::read(directory).map_err(|source| DirectoryError::Acl {
        path: path.to_owned(),
        directory: directory.to_owned(),
        source,
    })?;
    let us = Us {
        uid: rustix::process::geteuid().as_raw(),
        gid: rustix::process::getegid().as_raw(),
    };
    let owner = Owner {
        uid: meta.uid(),
        gid: meta.gid(),
        mode: meta.mode() & 0o7777,
    };
    decide(directory, owner, acl.as_ref(), us).map_err(|Refusal { why, hint }| {
        DirectoryError::Shared {
            path: path.to_owned(),
            directory: directory.to_owned(),
            why,
            hint,
        }
    })
}

/// The directory's owner, group and mode.
#[derive(Clone, Copy)]
struct Owner {
    uid: u32,
    gid: u32,
    mode: u32,
}

/// The user and group the proxy runs as.
#[derive(Clone, Copy)]
struct Us {
    uid: u32,
    gid: u32,
}

/// What is wrong with a directory, and what to do.
struct Refusal {
    why: String,
    hint: String,
}

/// The decision of [`check_directory`] on what it read: the directory's owner, group and mode,
/// and its access ACL if it has one.
fn decide(directory: &Path, meta: Owner, acl: Option<&Acl>, us: Us) -> Result<(), Refusal> {
    let refuse = |why: String, hint: String| Err(Refusal { why, hint });
    let mode = meta.mode;
    if meta.uid != 0 && meta.uid != us.uid {
        return refuse(
            format!(
                "owned by user {}, not by root or this proxy's user {}",
                meta.uid, us.uid
            ),
            format!("chown {} {}", us.uid, directory.display()),
        );
    }
    if mode & 0o007 != 0 {
        return refuse(
            format!("open to other users (mode {mode:04o})"),
            format!("chmod o-rwx {}", directory.display()),
        );
    }
    // With an ACL the mode's group bits are its mask; the owning group gets its own entry's
    // permissions under it.
    let owning_group_reaches = acl
        .and_then(|acl| acl.owning_group)
        .map_or(mode & 0o070 != 0, acl::Perm::any);
    // Root (check-config run by an operator) cannot tell which group the proxy will run as.
    if owning_group_reaches && meta.gid != us.gid && us.uid != 0 {
        return refuse(
            format!(
                "open to group {} (mode {mode:04o}), not this proxy's group {}",
                meta.gid, us.gid
            ),
            format!("chmod g-rwx {} (or chgrp {})", directory.display(), us.gid),
        );
    }
    for entry in acl.map(|acl| acl.named.as_slice()).unwrap_or_default() {
        if !entry.effective.any() {
            continue;
        }
        let (who, ours, taken) = match entry.named {
            Named::User(uid) => (format!("uid {uid}"), uid == 0 || uid == us.uid, "u"),
            // As for the owning group, root cannot tell which group the proxy runs as.
            Named::Group(gid) => (format!("gid {gid}"), gid == us.gid || us.uid == 0, "g"),
        };
        if ours {
            continue;
        }
        let what = if entry.effective.writes() {
            "create files there"
        } else {
            "reach the socket's path"
        };
        let id = match entry.named {
            Named::User(id) | Named::Group(id) => id,
        };
        return refuse(
            format!(
                "open through its ACL: entry {entry} lets {who} {what} (mode {mode:04o} does not \
                 show it)"
            ),
            format!(
                "setfacl -x {taken}:{id} {0} (or setfacl -b {0} to remove every entry)",
                directory.display()
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_fixtures::TempDir;

    #[test]
    fn a_directory_of_the_proxy_s_own_is_accepted() {
        check_directory(&TempDir::with_mode("own", 0o700).0.join("handover.sock")).unwrap();
        check_directory(&TempDir::with_mode("group", 0o770).0.join("handover.sock")).unwrap();
    }

    #[test]
    fn a_directory_others_can_reach_is_refused_with_the_fix() {
        let error = check_directory(&TempDir::with_mode("others", 0o755).0.join("handover.sock"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("open to other users (mode 0755)"), "{error}");
        assert!(error.contains("chmod o-rwx"), "{error}");
        assert!(matches!(
            check_directory(&TempDir::with_mode("sticky", 0o1777).0.join("handover.sock")),
            Err(DirectoryError::Shared { .. })
        ));
    }

    /// A proxy of user 10250, group 10250, as the DaemonSet runs it.
    const PROXY: Us = Us {
        uid: 10250,
        gid: 10250,
    };
    /// root, as an operator running `check-config`.
    const ROOT: Us = Us { uid: 0, gid: 0 };

    /// What, the directory, its ACL attribute, who checks, and `None` if accepted or the words
    /// of the refusal and of its hint.
    type Case = (
        &'static str,
        Owner,
        Option<Vec<u8>>,
        Us,
        Option<[&'static str; 2]>,
    );

    #[test]
    fn every_mode_and_acl_is_decided_on_the_effective_access_and_a_refusal_names_it() {
        use crate::server::handover_socket::acl::tests::{named_user, xattr};
        let decoded = |value: Vec<u8>| crate::server::handover_socket::acl::tests::decode(&value);
        let root_dir = |mode| Owner {
            uid: 0,
            gid: 10250,
            mode,
        };
        let cases: Vec<Case> = vec![
            ("0770 root:proxy group", root_dir(0o770), None, PROXY, None),
            (
                "0700 of the proxy's user",
                Owner {
                    uid: 10250,
                    gid: 0,
                    mode: 0o700,
                },
                None,
                PROXY,
                None,
            ),
            (
                "open to others",
                root_dir(0o775),
                None,
                PROXY,
                Some(["open to other users (mode 0775)", "chmod o-rwx"]),
            ),
            (
                "another owner",
                Owner {
                    uid: 20001,
                    gid: 10250,
                    mode: 0o770,
                },
                None,
                PROXY,
                Some(["owned by user 20001", "chown 10250"]),
            ),
            (
                "another group",
                Owner {
                    uid: 0,
                    gid: 20001,
                    mode: 0o770,
                },
                None,
                PROXY,
                Some(["open to group 20001", "chgrp 10250"]),
            ),
            (
                "a named user with rwx",
                root_dir(0o770),
                Some(named_user(20001, 0o7, 0o7)),
                PROXY,
                Some([
                    "entry user:20001:rwx lets uid 20001 create files there",
                    "setfacl -x u:20001",
                ]),
            ),
            (
                "a named user with rwx, checked by root",
                root_dir(0o770),
                Some(named_user(20001, 0o7, 0o7)),
                ROOT,
                Some([
                    "entry user:20001:rwx lets uid 20001 create files there",
                    "setfacl -b",
                ]),
            ),
            (
                "a named user with r-x",
                root_dir(0o770),
                Some(named_user(20001, 0o5, 0o7)),
                PROXY,
                Some([
                    "entry user:20001:r-x lets uid 20001 reach the socket's path",
                    "setfacl -x u:20001",
                ]),
            ),
            (
                "a named user masked to r-x",
                root_dir(0o750),
                Some(named_user(20001, 0o7, 0o5)),
                PROXY,
                Some(["entry user:20001:r-x", "setfacl"]),
            ),
            (
                "a named user masked to nothing",
                root_dir(0o700),
                Some(named_user(20001, 0o7, 0)),
                PROXY,
                None,
            ),
            (
                "the proxy's own user named",
                root_dir(0o770),
                Some(named_user(10250, 0o7, 0o7)),
                PROXY,
                None,
            ),
            (
                "root named",
                root_dir(0o770),
                Some(named_user(0, 0o7, 0o7)),
                PROXY,
                None,
            ),
            (
                "a named group",
                root_dir(0o770),
                Some(xattr(&[
                    (0x01, 0o7, 0),
                    (0x04, 0o7, 0),
                    (0x08, 0o7, 30000),
                    (0x10, 0o7, 0),
                    (0x20, 0, 0),
                ])),
                PROXY,
                Some([
                    "entry group:30000:rwx lets gid 30000 create files there",
                    "setfacl -x g:30000",
                ]),
            ),
            (
                "the proxy's own group named",
                root_dir(0o770),
                Some(xattr(&[
                    (0x01, 0o7, 0),
                    (0x04, 0o7, 0),
                    (0x08, 0o7, 10250),
                    (0x10, 0o7, 0),
                    (0x20, 0, 0),
                ])),
                PROXY,
                None,
            ),
            (
                // The mask shows as the mode's group bits, the owning group itself gets nothing.
                "another owning group shut out by its entry, the proxy's group named",
                Owner {
                    uid: 0,
                    gid: 20001,
                    mode: 0o770,
                },
                Some(xattr(&[
                    (0x01, 0o7, 0),
                    (0x04, 0, 0),
                    (0x08, 0o7, 10250),
                    (0x10, 0o7, 0),
                    (0x20, 0, 0),
                ])),
                PROXY,
                None,
            ),
        ];
        for (what, owner, attribute, us, expected) in cases {
            let acl = attribute.map(|value| decoded(value).unwrap());
            let decided = decide(Path::new("/run/handover"), owner, acl.as_ref(), us);
            match (decided, expected) {
                (Ok(()), None) => {}
                (Err(Refusal { why, hint }), Some([words, fix])) => {
                    assert!(why.contains(words), "{what}: {why}");
                    assert!(
                        hint.contains(fix) && hint.contains("/run/handover"),
                        "{what}: {hint}"
                    );
                }
                (Ok(()), Some(_)) => panic!("{what}: accepted"),
                (Err(Refusal { why, .. }), None) => panic!("{what}: refused: {why}"),
            }
        }
    }

    /// `setfacl`, from the `acl` package (the CI script installs it).
    const SETFACL: &str = "/usr/bin/setfacl";

    #[test]
    fn a_directory_an_acl_opens_to_another_user_is_refused_naming_the_entry() {
        if !Path::new(SETFACL).exists() {
            println!("{SETFACL} is not installed (apt-get install acl): not run");
            return;
        }
        let dir = TempDir::with_mode("acl", 0o770);
        check_directory(&dir.0.join("handover.sock")).unwrap();
        let set = std::process::Command::new(SETFACL)
            .args(["-m", "u:20001:rwx"])
            .arg(&dir.0)
            .status()
            .unwrap();
        if !set.success() {
            println!(
                "{} keeps no ACLs here: not run",
                std::env::temp_dir().display()
            );
            return;
        }
        let error = check_directory(&dir.0.join("handover.sock"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("entry user:20001:rwx lets uid 20001 create files there"),
            "{error}"
        );
        assert!(
            error.contains(&format!("setfacl -b {}", dir.0.display())),
            "{error}"
        );
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

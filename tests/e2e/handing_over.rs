//! The handover never stops a start or lies about readiness: whatever is wrong with
//! `--handover-socket` (its directory's mode or ACL, something else than the proxy's socket at
//! the path or the name beside it), the proxy starts and serves without it, and says why.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use http::StatusCode;

use crate::joining::handover_directory;
use crate::support::client::{H2_AND_HTTP1, plain_get};
use crate::support::process::{BINARY, Deployment, ProcessSpec, ProxyProcess};

/// `setfacl`, from the `acl` package (the CI script installs it).
const SETFACL: &str = "/usr/bin/setfacl";

/// What a case does to the handover directory before the proxy starts: given the socket's path,
/// it returns what it put there (left as it was, the test checks), if anything.
type Spoil = fn(&Path) -> Option<PathBuf>;

/// What, how the directory is spoiled, a shell command run with the proxy's pid in `$$` before
/// it starts, and the words its log line says and the metric's cause if the socket is off.
type Case = (
    &'static str,
    Option<Spoil>,
    Option<&'static str>,
    Option<[&'static str; 2]>,
);

/// The name a process of pid `$$` binds beside `path` before renaming it over: the wrapper
/// script that starts the proxy puts things there, its pid being the proxy's (it `exec`s).
fn beside_in_script(path: &Path) -> String {
    let name = path.file_name().unwrap().to_string_lossy();
    format!("{}/.{name}.$$", path.parent().unwrap().display())
}

fn open_to_others(path: &Path) -> Option<PathBuf> {
    let directory = path.parent().unwrap();
    std::fs::set_permissions(directory, std::fs::Permissions::from_mode(0o755)).unwrap();
    None
}

fn acl_for_another_user(path: &Path) -> Option<PathBuf> {
    let set = std::process::Command::new(SETFACL)
        .args(["-m", "u:20001:rwx"])
        .arg(path.parent().unwrap())
        .status()
        .unwrap();
    assert!(set.success(), "setfacl failed");
    None
}

fn directory_at_path(path: &Path) -> Option<PathBuf> {
    std::fs::create_dir(path).unwrap();
    Some(path.to_owned())
}

fn file_at_path(path: &Path) -> Option<PathBuf> {
    std::fs::write(path, "somebody's file").unwrap();
    Some(path.to_owned())
}

fn symlink_at_path(path: &Path) -> Option<PathBuf> {
    std::os::unix::fs::symlink("/etc/passwd", path).unwrap();
    Some(path.to_owned())
}

fn socket_of_another_user_at_path(path: &Path) -> Option<PathBuf> {
    std::mem::forget(std::os::unix::net::UnixListener::bind(path).unwrap());
    let chowned = std::process::Command::new("chown")
        .args(["-h", "20001"])
        .arg(path)
        .status()
        .unwrap();
    assert!(chowned.success(), "chown failed");
    Some(path.to_owned())
}

/// Starts the proxy with `args` through `sh`, which first runs `prepare` (with `$$`, the pid the
/// proxy will have, at hand), then `exec`s the binary.
async fn start_after(site: &Deployment, prepare: &str, args: &[String]) -> ProxyProcess {
    let script = site.dir.write(
        "start-after.sh",
        format!("#!/bin/sh\nset -e\n{prepare}\nexec {BINARY} \"$@\"\n"),
    );
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    site.start_from(&script, "proxy", args).await
}

#[tokio::test]
async fn whatever_is_wrong_with_the_handover_socket_the_proxy_starts_serves_and_names_it() {
    let root = rustix::process::geteuid().is_root();
    let cases: [Case; 10] = [
        ("nothing wrong", None, None, None),
        (
            "a directory open to others",
            Some(open_to_others),
            None,
            Some(["open to other users (mode 0755)", "directory"]),
        ),
        (
            "an ACL letting another user in",
            Some(acl_for_another_user),
            None,
            Some([
                "entry user:20001:rwx lets uid 20001 create files there",
                "directory",
            ]),
        ),
        (
            "a directory at the path",
            Some(directory_at_path),
            None,
            Some(["is a directory of uid", "taken"]),
        ),
        (
            "a regular file at the path",
            Some(file_at_path),
            None,
            Some(["is a regular file of uid", "taken"]),
        ),
        (
            "a symlink at the path",
            Some(symlink_at_path),
            None,
            Some(["is a symbolic link of uid", "taken"]),
        ),
        (
            "a socket of another user at the path",
            Some(socket_of_another_user_at_path),
            None,
            Some(["is a socket of uid 20001", "taken"]),
        ),
        (
            "a directory beside the path",
            None,
            Some("mkdir {beside}"),
            Some(["is a directory of uid", "taken"]),
        ),
        (
            "a regular file beside the path",
            None,
            Some("echo somebody > {beside}"),
            Some(["is a regular file of uid", "taken"]),
        ),
        (
            "a symlink beside the path",
            None,
            Some("ln -s /etc/passwd {beside}"),
            Some(["is a symbolic link of uid", "taken"]),
        ),
    ];
    for (what, spoil, prepare, off) in cases {
        if what.contains("ACL") && !Path::new(SETFACL).exists() {
            println!("{what}: {SETFACL} is not installed (apt-get install acl): not run");
            continue;
        }
        if what.contains("another user") && !root {
            println!("{what}: only root can make a file of another user: not run");
            continue;
        }
        let site = ProcessSpec::new("handover-off").prepare().await;
        let socket = handover_directory(&site.dir, 0o770);
        let left = spoil.and_then(|spoil| spoil(&socket));
        let before = left
            .as_ref()
            .map(|left| std::fs::symlink_metadata(left).unwrap().ino());
        let args = [format!("--handover-socket={}", socket.display())];
        let proxy = match prepare {
            Some(prepare) => {
                let prepare = prepare.replace("{beside}", &beside_in_script(&socket));
                start_after(&site, &prepare, &args).await
            }
            None => site.start("proxy", &args).await,
        };
        // It serves.
        let alice = site.client(proxy.addr(), "alice", H2_AND_HTTP1);
        assert_eq!(alice.get("/pods").await.status, StatusCode::OK, "{what}");
        let log = proxy.stderr();
        let metrics = plain_get(proxy.admin_addr(), "/metrics").await.text();
        let off_by = |cause| {
            crate::support::metrics::total(
                &metrics,
                "kubelet_auth_proxy_handover_socket_off",
                &[("cause", cause)],
            )
        };
        let Some([words, cause]) = off else {
            // The proxy's own: it answers there, and nothing is counted off.
            assert!(!log.contains("--handover-socket is off"), "{what}: {log}");
            for cause in ["directory", "taken", "io"] {
                assert_eq!(off_by(cause), 0.0, "{what}: {cause}: {metrics}");
            }
            assert!(socket.exists(), "{what}: no socket at {}", socket.display());
            continue;
        };
        // It says what is wrong, that it serves without the handover socket, and counts it.
        assert!(log.contains("--handover-socket is off"), "{what}: {log}");
        assert!(log.contains(words), "{what}: {log}");
        assert_eq!(off_by(cause), 1.0, "{what}: {metrics}");
        // It left alone what it found, and bound nothing there.
        if let (Some(left), Some(before)) = (&left, before) {
            let after = std::fs::symlink_metadata(left).unwrap().ino();
            assert_eq!(after, before, "{what}: replaced");
        } else if prepare.is_none() {
            assert!(!socket.exists(), "{what}: bound {}", socket.display());
        }
    }
}

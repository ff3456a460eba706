//! The handover never stops a start or lies about readiness: whatever is wrong with
//! `--handover-socket` (its directory's mode or ACL, something else than the proxy's socket at
//! the path or the name beside it), the proxy starts and serves without it, and says why.

use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use http::StatusCode;
use tokio::task::JoinHandle;

use crate::joining::{answer_as_previous_version, handover_directory};
use crate::support::client::{H2_AND_HTTP1, plain_get};
use crate::support::eventually;
use crate::support::process::{BINARY, Deployment, ProcessSpec, ProxyProcess, run};

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

/// A process that is not a proxy (`sleep`) holding a listening socket on `addr`, its standard
/// input; killed when dropped.
struct Foreign(std::process::Child);

impl Foreign {
    fn hold(addr: SocketAddr) -> Foreign {
        let listener = std::net::TcpListener::bind(addr).unwrap();
        let child = std::process::Command::new("sleep")
            .arg("600")
            .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
                listener,
            )))
            .spawn()
            .unwrap();
        Foreign(child)
    }

    /// How the standby names it.
    fn named(&self) -> String {
        format!("pid {} (sleep)", self.0.id())
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Two distinct free loopback addresses (both bound at once, then let go of).
fn free_addresses() -> (SocketAddr, SocketAddr) {
    let bind = || std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (one, other) = (bind(), bind());
    (one.local_addr().unwrap(), other.local_addr().unwrap())
}

/// Who holds the kubelet API address while the new proxy starts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ApiHolder {
    /// The previous version, which answers on the admin address.
    Previous,
    /// Another process, from the start.
    Other,
    /// The previous version, then, once the new proxy stands by, another process takes it
    /// before the previous version lets go of the admin address.
    PreviousThenOther,
}

/// What, whether a previous version answers on the admin address, who holds the kubelet API's,
/// and what the new proxy says meanwhile: whether it is ready, the words of its `/readyz` answer
/// and of its log (`{api}` standing for the kubelet API address, `{other}` for the other process),
/// and whom the standby gauge counts.
type StandbyCase = (
    &'static str,
    bool,
    ApiHolder,
    bool,
    &'static str,
    &'static str,
    Option<&'static str>,
);

/// What the new process's `/readyz` answered, through `admin-probe` on its own socket: whether
/// 200, and the body (after the status `admin-probe` prints before it).
async fn readyz(site: &Deployment, socket: &Path) -> (bool, String) {
    let args = vec![
        "admin-probe".to_owned(),
        format!("--admin-socket={}", socket.display()),
        "/readyz".to_owned(),
    ];
    let said = run(&site.dir, "admin-probe", &args).await;
    let text = said.stdout + &said.stderr;
    let body = text
        .split_once("Service Unavailable: ")
        .map_or(text.as_str(), |(_, body)| body)
        .trim_end()
        .to_owned();
    (said.status.success(), body)
}

#[tokio::test]
async fn standing_by_is_ready_only_for_a_previous_version_and_names_any_other_holder() {
    let not_previous = "standing by, not ready: --listen-address {api} is held by {other}, not by \
                        the previous version of the proxy";
    let cases: [StandbyCase; 4] = [
        (
            "a previous version holds both addresses",
            true,
            ApiHolder::Previous,
            true,
            "ok",
            "a previous version of the proxy, which cannot hand its sockets over",
            Some("previous_version"),
        ),
        (
            "a previous version holds the admin address, another process the kubelet API's",
            true,
            ApiHolder::Other,
            false,
            not_previous,
            not_previous,
            Some("other_process"),
        ),
        (
            "another process took the kubelet API's while the previous version let go",
            true,
            ApiHolder::PreviousThenOther,
            false,
            not_previous,
            not_previous,
            Some("other_process"),
        ),
        (
            "another process holds the kubelet API's, no previous version",
            false,
            ApiHolder::Other,
            false,
            "waiting for --listen-address",
            "{other}",
            None,
        ),
    ];
    for (what, previous, api_held, ready, readyz_words, log_words, counted) in cases {
        let site = ProcessSpec::new("standby-holders").prepare().await;
        let (api, admin) = free_addresses();
        let previous_admin = match previous {
            true => Some(answer_as_previous_version(
                tokio::net::TcpListener::bind(admin).await.unwrap(),
            )),
            false => None,
        };
        let mut previous_api =
            (api_held != ApiHolder::Other).then(|| std::net::TcpListener::bind(api).unwrap());
        let mut other = (api_held == ApiHolder::Other).then(|| Foreign::hold(api));
        let socket = site.dir.path().join("new-admin.sock");
        let args = [
            format!("--listen-address={api}"),
            format!("--admin-listen-address={admin}"),
            format!(
                "--handover-socket={}",
                handover_directory(&site.dir, 0o700).display()
            ),
            format!("--admin-socket={}", socket.display()),
        ];
        let log = || std::fs::read_to_string(site.dir.path().join("new.stderr")).unwrap();
        let new = site.start("new", &args);
        let scenario = async {
            if api_held == ApiHolder::PreviousThenOther {
                eventually("the new process stands by, ready", || async {
                    readyz(&site, &socket).await.0.then_some(())
                })
                .await;
                drop(previous_api.take());
                other = Some(Foreign::hold(api));
                previous_admin.as_ref().map(JoinHandle::abort);
            }
            let named = |words: &str| {
                let other = other.as_ref().map(Foreign::named).unwrap_or_default();
                words
                    .replace("{api}", &api.to_string())
                    .replace("{other}", &other)
            };
            let (readyz_words, log_words) = (named(readyz_words), named(log_words));
            let body = eventually(&format!("{what}: /readyz says {readyz_words}"), || async {
                let (ok, body) = readyz(&site, &socket).await;
                (ok == ready && body.contains(&readyz_words)).then_some(body)
            })
            .await;
            // The log says it, once whatever the probes, and the gauge counts it.
            eventually(&format!("{what}: the log says {log_words}"), || async {
                log().contains(&log_words).then_some(())
            })
            .await;
            if counted == Some("other_process") {
                assert_eq!(log().matches(&body).count(), 1, "{what}: {}", log());
            }
            let metrics = run(
                &site.dir,
                "admin-probe",
                &[
                    "admin-probe".to_owned(),
                    format!("--admin-socket={}", socket.display()),
                    "/metrics".to_owned(),
                ],
            )
            .await
            .stdout;
            for holder in ["previous_version", "other_process"] {
                let gauge = crate::support::metrics::total(
                    &metrics,
                    "kubelet_auth_proxy_standby",
                    &[("holder", holder)],
                );
                let expected = f64::from(u8::from(counted == Some(holder)));
                assert_eq!(gauge, expected, "{what}: {holder}");
            }
            // Once every holder lets go, the new process takes the addresses.
            drop(other.take());
            drop(previous_api.take());
            previous_admin.as_ref().map(JoinHandle::abort);
        };
        let (new, ()) = tokio::join!(new, scenario);
        assert_eq!(new.addr(), api, "{what}");
        let alice = site.client(api, "alice", H2_AND_HTTP1);
        assert_eq!(alice.get("/pods").await.status, StatusCode::OK, "{what}");
        let metrics = plain_get(new.admin_addr(), "/metrics").await.text();
        let standing_by =
            crate::support::metrics::total(&metrics, "kubelet_auth_proxy_standby", &[]);
        assert_eq!(standing_by, 0.0, "{what}: still counted standing by");
    }
}

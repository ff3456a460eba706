//! Hot reload under live traffic. While a background load runs (long-lived HTTP/2 and HTTP/1.1
//! connections, and a new connection per request), the serving certificate is rotated (written in
//! place, and swapped as a Kubernetes volume), the client CA bundle is replaced, and the policy
//! changes; broken files keep the previous version in force. Every change must be picked up
//! without a restart, and no request of the load may fail.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::StatusCode;
use notify::event::{AccessKind, EventKind};
use notify::{RecursiveMode, Watcher};

use crate::support::client::{
    ANY_TLS, Client, Connection, H2_AND_HTTP1, HTTP1_ONLY, Identity, Reply, empty, request,
};
use crate::support::eventually;
use crate::support::harness::{Harness, ProxySpec, Subject, grant};
use crate::support::load::Load;
use crate::support::pki::{Authority, CertSpec, Issued, common_name_of, serial_of};
use crate::support::process::ProcessSpec;

const RELOADS: &str = "kubelet_auth_proxy_config_reloads_total";
/// PEM markers around something that is not base64 of a certificate.
const GARBAGE_PEM: &str =
    "-----BEGIN CERTIFICATE-----\nthis is not a certificate!\n-----END CERTIFICATE-----\n";

/// Starts the background load: `loader` (a certificate of the test CA) reading `/pods`.
fn start_load(h: &Harness) -> Load {
    let loader = h.ca.issue(&CertSpec::client("loader"));
    Load::start(
        h.ca.cert(),
        h.addr(),
        &Identity::of(&loader),
        "/pods",
        "PodList",
    )
}

/// Starts the proxy of `spec` and the background load, and lets the load get going.
async fn start_under_load(spec: ProxySpec) -> (Harness, Load) {
    let h = spec.start().await;
    let load = start_load(&h);
    load.advance(20).await;
    (h, load)
}

/// [`start_under_load`] with AlwaysAllow and a CA of its own in the client CA bundle after the
/// test CA; returns that CA, and another one, not trusted yet, for the bundle that replaces it.
async fn start_with_a_second_ca() -> (Harness, Load, Authority, Authority) {
    let first = Authority::root("CA in the first bundle");
    let next = Authority::root("CA of the next bundle");
    let (h, load) = start_under_load(ProxySpec::always_allow(&[]).also_trust(first.pem())).await;
    (h, load, first, next)
}

/// Lets the load run a little longer, asserts that none of its requests failed across `change`,
/// stops it and shuts the proxy down.
async fn end_load(h: Harness, load: Load, change: &str) {
    load.advance(20).await;
    load.stop().await.assert_no_failures(change);
    h.shutdown().await;
}

/// The proxy authorizing by [`policy_with_log_reader`], `erin` reading the logs.
fn policy_of_erin() -> ProxySpec {
    ProxySpec::new(&["--authorization-mode=Policy"]).policy(&policy_with_log_reader("erin"))
}

/// Rotates the serving pair in place as an operator or cert-manager does (the key, then the
/// certificate) to a certificate for `common_name`, and returns it.
fn rotate_in_place(h: &Harness, common_name: &str) -> Issued {
    let rotated = h.ca.issue(&CertSpec::server().common_name(common_name));
    std::fs::write(h.serving_key_file(), rotated.key_pem()).unwrap();
    std::fs::write(h.serving_cert_file(), rotated.chain_pem()).unwrap();
    rotated
}

/// Waits until `client` is answered 200 for `GET path`: `what` took effect.
async fn until_ok(client: &Client, path: &str, what: &str) {
    eventually(what, || async move {
        (client.get(path).await.status == StatusCode::OK).then_some(())
    })
    .await;
}

/// `kubelet_auth_proxy_config_reloads_total{target, result}`.
async fn reloads(h: &Harness, target: &str, result: &str) -> f64 {
    h.metric(RELOADS, &[("target", target), ("result", result)])
        .await
}

/// Makes `change` (breaking a file of `target`) and waits until the failed reload it causes is
/// counted.
async fn fail_reload(h: &Harness, target: &str, change: impl FnOnce()) {
    let before = reloads(h, target, "failed").await;
    change();
    eventually(&format!("a failed {target} reload is counted"), || async {
        (reloads(h, target, "failed").await > before).then_some(())
    })
    .await;
}

/// A reloaded file broken, then fixed: while broken (each of the ways given, in turn), the
/// previous version stays in force, `kept` served `GET path` and `next` refused with `refusal`;
/// once fixed, `next` is served and `kept` refused.
struct BrokenThenFixed<'a> {
    /// The reload target (`client_ca`, `policy`).
    target: &'a str,
    path: &'a str,
    kept: &'a Client,
    next: &'a Client,
    refusal: StatusCode,
}

impl BrokenThenFixed<'_> {
    /// Writes each of `broken` with `write`, then `fixed`, checking the answers after each, while
    /// `load` runs.
    async fn check(
        &self,
        h: &Harness,
        load: &Load,
        write: impl Fn(&str),
        broken: &[&str],
        fixed: &str,
    ) {
        let Self {
            target,
            path,
            kept,
            next,
            refusal,
        } = *self;
        for broken in broken {
            fail_reload(h, target, || write(broken)).await;
            assert_eq!(kept.get(path).await.status, StatusCode::OK, "{broken:?}");
            assert_eq!(next.get(path).await.status, refusal, "{broken:?}");
            load.advance(20).await;
        }

        let applied = reloads(h, target, "applied").await;
        write(fixed);
        until_ok(next, path, &format!("the fixed {target} is applied")).await;
        assert_eq!(kept.get(path).await.status, refusal);
        assert!(reloads(h, target, "applied").await > applied);
    }
}

/// Replaces `path` at once (a new file renamed over it), as `sed -i`, config management and
/// Kubernetes volumes do. Policy files are replaced this way here: a reload can read a file
/// rewritten in place between its truncation and its new contents, and an empty file is a valid
/// policy with no rules, so every request would be denied until the next reload (and for good if
/// the new contents are broken): see `a_policy_rewritten_in_place_never_leaves_no_rules_in_force`.
fn replace_file(path: &Path, contents: &str) {
    let staged = path.with_extension("staged");
    std::fs::write(&staged, contents).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

/// `GET path` on an open connection.
async fn get_on(conn: &mut Connection, path: &str) -> Reply {
    let response = conn
        .send(request("GET", path).body(empty()).unwrap())
        .await
        .unwrap_or_else(|e| panic!("GET {path} on an open connection: {e}"));
    Reply::read(response).await.unwrap()
}

/// A client of `ca`'s certificate for `name` speaking `alpn`, trusting the proxy's CA.
fn client_of(h: &Harness, ca: &Authority, name: &str, alpn: &[&[u8]]) -> Client {
    let cert = ca.issue(&CertSpec::client(name));
    Client::configured(h.ca.cert(), h.addr(), Identity::of(&cert), alpn, ANY_TLS)
}

/// Waits until new connections are served `expected`, and checks it by subject and serial.
async fn wait_for_serving(client: &Client, expected: &Issued, common_name: &str) {
    let leaf = expected.leaf();
    let served = eventually(
        &format!("new connections are served {common_name}"),
        || async move {
            let conn = client.connect().await.unwrap();
            (conn.peer_certificate() == leaf).then(|| conn.peer_certificate().clone())
        },
    )
    .await;
    assert_eq!(common_name_of(&served), common_name);
    assert_eq!(serial_of(&served), serial_of(leaf));
}

#[tokio::test]
async fn a_serving_certificate_rewritten_in_place_is_served_to_new_connections() {
    let (h, load) = start_under_load(ProxySpec::always_allow(&[])).await;
    let alice = h.user("alice", &[]);
    let mut opened_before = alice.connect().await.unwrap();
    assert_eq!(opened_before.peer_certificate(), h.serving().leaf());
    assert_eq!(
        common_name_of(opened_before.peer_certificate()),
        "kubelet-auth-proxy-e2e"
    );

    let rotated = rotate_in_place(&h, "rotated-in-place");
    wait_for_serving(&alice, &rotated, "rotated-in-place").await;
    assert_ne!(serial_of(rotated.leaf()), serial_of(h.serving().leaf()));

    // The connection opened before the rotation keeps working on its own handshake.
    let reply = get_on(&mut opened_before, "/pods").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(opened_before.peer_certificate(), h.serving().leaf());
    assert!(reloads(&h, "serving_certificate", "applied").await >= 1.0);

    end_load(h, load, "serving certificate rewritten in place").await;
}

#[tokio::test]
async fn a_serving_certificate_swapped_in_a_kubernetes_volume_is_served_to_new_connections() {
    let (mut h, load) = start_under_load(ProxySpec::always_allow(&[]).serving_volume()).await;
    let alice = h.user("alice", &[]);
    let mut opened_before = alice.connect().await.unwrap();
    assert_eq!(opened_before.peer_certificate(), h.serving().leaf());

    // Twice: the second swap proves the watch survives the removal of the first directory.
    for name in ["secret-version-2", "secret-version-3"] {
        let rotated = h.ca.issue(&CertSpec::server().common_name(name));
        let files = [
            ("tls.crt", rotated.chain_pem()),
            ("tls.key", rotated.key_pem()),
        ];
        h.serving_volume().update(&files);
        wait_for_serving(&alice, &rotated, name).await;
        let reply = get_on(&mut opened_before, "/pods").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        load.advance(20).await;
    }
    assert!(
        std::fs::symlink_metadata(h.serving_cert_file())
            .unwrap()
            .file_type()
            .is_symlink(),
        "the flag names the volume's symlink"
    );
    assert!(reloads(&h, "serving_certificate", "applied").await >= 2.0);
    end_load(h, load, "serving certificate swapped in a volume").await;
}

#[tokio::test]
async fn a_replaced_client_ca_admits_the_new_ca_and_refuses_the_removed_one_on_open_connections() {
    let (h, load, removed, added) = start_with_a_second_ca().await;

    let carol = client_of(&h, &added, "carol", H2_AND_HTTP1);
    assert_eq!(carol.get("/pods").await.status, StatusCode::UNAUTHORIZED);
    let mut bob_connections = Vec::new();
    for alpn in [H2_AND_HTTP1, HTTP1_ONLY] {
        let mut conn = client_of(&h, &removed, "bob", alpn)
            .connect()
            .await
            .unwrap();
        assert_eq!(get_on(&mut conn, "/pods").await.status, StatusCode::OK);
        bob_connections.push(conn);
    }

    std::fs::write(h.client_ca_file(), h.ca.pem() + &added.pem()).unwrap();
    until_ok(&carol, "/pods", "a client of the added CA is accepted").await;
    // The connections opened under the old bundle are verified again: 401 on the same
    // connections, which stay usable.
    for conn in &mut bob_connections {
        let version = conn.version();
        for _ in 0..2 {
            let reply = get_on(conn, "/pods").await;
            assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{version:?}");
        }
    }
    let bob = client_of(&h, &removed, "bob", H2_AND_HTTP1);
    assert_eq!(bob.get("/pods").await.status, StatusCode::UNAUTHORIZED);
    assert!(reloads(&h, "client_ca", "applied").await >= 1.0);

    end_load(h, load, "client CA replaced").await;
}

/// The load's permission, and `subject` reading node logs.
fn policy_with_log_reader(subject: &str) -> String {
    format!(
        "{}---\n{}",
        grant(
            "load",
            &["nodes/pods"],
            &["get"],
            &[Subject::User("loader")]
        ),
        grant(
            "log-reader",
            &["nodes/log"],
            &["get"],
            &[Subject::User(subject)]
        ),
    )
}

#[tokio::test]
async fn a_policy_change_grants_and_revokes_without_a_restart() {
    let (h, load) = start_under_load(policy_of_erin()).await;
    let dave = h.user("dave", &[]);
    let erin = h.user("erin", &[]);
    assert_eq!(
        dave.get("/logs/messages").await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(erin.get("/logs/messages").await.status, StatusCode::OK);
    let mut erin_open = erin.connect().await.unwrap();
    assert_eq!(
        get_on(&mut erin_open, "/logs/messages").await.status,
        StatusCode::OK
    );

    replace_file(&h.policy_file(), &policy_with_log_reader("dave"));
    until_ok(&dave, "/logs/messages", "the new grant takes effect").await;
    // The whole policy was swapped at once: the old grant is gone, on open connections too.
    assert_eq!(
        erin.get("/logs/messages").await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        get_on(&mut erin_open, "/logs/messages").await.status,
        StatusCode::FORBIDDEN
    );
    assert!(reloads(&h, "policy", "applied").await >= 1.0);

    end_load(h, load, "policy changed").await;
}

#[tokio::test]
async fn a_broken_serving_certificate_keeps_the_previous_one_until_fixed() {
    let (h, load) = start_under_load(ProxySpec::always_allow(&[])).await;
    let alice = h.user("alice", &[]);
    let original = h.serving().leaf();

    let rotated = h.ca.issue(&CertSpec::server().common_name("fixed"));
    // Garbage, then half a rotation: a new certificate next to the old key is not a usable pair
    // either.
    for broken in [GARBAGE_PEM.to_owned(), rotated.chain_pem()] {
        fail_reload(&h, "serving_certificate", || {
            std::fs::write(h.serving_cert_file(), &broken).unwrap()
        })
        .await;
        let conn = alice.connect().await.unwrap();
        assert_eq!(
            conn.peer_certificate(),
            original,
            "the old certificate stays"
        );
        assert_eq!(alice.get("/pods").await.status, StatusCode::OK);
        load.advance(20).await;
    }

    let applied = reloads(&h, "serving_certificate", "applied").await;
    std::fs::write(h.serving_key_file(), rotated.key_pem()).unwrap();
    wait_for_serving(&alice, &rotated, "fixed").await;
    assert!(reloads(&h, "serving_certificate", "applied").await > applied);

    end_load(h, load, "broken serving certificate").await;
}

#[tokio::test]
async fn a_broken_client_ca_keeps_the_previous_bundle_until_fixed() {
    let (h, load, kept, added) = start_with_a_second_ca().await;
    let bob = client_of(&h, &kept, "bob", H2_AND_HTTP1);
    let carol = client_of(&h, &added, "carol", H2_AND_HTTP1);
    assert_eq!(bob.get("/pods").await.status, StatusCode::OK);

    // The previous bundle is in force, for new connections too.
    let expected = BrokenThenFixed {
        target: "client_ca",
        path: "/pods",
        kept: &bob,
        next: &carol,
        refusal: StatusCode::UNAUTHORIZED,
    };
    let fixed = h.ca.pem() + &added.pem();
    let write = |contents: &str| std::fs::write(h.client_ca_file(), contents).unwrap();
    let broken = [GARBAGE_PEM, "not PEM at all\n", ""];
    expected.check(&h, &load, write, &broken, &fixed).await;

    end_load(h, load, "broken client CA").await;
}

#[tokio::test]
async fn a_broken_policy_keeps_the_previous_rules_until_fixed() {
    let (h, load) = start_under_load(policy_of_erin()).await;
    let dave = h.user("dave", &[]);
    let erin = h.user("erin", &[]);

    // A Role needs its namespace.
    let role =
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: r}\nrules: []\n";
    let broken = [
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nrules: [\n",
        "\t: : not yaml\n",
        role,
    ];
    let expected = BrokenThenFixed {
        target: "policy",
        path: "/logs/messages",
        kept: &erin,
        next: &dave,
        refusal: StatusCode::FORBIDDEN,
    };
    let write = |contents: &str| replace_file(&h.policy_file(), contents);
    let fixed = policy_with_log_reader("dave");
    expected.check(&h, &load, write, &broken, &fixed).await;

    end_load(h, load, "broken policy").await;
}

#[tokio::test]
async fn the_files_are_not_read_again_while_nothing_changes() {
    let h = ProxySpec::always_allow(&[]).start().await;
    // Opens of the proxy's files, by anyone: only the proxy reads them.
    let opens = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&opens);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event
            && matches!(event.kind, EventKind::Access(AccessKind::Open(_)))
        {
            counted.fetch_add(1, Ordering::SeqCst);
        }
    })
    .unwrap();
    watcher
        .watch(h.dir.path(), RecursiveMode::NonRecursive)
        .unwrap();

    let alice = h.user("alice", &[]);
    // A request lets the proxy's tasks run, its file watcher included.
    assert_eq!(alice.get("/pods").await.status, StatusCode::OK);
    let rotated = rotate_in_place(&h, "rotated-once");
    wait_for_serving(&alice, &rotated, "rotated-once").await;

    // Nothing changes from here on, so nothing needs reading (the safety-net check is once a
    // minute). The property is about a stretch of time, so it is observed over one: one reload
    // cycle (8 opens) may still be pending; the bug shows as about 20 opens a second.
    let before = opens.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_opens = opens.load(Ordering::SeqCst) - before;
    assert!(
        idle_opens <= 8,
        "the proxy opened its files {idle_opens} times in 2 s while nothing changed"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_change_right_after_start_is_picked_up() {
    let h = ProxySpec::always_allow(&[]).start().await;
    let rotated = rotate_in_place(&h, "rotated-at-start");
    wait_for_serving(&h.user("alice", &[]), &rotated, "rotated-at-start").await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_policy_rewritten_in_place_never_leaves_no_rules_in_force() {
    let (h, load) = start_under_load(policy_of_erin()).await;
    // A slow writer: the file is truncated, the proxy reloads it, then the new contents arrive.
    let reloaded = reloads(&h, "policy", "applied").await + reloads(&h, "policy", "failed").await;
    let file = std::fs::File::create(h.policy_file()).unwrap();
    let proxy = &h;
    eventually("the truncated policy file is reloaded", || async move {
        let now =
            reloads(proxy, "policy", "applied").await + reloads(proxy, "policy", "failed").await;
        (now > reloaded).then_some(())
    })
    .await;
    load.advance(20).await;
    drop(file);
    std::fs::write(h.policy_file(), policy_with_log_reader("dave")).unwrap();
    until_ok(
        &h.user("dave", &[]),
        "/logs/messages",
        "the new policy is applied",
    )
    .await;
    end_load(h, load, "policy rewritten in place").await;
}

/// With `RUST_LOG=trace` and the proxy's own log written into the directory of the files it
/// watches (the stand-in's stderr file sits beside the serving pair), neither the proxy nor its
/// file-watching library logs the events that log causes, so the log cannot feed itself.
#[tokio::test]
async fn a_log_written_next_to_the_watched_files_does_not_feed_itself() {
    let site = ProcessSpec::new("watch-own-log").prepare().await;
    let trace = std::ffi::OsStr::new("trace");
    let proxy = site
        .start_with_env("proxy", &[], &[("RUST_LOG", trace)])
        .await;
    // Let a feedback loop, if there were one, run for a while.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let settled = proxy.stderr().lines().count();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = proxy.stderr();
    assert!(!log.contains("inotify event"), "file events logged");
    let grown = log.lines().count() - settled;
    assert!(
        grown < 200,
        "an idle proxy wrote {grown} log lines in 2 s: {}",
        log.lines().rev().take(5).collect::<Vec<_>>().join("\n")
    );
}

/// `kubelet_auth_proxy_certificate_expiration_timestamp_seconds` of the serving chain's leaf.
async fn serving_expiry(h: &Harness) -> f64 {
    h.metric(
        "kubelet_auth_proxy_certificate_expiration_timestamp_seconds",
        &[("role", "serving"), ("index", "0")],
    )
    .await
}

#[tokio::test]
async fn certificate_expiry_and_the_last_reload_follow_a_rotation() {
    let h = ProxySpec::always_allow(&[]).start().await;
    // The harness's certificates are valid until 2999-01-01.
    eventually("the serving certificate's expiry is exported", || async {
        (serving_expiry(&h).await == 32_472_144_000.0).then_some(())
    })
    .await;
    let client_ca = h
        .metric(
            "kubelet_auth_proxy_certificate_expiration_timestamp_seconds",
            &[("role", "client_ca")],
        )
        .await;
    assert!(client_ca > 0.0, "the client CA bundle's certificates too");
    let reloaded = "kubelet_auth_proxy_config_last_reload_success_timestamp_seconds";
    let file = h.serving_cert_file().display().to_string();
    let labels = [("target", "serving_certificate"), ("file", file.as_str())];
    let started = h.metric(reloaded, &labels).await;
    assert!(started > 0.0, "set at start for every watched file");

    // Rotated to a certificate that expired on 2001-01-01: what an expiry alert must catch.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let expired =
        h.ca.issue(&CertSpec::server().validity(crate::support::pki::Validity::Expired));
    std::fs::write(h.serving_key_file(), expired.key_pem()).unwrap();
    std::fs::write(h.serving_cert_file(), expired.chain_pem()).unwrap();
    eventually("the rotated certificate's expiry is exported", || async {
        (serving_expiry(&h).await == 978_307_200.0).then_some(())
    })
    .await;
    let rotated = h.metric(reloaded, &labels).await;
    assert!(
        rotated > started,
        "the last reload moved: {started} -> {rotated}"
    );
}

//! The binary as an operator runs it: a configuration error exits with status 2 and one stderr
//! line naming the flag (and the file), and `demo --once` tours the proxy and exits 0.

use std::path::PathBuf;
use std::time::Duration;

use crate::support::TempDir;
use crate::support::assert_contains;
use crate::support::client::H2_AND_HTTP1;
use crate::support::client::plain_get;
use crate::support::pki::{Authority, CertSpec};
use crate::support::process::{ProcessSpec, run, run_within};
use crate::test_data::{RBAC_DUMP, text};

/// Files of a configuration that would start: serving certificate and key, client CA.
struct Files {
    dir: TempDir,
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

fn files() -> Files {
    let dir = TempDir::new("cli");
    let ca = Authority::root("cli CA");
    let serving = ca.issue(&CertSpec::server());
    Files {
        cert: dir.write("serving.crt", serving.chain_pem()),
        key: dir.write("serving.key", serving.key_pem()),
        ca: dir.write("ca.crt", ca.pem()),
        dir,
    }
}

/// A complete, valid command line, with `overrides` replacing flags of the same name.
fn command_line(files: &Files, overrides: &[String]) -> Vec<String> {
    let base = [
        "--upstream=http://127.0.0.1:1".to_owned(),
        format!("--tls-cert-file={}", files.cert.display()),
        format!("--tls-private-key-file={}", files.key.display()),
        format!("--client-ca-file={}", files.ca.display()),
        "--authorization-mode=AlwaysAllow".to_owned(),
        "--node-name=node-a".to_owned(),
        "--listen-address=127.0.0.1:0".to_owned(),
        "--admin-listen-address=127.0.0.1:0".to_owned(),
    ];
    let flag_name = |arg: &str| arg.split('=').next().unwrap().to_owned();
    let mut args: Vec<String> = base
        .into_iter()
        .filter(|arg| !overrides.iter().any(|o| flag_name(o) == flag_name(arg)))
        .collect();
    args.extend(overrides.iter().cloned());
    args
}

/// `check-config` with [`command_line`].
fn check_config(files: &Files, overrides: &[String]) -> Vec<String> {
    let mut args = vec!["check-config".to_owned()];
    args.extend(command_line(files, overrides));
    args
}

/// Runs each `(overrides, words)` case and checks: exit status 2, exactly one stderr line, and
/// every word (the flag, the file) in it.
async fn assert_config_errors(files: &Files, cases: &[(Vec<String>, Vec<String>)]) {
    for (i, (overrides, words)) in cases.iter().enumerate() {
        let args = command_line(files, overrides);
        let done = run(&files.dir, &format!("case{i}"), &args).await;
        assert_eq!(
            done.status.code(),
            Some(2),
            "{overrides:?}: {}",
            done.stderr
        );
        assert_eq!(
            done.stderr.lines().count(),
            1,
            "{overrides:?}: one line expected, got:\n{}",
            done.stderr
        );
        for word in words {
            assert!(
                done.stderr.contains(word.as_str()),
                "{overrides:?}: {word:?} not in {:?}",
                done.stderr
            );
        }
    }
}

#[tokio::test]
async fn bad_files_and_settings_exit_2_with_one_line() {
    let files = files();
    let missing = files.dir.path().join("missing.crt").display().to_string();
    let garbage = files
        .dir
        .write("garbage.crt", "this is not PEM\n")
        .display()
        .to_string();
    let garbage_key = files
        .dir
        .write(
            "garbage.key",
            "-----BEGIN PRIVATE KEY-----\n!!!\n-----END PRIVATE KEY-----\n",
        )
        .display()
        .to_string();
    let directory = files.dir.path().display().to_string();
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let cases = vec![
        (
            vec![format!("--tls-cert-file={missing}")],
            s(&["--tls-cert-file", &missing]),
        ),
        (
            vec![format!("--tls-cert-file={garbage}")],
            s(&["--tls-cert-file", &garbage]),
        ),
        (
            vec![format!("--tls-private-key-file={garbage_key}")],
            s(&["--tls-private-key-file", &garbage_key]),
        ),
        (
            vec![format!("--client-ca-file={directory}")],
            s(&["--client-ca-file", &directory]),
        ),
        (
            s(&["--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_NO_SUCH_SUITE"]),
            s(&["--tls-cipher-suites", "TLS_NO_SUCH_SUITE"]),
        ),
        (
            s(&["--tls-min-version=VersionTLS10"]),
            s(&["--tls-min-version", "VersionTLS10"]),
        ),
        (
            s(&["--authorization-mode=Policy"]),
            s(&["--authorization-policy-file"]),
        ),
    ];
    assert_config_errors(&files, &cases).await;
}

#[tokio::test]
async fn bad_flag_values_exit_2_with_one_line() {
    let files = files();
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let cases = vec![
        (
            s(&["--authorization-mode=AlwaysAllow,Magic"]),
            s(&["--authorization-mode", "Magic"]),
        ),
        (
            s(&["--header-read-timeout=10"]),
            s(&["--header-read-timeout", "10"]),
        ),
        (
            s(&[
                "--forward-identity-headers",
                "--upstream=http://192.0.2.10:10255",
            ]),
            s(&["--forward-identity-headers", "clear text", "https://"]),
        ),
        (
            s(&[
                "--upstream-max-requests-inflight=10",
                "--upstream-max-requests-inflight-per-user=11",
            ]),
            s(&["--upstream-max-requests-inflight-per-user", "11"]),
        ),
    ];
    assert_config_errors(&files, &cases).await;
}

#[tokio::test]
async fn bad_flag_values_exit_2_naming_the_flag() {
    let files = files();
    for (i, (arg, flag)) in [
        (
            "--authorization-mode=AlwaysAllow,Magic",
            "--authorization-mode",
        ),
        ("--header-read-timeout=10", "--header-read-timeout"),
        ("--header-read-timeout=-1s", "--header-read-timeout"),
    ]
    .into_iter()
    .enumerate()
    {
        let args = command_line(&files, &[arg.to_owned()]);
        let done = run(&files.dir, &format!("flag{i}"), &args).await;
        assert_eq!(done.status.code(), Some(2), "{arg}: {}", done.stderr);
        let first = done.stderr.lines().next().unwrap_or_default();
        assert!(first.contains(flag), "{arg}: {first:?}");
    }
}

#[tokio::test]
async fn demo_once_exits_0() {
    let dir = TempDir::new("demo");
    let done = run_within(
        &dir,
        "demo",
        &["demo".to_owned(), "--once".to_owned()],
        Duration::from_secs(120),
    )
    .await;
    assert!(done.status.success(), "demo --once failed: {}", done.stderr);
    // The table's answer column lines up on every row, the longest request's included.
    let mut lines = done.stdout.lines().skip_while(|l| !l.starts_with("who "));
    let header = lines.next().expect("the table header");
    let end = header.find("answer").expect("an answer column") + "answer".len();
    let rows: Vec<&str> = lines
        .take_while(|l| !l.is_empty())
        .filter(|l| !l.starts_with(' '))
        .collect();
    assert!(rows.len() > 10, "{}", done.stdout);
    // The token path: a bearer token authenticated by TokenReview and authorized by
    // SubjectAccessReview at the demo's stand-in API server, and a forged one refused.
    let token_rows: Vec<&&str> = rows.iter().filter(|r| r.contains("bearer token")).collect();
    assert!(
        token_rows.iter().any(|r| r.contains(" 200 "))
            && token_rows.iter().any(|r| r.contains(" 401 ")),
        "{}",
        done.stdout
    );
    assert_contains(&done.stdout, "The API server was asked 2 TokenReview(s)");
    for row in rows {
        let code = row.get(end - 3..end).unwrap_or_default();
        assert!(
            code.bytes().all(|b| b.is_ascii_digit()),
            "misaligned: {row}"
        );
    }
}

/// `check-config` only reads: with three rotated audit logs and `--audit-log-maxbackup=1` it
/// removes none of them, and a missing audit log is not created; a log whose directory is
/// missing is still an error naming the flag.
#[tokio::test]
async fn check_config_changes_nothing_on_disk() {
    let files = files();
    let logs = files.dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let kept = [
        "audit.log",
        "audit-2026-01-01T00-00-00.000.log",
        "audit-2026-01-02T00-00-00.000.log",
        "audit-2026-01-03T00-00-00.000.log",
    ];
    for name in kept {
        std::fs::write(logs.join(name), "{}\n").unwrap();
    }
    let listing = |dir: &std::path::Path| {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let before = listing(&logs);
    for (i, log) in ["audit.log", "new.log"].into_iter().enumerate() {
        let args = check_config(
            &files,
            &[
                format!("--audit-log-path={}", logs.join(log).display()),
                "--audit-log-maxbackup=1".to_owned(),
            ],
        );
        let done = run(&files.dir, &format!("check{i}"), &args).await;
        done.assert_code(0);
        assert_eq!(
            listing(&logs),
            before,
            "check-config changed {}",
            logs.display()
        );
    }
    let args = check_config(
        &files,
        &[format!(
            "--audit-log-path={}",
            logs.join("missing/audit.log").display()
        )],
    );
    let done = run(&files.dir, "check-missing-dir", &args).await;
    done.assert_code(2);
    assert_contains(&done.stderr, "--audit-log-path");
}

/// An address that is not this host's, or a privileged port, is a configuration error: one line
/// naming the flag and the address with a hint, status 2, no backtrace even when asked for.
#[tokio::test]
async fn an_address_that_cannot_be_bound_names_its_flag_and_exits_2() {
    let files = files();
    for (flag, address, words) in [
        (
            "--listen-address",
            "192.0.2.1:10250",
            "not an address of this host",
        ),
        (
            "--admin-listen-address",
            "192.0.2.1:10251",
            "not an address of this host",
        ),
    ] {
        let args = command_line(&files, &[format!("{flag}={address}")]);
        let backtrace = std::ffi::OsStr::new("1");
        let done = crate::support::process::run_with_env(
            &files.dir,
            &format!("bind{flag}"),
            &args,
            &[("RUST_BACKTRACE", backtrace)],
        )
        .await;
        let (status, stderr) = (done.status, done.stderr);
        assert_eq!(status.code(), Some(2), "{stderr}");
        let last = stderr.lines().last().unwrap_or_default();
        assert!(
            last.starts_with(&format!(
                "kubelet-auth-proxy: {flag} {address}: cannot listen: "
            )),
            "{stderr}"
        );
        assert!(last.contains(words), "{last}");
        assert!(!stderr.contains("stack backtrace"), "{stderr}");
    }
}

/// While another process holds the listen address (the kubelet during a rollout), the proxy
/// retries, says why, answers its probes (alive, not ready), and serves as soon as the address is
/// free.
#[tokio::test]
async fn a_listen_address_in_use_is_retried_until_it_is_free() {
    let files = files();
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = holder.local_addr().unwrap();
    let args = command_line(&files, &[format!("--listen-address={address}")]);
    let log = files.dir.path().join("in-use.stderr");
    let start = crate::support::process::ProxyProcess::start(&files.dir, "in-use", &args, &[]);
    let release = async move {
        crate::support::eventually("the retry to be logged", || {
            let logged = std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("address in use; retrying");
            async move { logged.then_some(()) }
        })
        .await;
        let admin = admin_address(&std::fs::read_to_string(&log).unwrap());
        let health = plain_get(admin, "/healthz").await;
        assert_eq!(health.status, http::StatusCode::OK);
        let ready = plain_get(admin, "/readyz").await;
        assert_eq!(ready.status, http::StatusCode::SERVICE_UNAVAILABLE);
        assert_contains(&ready.text(), "waiting for --listen-address");
        drop(holder);
        admin
    };
    let (proxy, admin) = tokio::join!(start, release);
    assert_eq!(proxy.addr(), address);
    assert_eq!(proxy.admin_addr(), admin);
    assert_eq!(
        plain_get(admin, "/readyz").await.status,
        http::StatusCode::OK
    );
}

/// `--listen-retry-timeout` bounds the wait: still in use after it, the proxy exits 2 naming
/// the flag.
#[tokio::test]
async fn a_listen_address_still_in_use_after_the_retry_timeout_is_an_error() {
    let files = files();
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = holder.local_addr().unwrap();
    let args = command_line(
        &files,
        &[
            format!("--listen-address={address}"),
            "--listen-retry-timeout=1s".to_owned(),
        ],
    );
    let done = run(&files.dir, "still-in-use", &args).await;
    done.assert_code(2);
    let last = done.stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!(
            "kubelet-auth-proxy: --listen-address {address}: cannot listen: "
        )),
        "{}",
        done.stderr
    );
    drop(holder);
}

/// The admin address from the proxy's JSON log.
fn admin_address(log: &str) -> std::net::SocketAddr {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find_map(|event| {
            event["fields"]["admin_addr"]
                .as_str()
                .and_then(|addr| addr.parse().ok())
        })
        .expect("the admin listener's address is logged")
}

/// A single-value flag given twice takes the last value, as the kubelet's flags do.
#[tokio::test]
async fn the_last_of_a_repeated_flag_wins() {
    let files = files();
    let mut args = check_config(
        &files,
        &[
            "--node-name=first".to_owned(),
            "--idle-connection-timeout=10s".to_owned(),
        ],
    );
    args.extend([
        "--node-name=second".to_owned(),
        "--idle-connection-timeout=20s".to_owned(),
    ]);
    let done = run(&files.dir, "repeated", &args).await;
    done.assert_code(0);
    assert_contains(&done.stdout, "for node \"second\"");
}

/// A cipher list from a CIS-hardened KubeletConfiguration names `TLS_RSA_*` suites beside ECDHE
/// ones: the proxy starts, skipping what rustls cannot offer and saying which; a list of such
/// suites only is refused, naming them.
#[tokio::test]
async fn cipher_suites_rustls_cannot_offer_are_skipped_with_a_warning() {
    let files = files();
    let cis = "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,\
               TLS_RSA_WITH_AES_256_GCM_SHA384,TLS_RSA_WITH_AES_128_GCM_SHA256";
    let args = check_config(&files, &[cis.to_owned()]);
    let done = run(&files.dir, "cis", &args).await;
    done.assert_code(0);
    assert_contains(
        &done.stderr,
        "TLS_RSA_WITH_AES_256_GCM_SHA384,TLS_RSA_WITH_AES_128_GCM_SHA256",
    );
    let args = check_config(
        &files,
        &["--tls-cipher-suites=TLS_RSA_WITH_AES_128_GCM_SHA256".to_owned()],
    );
    let done = run(&files.dir, "rsa-only", &args).await;
    done.assert_code(2);
    assert_contains(
        &done.stderr,
        "--tls-cipher-suites: cipher suite TLS_RSA_WITH_AES_128_GCM_SHA256",
    );
}

/// A key that is not the certificate's is named with its flag and file, and the certificate's,
/// for the serving pair and for the client pair towards the kubelet.
#[tokio::test]
async fn a_key_that_is_not_the_certificates_is_named() {
    let files = files();
    let ca = Authority::root("other CA");
    let other = ca.issue(&CertSpec::server());
    let other_key = files.dir.write("other.key", other.key_pem());
    let (key, cert) = (
        other_key.display().to_string(),
        files.cert.display().to_string(),
    );
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let cases = vec![
        (
            vec![format!("--tls-private-key-file={key}")],
            s(&[
                &format!("--tls-private-key-file {key}: does not belong to the certificate"),
                &format!("--tls-cert-file {cert}"),
            ]),
        ),
        (
            vec![
                "--upstream=https://127.0.0.1:1".to_owned(),
                format!("--upstream-ca-file={}", files.ca.display()),
                format!("--upstream-client-cert-file={cert}"),
                format!("--upstream-client-key-file={key}"),
            ],
            s(&[
                &format!("--upstream-client-key-file {key}: does not belong to the certificate"),
                &format!("--upstream-client-cert-file {cert}"),
            ]),
        ),
    ];
    assert_config_errors(&files, &cases).await;
}

/// Configurations that load but should be looked at are warned about, naming the flag;
/// `--strict` refuses them (for CI). The shipped policies pass `--strict`.
#[tokio::test]
async fn check_config_warns_and_strict_refuses() {
    let files = files();
    let anonymous_exec = files.dir.write(
        "anonymous-exec.yaml",
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n\
         metadata: {name: open}\n\
         rules: [{apiGroups: [\"\"], resources: [\"nodes/*\", nodes/proxy], verbs: [create]}]\n\
         ---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n\
         metadata: {name: open}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: open}\n\
         subjects: [{kind: Group, name: \"system:unauthenticated\"}]\n",
    );
    let policy = format!("--authorization-policy-file={}", anonymous_exec.display());
    // Anonymous callers may exec into the pods of team-a: a RoleBinding, which only the
    // pod-level sets of --pod-scoped-authz reach.
    let namespaced = files.dir.write(
        "namespaced.yaml",
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n\
         metadata: {name: pod-exec}\n\
         rules: [{apiGroups: [\"\"], resources: [pods/exec], verbs: [create]}]\n\
         ---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n\
         metadata: {name: open, namespace: team-a}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pod-exec}\n\
         subjects: [{kind: Group, name: \"system:unauthenticated\"}]\n",
    );
    let namespaced = format!("--authorization-policy-file={}", namespaced.display());
    let cases: [(Vec<String>, &[&str]); 5] = [
        (
            vec!["--anonymous-auth".to_owned()],
            &["--authorization-mode: AlwaysAllow lets every caller, anonymous ones included"],
        ),
        (
            vec!["--authorization-mode=Node".to_owned()],
            &["--authorization-mode: the chain Node can never allow a request"],
        ),
        (
            vec![
                "--anonymous-auth".to_owned(),
                "--authorization-mode=Node,Policy".to_owned(),
                policy,
            ],
            &[
                "--authorization-policy-file: ",
                "\"nodes/*\" is not a wildcard in RBAC",
                "--anonymous-auth: anonymous callers may run commands in containers (POST \
                 /exec/default/pod/container is allowed",
            ],
        ),
        (
            vec![
                "--authorization-mode=Node,Policy".to_owned(),
                namespaced.clone(),
            ],
            &[
                "--authorization-policy-file: 1 RoleBinding(s) never apply: kubelet requests have \
               no namespace, and only --pod-scoped-authz asks about pods in theirs",
            ],
        ),
        (
            vec![
                "--anonymous-auth".to_owned(),
                "--pod-scoped-authz".to_owned(),
                "--authorization-mode=Node,Policy".to_owned(),
                namespaced,
            ],
            &[
                "--anonymous-auth: anonymous callers may run commands in containers (POST \
               /exec/team-a/pod/container is allowed: RBAC: allowed by RoleBinding \"open/team-a\"",
            ],
        ),
    ];
    for (i, (overrides, words)) in cases.iter().enumerate() {
        let mut args = check_config(&files, overrides);
        let done = run(&files.dir, &format!("warn{i}"), &args).await;
        done.assert_code(0);
        for word in *words {
            assert!(
                done.stderr.contains(word),
                "{word:?} not in {}",
                done.stderr
            );
        }
        args.insert(1, "--strict".to_owned());
        let done = run(&files.dir, &format!("strict{i}"), &args).await;
        done.assert_code(2);
        assert_contains(&done.stderr, "refused by --strict");
        assert_eq!(done.stdout, "");
    }

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/policy");
    let mut shipped = vec!["--authorization-mode=Node,Policy".to_owned()];
    for policy in [
        "apiserver-kubelet-client.yaml",
        "metrics-scraper.yaml",
        "node-debuggers.yaml",
    ] {
        shipped.push(format!(
            "--authorization-policy-file={}",
            root.join(policy).display()
        ));
    }
    let mut args = vec!["check-config".to_owned(), "--strict".to_owned()];
    args.extend(command_line(&files, &shipped));
    let done = run(&files.dir, "shipped", &args).await;
    done.assert_code(0);
    assert!(!done.stderr.contains("warning"), "{}", done.stderr);
}

/// `--listen-address` repeated serves on each address (both families of a dual-stack node),
/// under one connection bound.
#[tokio::test]
async fn the_api_is_served_on_every_listen_address() {
    let site = ProcessSpec::new("dual-stack").prepare().await;
    // A serving certificate for both loopback addresses.
    let serving = site
        .ca
        .issue(&CertSpec::server().names(&["127.0.0.1", "127.0.0.2", "::1"]));
    site.dir.write("serving.crt", serving.chain_pem());
    site.dir.write("serving.key", serving.key_pem());
    // Two listeners need two free ports; the kernel gives them to listeners bound and dropped.
    let free = |address: &str| {
        std::net::TcpListener::bind(address)
            .unwrap()
            .local_addr()
            .unwrap()
    };
    // IPv6 loopback where the machine has it; otherwise a second IPv4 loopback address.
    let second = if std::net::TcpListener::bind("[::1]:0").is_ok() {
        "[::1]:0"
    } else {
        "127.0.0.2:0"
    };
    let (v4, v6) = (free("127.0.0.1:0"), free(second));
    let proxy = site
        .start(
            "proxy",
            &[
                format!("--listen-address={v4}"),
                format!("--listen-address={v6}"),
            ],
        )
        .await;
    assert_eq!(proxy.addr(), v4);
    for address in [v4, v6] {
        let client = site.client(address, "alice", H2_AND_HTTP1);
        assert_eq!(
            client.get("/pods").await.status,
            http::StatusCode::OK,
            "{address}"
        );
    }
}

/// `check-config` lists every problem it finds, one line each, not only the first.
#[tokio::test]
async fn check_config_reports_every_problem_in_one_run() {
    let files = files();
    let missing = files.dir.path().join("missing-ca.crt");
    let missing = missing.display();
    let args = check_config(
        &files,
        &[
            format!("--client-ca-file={missing}"),
            "--authorization-mode=Policy".to_owned(),
            "--upstream=ftp://kubelet".to_owned(),
            "--tls-min-version=VersionTLS10".to_owned(),
        ],
    );
    let done = run(&files.dir, "many", &args).await;
    done.assert_code(2);
    let lines: Vec<&str> = done.stderr.lines().collect();
    for flag in [
        "--client-ca-file",
        "--tls-min-version",
        "--authorization-policy-file",
        "--upstream",
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("kubelet-auth-proxy: {flag}"))),
            "{flag} not reported: {}",
            done.stderr
        );
    }
    assert_eq!(lines.len(), 4, "{}", done.stderr);
}

/// An IPv6 listen address serves IPv6 only, so the wildcard of one family coexists with the
/// kubelet on the other family's loopback (the setup that needs no per-node address) and both
/// wildcards can be served at once.
#[tokio::test]
async fn a_wildcard_listen_address_coexists_with_a_kubelet_on_the_other_loopback() {
    let files = files();
    let kubelet_v6 = std::net::TcpListener::bind("[::1]:0").unwrap();
    let port = kubelet_v6.local_addr().unwrap().port();
    let kubelet_v4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port_v6 = kubelet_v4.local_addr().unwrap().port();
    let both = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port_both = both.local_addr().unwrap().port();
    drop(both);
    for (label, addresses, reachable) in [
        (
            "beside-v6-kubelet",
            vec![format!("0.0.0.0:{port}")],
            format!("127.0.0.1:{port}"),
        ),
        (
            "beside-v4-kubelet",
            vec![format!("[::]:{port_v6}")],
            format!("[::1]:{port_v6}"),
        ),
        (
            "both-families",
            vec![format!("0.0.0.0:{port_both}"), format!("[::]:{port_both}")],
            format!("[::1]:{port_both}"),
        ),
    ] {
        let overrides: Vec<String> = addresses
            .iter()
            .map(|a| format!("--listen-address={a}"))
            .collect();
        let mut args = command_line(&files, &overrides);
        args.push("--listen-retry-timeout=0s".to_owned());
        let proxy =
            crate::support::process::ProxyProcess::start(&files.dir, label, &args, &[]).await;
        assert_eq!(
            plain_get(proxy.admin_addr(), "/readyz").await.status,
            http::StatusCode::OK,
            "{label}"
        );
        tokio::net::TcpStream::connect(&reachable)
            .await
            .unwrap_or_else(|e| panic!("{label}: {reachable}: {e}"));
    }
    drop((kubelet_v6, kubelet_v4));
}

/// A cluster's RBAC dump as the policy: `check-config` names the one rule meant for the kubelet
/// that cannot match (kubeadm's `get nodes`) and counts the hundreds of others in one note, which
/// `--strict` does not count.
#[tokio::test]
async fn a_cluster_rbac_dump_gets_one_warning_and_one_note() {
    let files = files();
    let dump = files.dir.write("rbac-dump.yaml", text(RBAC_DUMP));
    let overrides = [
        "--authorization-mode=Policy".to_owned(),
        format!("--authorization-policy-file={}", dump.display()),
    ];
    let mut args = check_config(&files, &overrides);
    let done = run(&files.dir, "dump", &args).await;
    done.assert_code(0);
    let lines: Vec<&str> = done
        .stderr
        .lines()
        .filter(|line| line.starts_with("kubelet-auth-proxy: "))
        .collect();
    assert_eq!(lines.len(), 2, "{}", done.stderr);
    assert!(
        lines[0].starts_with(&format!(
            "kubelet-auth-proxy: warning: --authorization-policy-file: {}:",
            dump.display()
        )) && lines[0].contains("ClusterRole \"kubeadm:get-nodes\" rules[0]: resource \"nodes\""),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].starts_with(
            "kubelet-auth-proxy: note: --authorization-policy-file: 50 more rule(s) in 16 \
             role(s) can never match a kubelet request"
        ),
        "{}",
        lines[1]
    );
    args.push("--strict".to_owned());
    let done = run(&files.dir, "dump-strict", &args).await;
    done.assert_code(2);
    assert_contains(&done.stderr, "1 warning(s), refused by --strict");
}

/// More serving threads than the process has CPUs works but is warned about, naming the flag and
/// the CPU count `check-config` read, and counted by `--strict`; the default (0) is not.
#[tokio::test]
async fn more_serving_threads_than_cpus_is_warned_about() {
    let files = files();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let too_many = cpus + 1;
    let mut args = check_config(&files, &[format!("--serving-threads={too_many}")]);
    let done = run(&files.dir, "threads", &args).await;
    done.assert_code(0);
    assert_contains(
        &done.stderr,
        &format!(
            "kubelet-auth-proxy: warning: --serving-threads: {too_many} serving threads on {cpus} CPU(s)"
        ),
    );
    args.push("--strict".to_owned());
    // Beside the warning every AlwaysAllow configuration gets.
    let done = run(&files.dir, "threads-strict", &args).await;
    done.assert_code(2);
    assert_contains(&done.stderr, "2 warning(s), refused by --strict");

    let mut args = vec!["check-config".to_owned(), "--strict".to_owned()];
    args.extend(command_line(&files, &["--serving-threads=0".to_owned()]));
    let done = run(&files.dir, "threads-default", &args).await;
    assert_contains(&done.stderr, "1 warning(s), refused by --strict");
    assert!(
        !done.stderr.contains("--serving-threads"),
        "{}",
        done.stderr
    );
}

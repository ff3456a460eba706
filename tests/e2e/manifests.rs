//! What ships besides the binary holds together: every Kubernetes manifest under `config/` parses
//! into its API type without losing a field (the API server would drop a misspelt one silently),
//! the local policies load and grant what their comments say, the example command lines (systemd
//! environment file, DaemonSet, `proxy.yaml`) are accepted and would start the proxy, the
//! KubeletConfiguration uses only documented fields, and `--version` names the build's commit.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use clap::{Args as _, FromArgMatches as _};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kubelet_auth_proxy::authn::User;
use kubelet_auth_proxy::authz::policy::PolicyAuthorizer;
use kubelet_auth_proxy::authz::{Attributes, Decision};
use kubelet_auth_proxy::config::duration::parse_go_duration;
use kubelet_auth_proxy::config::file as config_file;
use kubelet_auth_proxy::config::flags::{AuthorizationMode, ProxyFlags};
use kubelet_auth_proxy::config::listen;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::support::harness::parse_flags;
use crate::support::pki::{Authority, CertSpec};
use crate::support::{TempDir, process};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const BINARY: &str = env!("CARGO_BIN_EXE_kubelet-auth-proxy");
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Where the pod's service account volume (token, cluster CA) is mounted without being declared.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

pub(crate) fn file(relative: &str) -> PathBuf {
    Path::new(ROOT).join(relative)
}

pub(crate) fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Every YAML file under `config/`, sorted.
fn yaml_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                found.push(path);
            }
        }
    }
    let mut found = Vec::new();
    walk(&file("config"), &mut found);
    found.sort();
    found
}

/// The documents of a (multi-document) YAML file as JSON values; duplicate keys are an error.
fn documents(path: &Path) -> Vec<Value> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(&read(path))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(!documents.is_empty(), "{}: no document", path.display());
    documents
}

fn kind(document: &Value) -> &str {
    document["kind"].as_str().unwrap_or("")
}

/// The documents of `kind` in a file, typed.
fn typed<T: DeserializeOwned>(path: &Path, wanted: &str) -> Vec<T> {
    documents(path)
        .into_iter()
        .filter(|document| kind(document) == wanted)
        .map(|document| serde_json::from_value(document).unwrap())
        .collect()
}

/// Key paths of `original` that `round_tripped` lacks.
fn lost_keys(original: &Value, round_tripped: &Value, path: &str, lost: &mut Vec<String>) {
    match (original, round_tripped) {
        (Value::Object(original), Value::Object(round_tripped)) => {
            for (key, value) in original {
                let here = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match round_tripped.get(key) {
                    Some(kept) => lost_keys(value, kept, &here, lost),
                    None => lost.push(here),
                }
            }
        }
        (Value::Array(original), Value::Array(round_tripped)) => {
            for (index, value) in original.iter().enumerate() {
                let here = format!("{path}[{index}]");
                match round_tripped.get(index) {
                    Some(kept) => lost_keys(value, kept, &here, lost),
                    None => lost.push(here),
                }
            }
        }
        _ => {}
    }
}

/// Parses `document` as `T` (k8s-openapi checks apiVersion and kind, and ignores unknown fields)
/// and serializes it back; returns the keys that did not survive.
fn round_trip<T: DeserializeOwned + Serialize>(document: &Value) -> Result<Vec<String>, String> {
    let parsed: T = serde_json::from_value(document.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&parsed).map_err(|e| e.to_string())?;
    let mut lost = Vec::new();
    lost_keys(document, &back, "", &mut lost);
    Ok(lost)
}

#[test]
fn every_manifest_parses_into_its_api_type_without_losing_a_field() {
    let mut kinds_seen = BTreeSet::new();
    for path in yaml_files() {
        for (index, document) in documents(&path).iter().enumerate() {
            let kind = kind(document);
            let result = match kind {
                "DaemonSet" => round_trip::<DaemonSet>(document),
                "ServiceAccount" => round_trip::<ServiceAccount>(document),
                "ClusterRole" => round_trip::<ClusterRole>(document),
                "ClusterRoleBinding" => round_trip::<ClusterRoleBinding>(document),
                "ConfigMap" => round_trip::<ConfigMap>(document),
                "Secret" => round_trip::<Secret>(document),
                // Not Kubernetes objects; checked by their own tests below (the audit Policy
                // in audit_policy.rs).
                "ProxyConfiguration"
                | "KubeletConfiguration"
                | "PolicyCheck"
                | "Policy"
                | "AuthenticationConfiguration" => Ok(Vec::new()),
                // The Prometheus Operator's type, checked by monitoring.rs (the rules file
                // wrapped) and config/monitoring/test.sh (promtool); the rules file and its
                // promtool tests beside it have no kind.
                "PrometheusRule" => Ok(Vec::new()),
                "" if path.starts_with(file("config/monitoring")) => Ok(Vec::new()),
                other => panic!(
                    "{} document {index}: kind {other:?} has no check here; add its type",
                    path.display()
                ),
            };
            match result {
                Ok(lost) => assert!(
                    lost.is_empty(),
                    "{} document {index} ({kind}): fields unknown to the API: {lost:?}",
                    path.display()
                ),
                Err(e) => panic!("{} document {index} ({kind}): {e}", path.display()),
            }
            kinds_seen.insert(kind.to_owned());
        }
    }
    for expected in [
        "DaemonSet",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ProxyConfiguration",
        "KubeletConfiguration",
    ] {
        assert!(kinds_seen.contains(expected), "no {expected} under config/");
    }
}

#[test]
fn a_misspelt_field_is_caught_by_the_round_trip() {
    let document: Value = serde_saphyr::from_str(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: x}\n\
         rules:\n  - apiGroups: [\"\"]\n    resources: [nodes/stats]\n    verb: [get]\n",
    )
    .unwrap();
    assert_eq!(
        round_trip::<ClusterRole>(&document).unwrap(),
        ["rules[0].verb"]
    );
    let wrong_version = serde_json::json!({"apiVersion": "v1", "kind": "ClusterRole"});
    assert!(round_trip::<ClusterRole>(&wrong_version).is_err());
}

// --- Local policies -------------------------------------------------------------------------

fn policy_files() -> Vec<PathBuf> {
    let files: Vec<PathBuf> = yaml_files()
        .into_iter()
        .filter(|path| path.parent() == Some(&file("config/policy")))
        .collect();
    assert!(!files.is_empty(), "no policy under config/policy");
    files
}

fn user(name: &str, groups: &[&str]) -> User {
    User {
        name: name.to_owned(),
        uid: String::new(),
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        extra: BTreeMap::new(),
    }
}

#[test]
fn the_shipped_policies_load_and_grant_what_their_comments_say() {
    for path in policy_files() {
        PolicyAuthorizer::load(std::slice::from_ref(&path))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let policy = PolicyAuthorizer::load(&policy_files()).unwrap();

    let prometheus = user(
        "system:serviceaccount:monitoring:prometheus",
        &[
            "system:serviceaccounts",
            "system:serviceaccounts:monitoring",
            "system:authenticated",
        ],
    );
    let apiserver = user("kube-apiserver-kubelet-client", &["system:authenticated"]);
    let debugger = user("alice", &["node-debuggers", "system:authenticated"]);
    let stranger = user("bob", &["system:authenticated"]);
    let cases: &[(&User, &str, &str, bool)] = &[
        (&prometheus, "get", "metrics", true),
        (&prometheus, "get", "stats", true),
        (&prometheus, "get", "proxy", false),
        (&prometheus, "get", "log", false),
        (&prometheus, "create", "metrics", false),
        (&apiserver, "create", "proxy", true),
        (&apiserver, "get", "log", true),
        (&apiserver, "create", "checkpoint", true),
        (&apiserver, "get", "configz", true),
        (&debugger, "create", "proxy", true),
        (&debugger, "get", "log", true),
        (&debugger, "get", "pods", true),
        (&debugger, "delete", "proxy", false),
        (&debugger, "create", "checkpoint", false),
        (&stranger, "get", "metrics", false),
        (&stranger, "get", "healthz", false),
    ];
    for (user, verb, subresource, allowed) in cases {
        let decision = policy.authorize(&Attributes::node(user, verb, subresource, "node-1", "/"));
        assert_eq!(
            matches!(decision, Decision::Allow(_)),
            *allowed,
            "{} {verb} nodes/{subresource}: {decision:?}",
            user.name
        );
        assert!(
            !matches!(decision, Decision::Deny(_)),
            "a policy never denies"
        );
    }
}

#[test]
fn cluster_roles_in_rbac_yaml_match_the_local_policies_of_the_same_name() {
    let local: BTreeMap<String, ClusterRole> = policy_files()
        .iter()
        .flat_map(|path| typed::<ClusterRole>(path, "ClusterRole"))
        .map(|role| (role.metadata.name.clone().unwrap(), role))
        .collect();
    let mut compared = 0;
    for role in typed::<ClusterRole>(&file("config/rbac.yaml"), "ClusterRole") {
        let name = role.metadata.name.clone().unwrap();
        if let Some(same) = local.get(&name) {
            assert_eq!(role.rules, same.rules, "ClusterRole {name}");
            compared += 1;
        }
    }
    assert!(
        compared >= 2,
        "rbac.yaml shares {compared} roles with config/policy"
    );
}

// --- Command lines ---------------------------------------------------------------------------

/// The long names of every proxy flag, as clap knows them.
fn flag_names() -> Vec<String> {
    ProxyFlags::augment_args(clap::Command::new("kubelet-auth-proxy"))
        .get_arguments()
        .filter_map(|arg| arg.get_long().map(str::to_owned))
        .collect()
}

fn camel_case(flag: &str) -> String {
    let mut words = flag.split('-');
    let mut name = words.next().unwrap_or_default().to_owned();
    for word in words {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            name.push(first.to_ascii_uppercase());
            name.extend(chars);
        }
    }
    name
}

/// Files standing in for the ones an example command line names, so that the proxy can load
/// them: certificates from a throwaway CA, a kubeconfig, and the real policies.
struct StandInFiles {
    dir: TempDir,
    /// Numbers the files written, so that two flags never share one.
    written: AtomicUsize,
    ca: String,
    serving: (String, String),
    client: (String, String),
}

impl StandInFiles {
    fn new() -> StandInFiles {
        let ca = Authority::root("example-ca");
        let serving = ca.issue(&CertSpec::server());
        let client = ca.issue(&CertSpec::client("kubelet-auth-proxy"));
        StandInFiles {
            dir: TempDir::new("manifests"),
            written: AtomicUsize::new(0),
            ca: ca.pem(),
            serving: (serving.chain_pem(), serving.key_pem()),
            client: (client.chain_pem(), client.key_pem()),
        }
    }

    fn kubeconfig(&self) -> String {
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca);
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {
                "server": "https://127.0.0.1:6443",
                "certificate-authority-data": ca,
            }}],
            "users": [{"name": "u", "user": {"token": "example"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        })
        .to_string()
    }

    /// The value a stand-in command line gives `flag` in place of `value`: a file with the
    /// content the flag needs, a free loopback port for listen addresses, the shipped file for a
    /// policy. A file flag this does not know fails the test: extend it rather than skip the file.
    fn stand_in(&self, flag: &str, value: &str) -> String {
        let write = |content: &str| {
            let n = self.written.fetch_add(1, Ordering::Relaxed);
            let name = format!("{n}-{flag}");
            self.dir.write(&name, content).display().to_string()
        };
        match flag {
            "listen-address" | "admin-listen-address" => "127.0.0.1:0".to_owned(),
            "tls-cert-file" => write(&self.serving.0),
            "tls-private-key-file" => write(&self.serving.1),
            "upstream-ca-file" | "client-ca-file" => write(&self.ca),
            "upstream-client-cert-file" => write(&self.client.0),
            "upstream-client-key-file" => write(&self.client.1),
            "kubeconfig" => write(&self.kubeconfig()),
            "admin-socket" => self.dir.path().join("admin.sock").display().to_string(),
            "handover-socket" => {
                use std::os::unix::fs::PermissionsExt as _;
                let directory = self.dir.path().join("handover");
                std::fs::create_dir_all(&directory).unwrap();
                std::fs::set_permissions(&directory, std::fs::Permissions::from_mode(0o700))
                    .unwrap();
                directory.join("handover.sock").display().to_string()
            }
            "audit-log-path" if value != "-" => {
                self.dir.path().join("audit.log").display().to_string()
            }
            "authorization-policy-file" => {
                let name = Path::new(value).file_name().unwrap();
                let shipped = file("config/policy").join(name);
                assert!(shipped.is_file(), "{value}: no such file in config/policy");
                shipped.display().to_string()
            }
            _ if value.starts_with('/') => {
                panic!("--{flag}={value}: a file this test cannot stand in for")
            }
            _ => value.to_owned(),
        }
    }

    /// `args` with every value replaced by its stand-in.
    fn rewrite(&self, args: &[String]) -> Vec<String> {
        args.iter()
            .map(
                |arg| match arg.strip_prefix("--").and_then(|a| a.split_once('=')) {
                    Some((flag, value)) => format!("--{flag}={}", self.stand_in(flag, value)),
                    None => arg.clone(),
                },
            )
            .collect()
    }

    /// Runs `kubelet-auth-proxy check-config` on `args` (already rewritten): it validates the flags
    /// and loads every file they name, exactly as a start would, without serving.
    fn check(&self, what: &str, args: &[String]) {
        let mut command = vec!["check-config".to_owned()];
        command.extend_from_slice(args);
        let done = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(process::run(&self.dir, "check-config", &command));
        assert!(
            done.status.success(),
            "{what}: check-config {args:?} exited with {}: {}",
            done.status,
            done.stderr
        );
    }
}

/// Every policy the examples name is one of `config/policy`, and each names all of them.
fn assert_names_every_policy(what: &str, flags: &ProxyFlags) {
    let named: BTreeSet<_> = flags
        .authorization_policy_file
        .iter()
        .map(|path| path.file_name().unwrap().to_owned())
        .collect();
    let shipped: BTreeSet<_> = policy_files()
        .iter()
        .map(|path| path.file_name().unwrap().to_owned())
        .collect();
    assert_eq!(named, shipped, "{what}: --authorization-policy-file");
}

/// The variables of a systemd environment file, parsed as `EnvironmentFile=` does for the forms
/// used there: comment lines, `KEY=value`, double quotes with `\"`-style escapes and
/// backslash-newline continuations. Anything else fails rather than being guessed at.
pub(crate) fn environment_file(text: &str) -> BTreeMap<String, String> {
    let mut variables = BTreeMap::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        if c == '#' || c == ';' {
            let comment: String = chars.by_ref().take_while(|&c| c != '\n').collect();
            assert!(
                !comment.ends_with('\\'),
                "a comment ending in a backslash is read differently by systemd versions: {comment}"
            );
            continue;
        }
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        // systemd strips whitespace around the name.
        let key = key.trim().to_owned();
        assert!(
            !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "bad variable name {key:?}"
        );
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    None => panic!("{key}: unterminated double quote"),
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some('\n') => {}
                        Some(c @ ('"' | '\\' | '`' | '$')) => value.push(c),
                        Some(c) => {
                            value.push('\\');
                            value.push(c);
                        }
                        None => panic!("{key}: unterminated escape"),
                    },
                    Some(c) => value.push(c),
                }
            }
            let rest: String = chars.by_ref().take_while(|&c| c != '\n').collect();
            assert!(
                rest.trim().is_empty(),
                "{key}: text after the closing quote"
            );
        } else {
            let line: String = chars.by_ref().take_while(|&c| c != '\n').collect();
            assert!(
                !line.contains(['\\', '"', '\'']),
                "{key}: quoting this test does not model"
            );
            value = line.trim().to_owned();
        }
        variables.insert(key, value);
    }
    variables
}

/// `Key=value` settings of a unit file, in order (comments and section headers left out).
pub(crate) fn unit_settings(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with(['#', ';', '[']))
        .map(|line| {
            let (key, value) = line.split_once('=').unwrap();
            (key.to_owned(), value.to_owned())
        })
        .collect()
}

fn unit_setting<'a>(settings: &'a [(String, String)], key: &str) -> &'a str {
    let mut values = settings.iter().filter(|(k, _)| k == key);
    let (_, value) = values
        .next()
        .unwrap_or_else(|| panic!("no {key}= in the unit"));
    assert!(values.next().is_none(), "{key}= given twice");
    value
}

#[test]
fn the_systemd_environment_file_is_a_command_line_the_proxy_starts_with() {
    let unit = unit_settings(&read(&file("systemd/kubelet-auth-proxy.service")));
    assert_eq!(unit_setting(&unit, "Type"), "notify");
    assert_eq!(
        unit_setting(&unit, "EnvironmentFile"),
        "/etc/default/kubelet-auth-proxy"
    );
    // An unbraced $VAR as a word of its own is split at whitespace into arguments.
    assert_eq!(
        unit_setting(&unit, "ExecStart"),
        "/usr/local/bin/kubelet-auth-proxy $KUBELET_AUTH_PROXY_ARGS"
    );

    let variables = environment_file(&read(&file("systemd/kubelet-auth-proxy.env")));
    assert_eq!(
        variables.keys().collect::<Vec<_>>(),
        ["KUBELET_AUTH_PROXY_ARGS"]
    );
    let args: Vec<String> = variables["KUBELET_AUTH_PROXY_ARGS"]
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let flags = parse_flags(&args).unwrap_or_else(|e| panic!("environment file: {e}"));
    assert_names_every_policy("environment file", &flags);

    // The kubelet's serving pair is handed over by LoadCredential=, and read from there.
    let credentials = "/run/credentials/kubelet-auth-proxy.service/";
    let loaded: Vec<&str> = unit
        .iter()
        .filter(|(key, _)| key == "LoadCredential")
        .map(|(_, value)| value.split_once(':').unwrap().0)
        .collect();
    for path in [&flags.tls_cert_file, &flags.tls_private_key_file] {
        let path = path.as_ref().unwrap().to_str().unwrap();
        let name = path.strip_prefix(credentials).unwrap_or_else(|| {
            panic!("{path}: the kubelet's root-only files come from {credentials}")
        });
        assert!(loaded.contains(&name), "{name}: no LoadCredential= for it");
    }

    // `systemctl reload` upgrades in place (SIGUSR2), and the optional socket unit passes the
    // kubelet API port under the name and options the proxy's own listeners have.
    assert_eq!(
        unit_setting(&unit, "ExecReload"),
        "/bin/kill -USR2 $MAINPID"
    );
    let socket = unit_settings(&read(&file("systemd/kubelet-auth-proxy.socket")));
    assert_eq!(
        unit_setting(&socket, "FileDescriptorName"),
        kubelet_auth_proxy::server::listen_fds::Role::KubeletApi.name()
    );
    // Never shared: with ReusePort= a process of the proxy's user could join the port.
    assert!(
        socket.iter().all(|(key, _)| key != "ReusePort"),
        "ReusePort= in the socket unit"
    );
    assert_eq!(unit_setting(&socket, "BindIPv6Only"), "ipv6-only");
    assert_eq!(
        unit_setting(&socket, "Service"),
        "kubelet-auth-proxy.service"
    );
    let listen: std::net::SocketAddr = unit_setting(&socket, "ListenStream").parse().unwrap();
    for address in &flags.listen_address {
        assert_eq!(listen.port(), address.port());
    }

    // systemd must wait longer than the proxy's own drain before it kills.
    let stop_timeout = parse_go_duration(unit_setting(&unit, "TimeoutStopSec")).unwrap();
    assert!(
        flags.shutdown_grace_period < stop_timeout,
        "--shutdown-grace-period {:?} is not below TimeoutStopSec {stop_timeout:?}",
        flags.shutdown_grace_period
    );

    // systemd must wait for the start longer than the proxy waits for a port the kubelet holds.
    let start_timeout = parse_go_duration(unit_setting(&unit, "TimeoutStartSec")).unwrap();
    assert!(
        flags.listen_retry_timeout < start_timeout,
        "--listen-retry-timeout {:?} is not below TimeoutStartSec {start_timeout:?}",
        flags.listen_retry_timeout
    );

    // The audit log lies in the one directory the unit lets the proxy write.
    let logs = Path::new("/var/log").join(unit_setting(&unit, "LogsDirectory"));
    let audit = flags.audit_log_path.as_ref().expect("an audit log");
    assert!(audit.starts_with(&logs), "{}", audit.display());

    let files = StandInFiles::new();
    files.check("environment file", &files.rewrite(&args));
}

#[test]
fn the_environment_file_reader_follows_systemd_quoting() {
    let variables = environment_file(
        "# comment\nA=\"one \\\n two\"\n; other comment\nB = plain value  \nC=\"say \\\"hi\\\" \\x\"\n",
    );
    assert_eq!(variables["A"], "one  two");
    assert_eq!(variables["B"], "plain value");
    assert_eq!(variables["C"], "say \"hi\" \\x");
}

/// Resident memory of an idle proxy and per idle client connection, as measured by `bench/run`
/// (docs/BENCHMARKS.md, "Idle connections": 13.4 MiB, 30.6 KiB a connection).
const IDLE_RSS_BYTES: f64 = 13.4 * 1024.0 * 1024.0;
const RSS_PER_CONNECTION_BYTES: f64 = 30.6 * 1024.0;

/// The DaemonSet's memory limit holds `--max-connections` idle connections with a quarter of it
/// to spare for requests in flight: the connection cap bites before the OOM killer does.
#[test]
fn the_daemonsets_memory_limit_fits_its_connection_limit() {
    let container = proxy_container(&daemonset());
    let args = daemonset_args(&container);
    let max_connections: f64 = args
        .iter()
        .find_map(|a| a.strip_prefix("--max-connections="))
        .unwrap_or("10000")
        .parse()
        .unwrap();
    let limit = container
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("memory"))
        .expect("a memory limit")
        .0
        .clone();
    let mebibytes: f64 = limit
        .strip_suffix("Mi")
        .expect("a limit in Mi")
        .parse()
        .unwrap();
    let needed = IDLE_RSS_BYTES + max_connections * RSS_PER_CONNECTION_BYTES;
    let limit_bytes = mebibytes * 1024.0 * 1024.0;
    assert!(
        needed <= 0.75 * limit_bytes,
        "--max-connections={max_connections} needs {:.0} MiB idle; the limit {limit} leaves no \
         room for requests in flight",
        needed / 1024.0 / 1024.0
    );
}

/// The example `AuthenticationConfiguration` validates as kube-apiserver would validate it, its
/// expressions compiled, and says what each authenticator shows.
#[test]
fn the_example_authentication_configuration_validates() {
    use kubelet_auth_proxy::authn::structured::{load, validation::Context};
    let loaded = load(
        &file("config/authentication-config.yaml"),
        &Context::default(),
    )
    .unwrap_or_else(|e| panic!("config/authentication-config.yaml: {e}"));
    let urls: Vec<&str> = loaded
        .validated
        .jwt
        .iter()
        .map(|jwt| jwt.source.url.as_str())
        .collect();
    assert_eq!(
        urls,
        [
            "https://login.example.com/tenant-1/v2.0",
            "https://ci.example.com"
        ]
    );
    assert!(loaded.validated.anonymous.is_some());
    // The same file beside --anonymous-auth=true is refused, naming the field.
    let both = load(
        &file("config/authentication-config.yaml"),
        &Context {
            anonymous_flag: true,
            ..Context::default()
        },
    );
    assert!(
        both.as_ref()
            .is_err_and(|e| e.to_string().starts_with("anonymous: Forbidden")),
        "{both:?}"
    );
}

/// The DaemonSet of `config/daemonset.yaml`.
fn daemonset() -> DaemonSet {
    let mut found = typed::<DaemonSet>(&file("config/daemonset.yaml"), "DaemonSet");
    assert_eq!(found.len(), 1);
    found.remove(0)
}

/// The proxy container of the DaemonSet.
fn proxy_container(daemonset: &DaemonSet) -> Container {
    let spec = daemonset.spec.template.spec.as_ref().unwrap();
    spec.containers
        .iter()
        .find(|c| c.name == "kubelet-auth-proxy")
        .expect("a container named kubelet-auth-proxy")
        .clone()
}

/// `args` with `$(VAR)` replaced by example values for the variables the container defines, as
/// the kubelet expands them.
fn expand(container: &Container, examples: &BTreeMap<&str, &str>) -> Vec<String> {
    let defined: Vec<&str> = container
        .env
        .iter()
        .flatten()
        .map(|var| var.name.as_str())
        .collect();
    container
        .args
        .iter()
        .flatten()
        .map(|arg| {
            let mut arg = arg.clone();
            for name in &defined {
                arg = arg.replace(&format!("$({name})"), examples[name]);
            }
            assert!(!arg.contains("$("), "{arg}: an undefined variable");
            arg
        })
        .collect()
}

/// The proxy container's arguments, with an example value for the node name.
fn daemonset_args(container: &Container) -> Vec<String> {
    expand(container, &BTreeMap::from([("NODE_NAME", "node-1")]))
}

#[test]
fn the_daemonset_runs_a_command_line_the_proxy_starts_with_from_its_mounts() {
    let daemonset = daemonset();
    let container = proxy_container(&daemonset);
    assert_eq!(
        container.image.as_deref(),
        Some(format!("kubelet-auth-proxy:{VERSION}").as_str())
    );
    let args = daemonset_args(&container);
    let flags = parse_flags(&args).unwrap_or_else(|e| panic!("DaemonSet: {e}"));
    assert_names_every_policy("DaemonSet", &flags);

    // Every file it names is inside a volume mounted into the container (or the service
    // account's own volume).
    let pod = daemonset.spec.template.spec.clone().unwrap();
    let mounts: Vec<&str> = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|mount| mount.mount_path.as_str())
        .collect();
    for arg in &args {
        let Some((_, value)) = arg.split_once('=') else {
            continue;
        };
        if value.starts_with('/') {
            let inside = |dir: &str| Path::new(value).starts_with(dir);
            assert!(
                mounts.iter().any(|dir| inside(dir)) || inside(SERVICE_ACCOUNT_DIR),
                "{arg}: not inside any volume mount {mounts:?}"
            );
        }
    }
    let volumes: BTreeSet<&str> = pod
        .volumes
        .iter()
        .flatten()
        .map(|volume| volume.name.as_str())
        .collect();
    for mount in pod
        .init_containers
        .iter()
        .flatten()
        .chain(&pod.containers)
        .flat_map(|c| c.volume_mounts.iter().flatten())
    {
        assert!(volumes.contains(mount.name.as_str()), "{}", mount.name);
    }

    // Non-root, read-only, no capabilities, on the node's network.
    assert_eq!(pod.host_network, Some(true));
    let pod_security = pod.security_context.as_ref().unwrap();
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert!(pod_security.run_as_user.is_some_and(|uid| uid != 0));
    let security = container.security_context.as_ref().unwrap();
    assert_ne!(security.run_as_non_root, Some(false));
    assert_ne!(security.run_as_user, Some(0));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    let drop = security
        .capabilities
        .as_ref()
        .unwrap()
        .drop
        .as_ref()
        .unwrap();
    assert_eq!(drop, &["ALL"]);
    assert!(container.resources.as_ref().unwrap().requests.is_some());

    // The admin listener stays on the host's loopback; the probes ask this pod's own process
    // through --admin-socket (in a volume of the pod's own), never the port both pods of a surge
    // rollout share.
    assert!(flags.admin_listen_address.ip().is_loopback());
    let socket = flags.admin_socket.as_ref().expect("--admin-socket is set");
    let socket_dir = socket.parent().unwrap().to_str().unwrap();
    assert!(
        container
            .volume_mounts
            .iter()
            .flatten()
            .any(|mount| mount.mount_path == socket_dir),
        "{socket_dir} is not a volume of the pod's own"
    );
    for (probe, path) in [
        (&container.startup_probe, "/healthz"),
        (&container.liveness_probe, "/healthz"),
        (&container.readiness_probe, "/readyz"),
    ] {
        let command = probe
            .as_ref()
            .unwrap()
            .exec
            .as_ref()
            .unwrap()
            .command
            .clone()
            .unwrap();
        assert_eq!(
            command,
            [
                "/kubelet-auth-proxy".to_owned(),
                "admin-probe".to_owned(),
                format!("--admin-socket={}", socket.display()),
                path.to_owned(),
            ]
        );
    }
    // A surge rollout: the new pod is ready beside the old one before the old one goes. Declared
    // ports would be host ports on the host network, which the scheduler refuses to double.
    let rolling = daemonset
        .spec
        .update_strategy
        .as_ref()
        .unwrap()
        .rolling_update
        .as_ref()
        .unwrap();
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    assert_eq!(rolling.max_surge, Some(IntOrString::Int(1)));
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
    assert!(container.ports.as_ref().is_none_or(Vec::is_empty));

    // The pod gets its drain before being killed.
    let grace = pod.termination_grace_period_seconds.unwrap();
    assert!(Duration::from_secs(grace.try_into().unwrap()) > flags.shutdown_grace_period);

    // It runs as the ServiceAccount that rbac.yaml binds to system:auth-delegator.
    let account = pod.service_account_name.as_deref().unwrap();
    let namespace = daemonset.metadata.namespace.as_deref().unwrap();
    let rbac = file("config/rbac.yaml");
    assert!(
        typed::<ServiceAccount>(&rbac, "ServiceAccount")
            .iter()
            .any(|sa| sa.metadata.name.as_deref() == Some(account)
                && sa.metadata.namespace.as_deref() == Some(namespace))
    );
    let bindings = typed::<ClusterRoleBinding>(&rbac, "ClusterRoleBinding");
    let binds_the_account = |binding: &ClusterRoleBinding| {
        binding.subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount"
                && s.name == account
                && s.namespace.as_deref() == Some(namespace)
        })
    };
    // To the role that creates reviews, and to the one that reads the service-account issuer's
    // public keys, so tokens are checked on the node (docs/DELEGATION.md, "Forged tokens").
    for role in [
        "system:auth-delegator",
        "system:service-account-issuer-discovery",
    ] {
        assert!(
            bindings
                .iter()
                .any(|binding| binding.role_ref.name == role && binds_the_account(binding)),
            "rbac.yaml binds {namespace}/{account} to {role}"
        );
    }

    // With RBAC in its chain, rbac.yaml lets that account list and watch the four kinds, and
    // nothing else.
    assert!(flags.authorization_mode.contains(&AuthorizationMode::Rbac));
    let reader = bindings
        .iter()
        .find(|binding| {
            binds_the_account(binding) && binding.role_ref.name.starts_with("kubelet-auth-proxy:")
        })
        .expect("a binding of the service account to a role of the project's own");
    let role = typed::<ClusterRole>(&rbac, "ClusterRole")
        .into_iter()
        .find(|role| role.metadata.name.as_deref() == Some(reader.role_ref.name.as_str()))
        .expect("the reader role is in rbac.yaml");
    let rules = role.rules.unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].verbs, ["list", "watch"]);
    assert_eq!(
        rules[0].api_groups.as_deref(),
        Some(&["rbac.authorization.k8s.io".to_owned()][..])
    );
    let mut resources = rules[0].resources.clone().unwrap_or_default();
    resources.sort();
    assert_eq!(
        resources,
        [
            "clusterrolebindings",
            "clusterroles",
            "rolebindings",
            "roles"
        ]
    );

    // Loads, with a kubeconfig standing in for the pod's service account.
    let files = StandInFiles::new();
    let mut args = args;
    args.push("--kubeconfig=/etc/kubelet-auth-proxy/kubeconfig".to_owned());
    files.check("DaemonSet", &files.rewrite(&args));
}

/// `#key: value` lines of `proxy.yaml`: optional settings, shown commented out.
fn commented_out_settings(text: &str) -> String {
    text.lines()
        .filter_map(|line| line.strip_prefix('#'))
        .filter(|rest| {
            rest.split_once(": ").is_some_and(|(key, _)| {
                key.starts_with(|c: char| c.is_ascii_lowercase())
                    && key.chars().all(|c| c.is_ascii_alphanumeric())
            })
        })
        .map(|setting| format!("{setting}\n"))
        .collect()
}

/// Flags that cannot appear in a configuration file: the files themselves.
const NOT_IN_CONFIG: &[&str] = &["config", "kubelet-config"];

/// Parses a command line of just `--config=<path>` as the binary does: the file expanded into
/// flags, then parsed.
fn parse_config_file(path: &Path) -> Result<ProxyFlags, String> {
    let args: Vec<OsString> = vec![
        "kubelet-auth-proxy".into(),
        format!("--config={}", path.display()).into(),
    ];
    let command = ProxyFlags::augment_args(clap::Command::new("kubelet-auth-proxy"));
    let matches = command
        .clone()
        .try_get_matches_from(&args)
        .map_err(|e| e.to_string())?;
    let (expanded, _) = config_file::expand(&command, &matches, &args, 1)
        .map_err(|e| e.to_string())?
        .expect("--config is given");
    let matches = command
        .try_get_matches_from(expanded)
        .map_err(|e| e.to_string())?;
    ProxyFlags::from_arg_matches(&matches).map_err(|e| e.to_string())
}

#[test]
fn proxy_yaml_sets_every_flag_by_its_camel_case_name_and_starts_the_proxy() {
    let path = file("config/proxy.yaml");
    let text = read(&path);
    let mut documents = documents(&path);
    assert_eq!(documents.len(), 1);
    let Value::Object(mut settings) = documents.remove(0) else {
        panic!("proxy.yaml is not a mapping");
    };
    let header = [
        ("apiVersion", settings.remove("apiVersion")),
        ("kind", settings.remove("kind")),
    ];
    assert_eq!(
        header[0].1,
        Some(config_file::PROXY_CONFIG_API_VERSION.into())
    );
    assert_eq!(header[1].1, Some(config_file::PROXY_CONFIG_KIND.into()));
    let Value::Object(optional) =
        serde_saphyr::from_str::<Value>(&commented_out_settings(&text)).unwrap()
    else {
        panic!("commented-out settings are not a mapping");
    };

    // Complete: every flag that a file may set is set or shown commented out.
    let named: BTreeSet<&String> = settings.keys().chain(optional.keys()).collect();
    let missing: Vec<String> = flag_names()
        .iter()
        .filter(|flag| !NOT_IN_CONFIG.contains(&flag.as_str()))
        .map(|flag| camel_case(flag))
        .filter(|key| !named.contains(key))
        .collect();
    assert!(missing.is_empty(), "proxy.yaml does not show {missing:?}");
    for key in optional.keys() {
        assert!(
            !settings.contains_key(key),
            "{key}: both set and commented out"
        );
    }

    // The file as the binary reads it.
    let flags = parse_config_file(&path).unwrap_or_else(|e| panic!("proxy.yaml: {e}"));
    assert_names_every_policy("proxy.yaml", &flags);
    let files = StandInFiles::new();
    let mut commented = serde_json::Map::from_iter(
        header
            .iter()
            .map(|(key, value)| ((*key).to_owned(), value.clone().unwrap())),
    );
    commented.extend(optional);
    let commented_path = files
        .dir
        .write("commented-out.yaml", Value::Object(commented).to_string());
    parse_config_file(&commented_path)
        .unwrap_or_else(|e| panic!("proxy.yaml, commented-out settings: {e}"));

    // The same file with stand-in files loads.
    let mut stand_in = serde_json::Map::from_iter(
        header
            .iter()
            .map(|(key, value)| ((*key).to_owned(), value.clone().unwrap())),
    );
    for (key, value) in settings {
        let flag = flag_names()
            .into_iter()
            .find(|flag| camel_case(flag) == key)
            .unwrap();
        let value = match value {
            Value::String(text) => Value::String(files.stand_in(&flag, &text)),
            Value::Array(items) => Value::Array(
                items
                    .into_iter()
                    .map(|item| match item {
                        Value::String(text) => Value::String(files.stand_in(&flag, &text)),
                        other => other,
                    })
                    .collect(),
            ),
            other => other,
        };
        stand_in.insert(key, value);
    }
    let stand_in_path = files
        .dir
        .write("proxy.yaml", Value::Object(stand_in).to_string());
    files.check(
        "proxy.yaml",
        &[format!("--config={}", stand_in_path.display())],
    );
}

#[test]
fn camel_case_names_follow_the_flags() {
    assert_eq!(camel_case("upstream-ca-file"), "upstreamCaFile");
    assert_eq!(
        camel_case("authorization-webhook-cache-authorized-ttl"),
        "authorizationWebhookCacheAuthorizedTtl"
    );
    assert_eq!(camel_case("v"), "v");
}

// --- The kubelet behind the proxy ------------------------------------------------------------

/// The KubeletConfiguration fields the example may set: the authentication and authorization
/// fields (kubelet `config/v1beta1/types.go` `KubeletAuthentication`,
/// `KubeletAuthorization`), plus the listening address.
const KUBELET_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "address",
    "port",
    "readOnlyPort",
    "authentication.x509.clientCAFile",
    "authentication.webhook.enabled",
    "authentication.webhook.cacheTTL",
    "authentication.anonymous.enabled",
    "authorization.mode",
    "authorization.webhook.cacheAuthorizedTTL",
    "authorization.webhook.cacheUnauthorizedTTL",
];

fn leaves(value: &Value, path: &str, found: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                let here = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                leaves(value, &here, found);
            }
        }
        leaf => {
            found.insert(path.to_owned(), leaf.clone());
        }
    }
}

#[test]
fn the_kubelet_configuration_locks_the_kubelet_behind_the_proxy() {
    let documents = documents(&file("config/kubelet-config.yaml"));
    assert_eq!(documents.len(), 1);
    let mut fields = BTreeMap::new();
    leaves(&documents[0], "", &mut fields);
    for field in fields.keys() {
        assert!(
            KUBELET_FIELDS.contains(&field.as_str()),
            "{field}: not a KubeletConfiguration field this example documents"
        );
    }
    assert_eq!(fields["apiVersion"], "kubelet.config.k8s.io/v1beta1");
    assert_eq!(fields["kind"], "KubeletConfiguration");
    for ttl in fields.keys().filter(|field| field.ends_with("TTL")) {
        parse_go_duration(fields[ttl].as_str().unwrap()).unwrap();
    }

    // Reachable from the node only, and by nobody but the proxy.
    let address: std::net::IpAddr = fields["address"].as_str().unwrap().parse().unwrap();
    assert!(address.is_loopback());
    assert_eq!(fields["readOnlyPort"], 0);
    assert_eq!(fields["authentication.anonymous.enabled"], false);
    assert_eq!(fields["authentication.webhook.enabled"], false);
    assert!(
        fields["authentication.x509.clientCAFile"]
            .as_str()
            .unwrap()
            .starts_with('/')
    );
    assert!(["AlwaysAllow", "Webhook"].contains(&fields["authorization.mode"].as_str().unwrap()));

    // Every example's --upstream is exactly that address and port.
    let port = u16::try_from(fields["port"].as_u64().unwrap()).unwrap();
    let upstream = format!("https://{}", std::net::SocketAddr::new(address, port));
    let env = environment_file(&read(&file("systemd/kubelet-auth-proxy.env")));
    let env_args: Vec<String> = env["KUBELET_AUTH_PROXY_ARGS"]
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let daemonset_args = daemonset_args(&proxy_container(&daemonset()));
    let Value::Object(proxy_yaml) = documents_of("config/proxy.yaml") else {
        panic!("proxy.yaml is not a mapping");
    };
    for (what, upstream_given) in [
        ("environment file", parse_flags(&env_args).unwrap().upstream),
        ("DaemonSet", parse_flags(&daemonset_args).unwrap().upstream),
        (
            "proxy.yaml",
            proxy_yaml["upstream"].as_str().map(str::to_owned),
        ),
    ] {
        assert_eq!(upstream_given.as_deref(), Some(upstream.as_str()), "{what}");
    }

    // And every example listens on the other family's wildcard, the same on every node, which
    // the kernel lets it bind beside the kubelet (cli.rs binds it so).
    let kubelet = kubelet_auth_proxy::forward::UpstreamTarget::Https {
        authority: std::net::SocketAddr::new(address, port)
            .to_string()
            .parse()
            .unwrap(),
    };
    let listen_yaml = proxy_yaml["listenAddress"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    for (what, given) in [
        (
            "environment file",
            parse_flags(&env_args).unwrap().listen_address,
        ),
        (
            "DaemonSet",
            parse_flags(&daemonset_args).unwrap().listen_address,
        ),
        ("proxy.yaml", vec![listen_yaml]),
    ] {
        let listen = listen::resolve(&given, Some(&kubelet));
        assert_eq!(listen.len(), 1, "{what}: {listen:?}");
        assert!(listen[0].ip().is_unspecified(), "{what}: {listen:?}");
        assert_ne!(listen[0].is_ipv4(), address.is_ipv4(), "{what}: {listen:?}");
        assert_eq!(listen[0].port(), port, "{what}");
    }
}

fn documents_of(relative: &str) -> Value {
    documents(&file(relative)).remove(0)
}

// --- Image and version -----------------------------------------------------------------------

#[test]
fn version_names_the_release_and_the_commit_it_was_built_from() {
    let output = Command::new(BINARY).arg("--version").output().unwrap();
    assert!(output.status.success());
    let commit = env!("KUBELET_AUTH_PROXY_COMMIT");
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        format!("kubelet-auth-proxy {VERSION} (commit {commit})\n")
    );
    assert!(
        commit == "unknown"
            || (commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_alphanumeric())),
        "{commit}"
    );
}

#[test]
fn the_image_and_the_daemonset_carry_this_version() {
    let containerfile = read(&file("Containerfile"));
    assert!(
        containerfile.contains(&format!("org.opencontainers.image.version=\"{VERSION}\"")),
        "Containerfile label"
    );
    assert!(containerfile.contains("ENTRYPOINT [\"/kubelet-auth-proxy\"]"));
    assert!(containerfile.contains("--release --locked"));
    let user = containerfile
        .lines()
        .find_map(|line| line.strip_prefix("USER "))
        .expect("a USER line");
    let ids: Vec<i64> = user
        .split(':')
        .map(|id| id.parse().expect("numeric USER"))
        .collect();
    assert_eq!(ids.len(), 2, "USER uid:gid");
    assert_ne!(ids[0], 0);

    let labels = daemonset().spec.template.metadata.unwrap().labels.unwrap();
    assert_eq!(labels["app.kubernetes.io/version"], VERSION);
    the_daemonset_runs_as(ids[0], ids[1]);
}

/// The DaemonSet runs as the image's user and group, a pair of the proxy's own (not distroless's
/// "nonroot" nor "nobody", which other images share); its init container closes the handover
/// directory to all but root and that group, and `--handover-socket` lies in that directory.
fn the_daemonset_runs_as(uid: i64, gid: i64) {
    let daemonset = daemonset();
    let pod = daemonset.spec.template.spec.clone().unwrap();
    let security = pod.security_context.clone().unwrap();
    assert_eq!(security.run_as_user, Some(uid));
    assert_eq!(security.run_as_group, Some(gid));
    assert_eq!(security.fs_group, Some(gid));
    for shared in [65532, 65534] {
        assert_ne!(uid, shared, "a user other images share");
        assert_ne!(gid, shared, "a group other images share");
    }
    let init = pod
        .init_containers
        .iter()
        .flatten()
        .find(|c| {
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == "handover")
        })
        .expect("an init container preparing the handover directory");
    let mount = |container: &Container| {
        container
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "handover")
            .map(|m| m.mount_path.clone())
            .expect("the handover volume mounted")
    };
    let script = init
        .command
        .iter()
        .flatten()
        .cloned()
        .collect::<Vec<_>>()
        .join(" ");
    let directory = mount(init);
    assert!(
        script.contains(&format!("chgrp {gid} {directory}")),
        "{script}"
    );
    assert!(
        script.contains(&format!("chmod 0770 {directory}")),
        "{script}"
    );
    for group in script.split("chgrp ").skip(1) {
        assert!(
            group.starts_with(&format!("{gid} ")),
            "chgrp to another group: {script}"
        );
    }
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "handover")
        .and_then(|v| v.host_path.clone())
        .expect("the handover directory is the host's");
    assert_eq!(volume.type_.as_deref(), Some("DirectoryOrCreate"));
    let container = proxy_container(&daemonset);
    let socket = daemonset_args(&container)
        .iter()
        .find_map(|a| a.strip_prefix("--handover-socket=").map(PathBuf::from))
        .expect("--handover-socket");
    assert_eq!(socket.parent(), Some(Path::new(&mount(&container))));
}

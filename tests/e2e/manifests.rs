//! What ships besides the binary holds together: every Kubernetes manifest under `config/` and
//! `deploy/` parses into its API type without losing a field (the API server would drop a misspelt
//! one silently), every kustomization names files that exist where kustomize may read them, the
//! local policies load and grant what their comments say, the example command lines (systemd
//! environment file, the DaemonSet with the `proxy.yaml` it mounts, `proxy.yaml` alone) are
//! accepted and would start the proxy, the KubeletConfiguration uses only documented fields, and
//! `--version` names the build's commit.
//!
//! The DaemonSet is checked as an [`Install`]: the base's files as `config/kustomization.yaml`
//! combines them, and, where a kubectl is at hand, each overlay of `deploy/` as `kubectl
//! kustomize` renders it (`real_apiserver_kustomize.rs` runs the same checks with the kubectl CI
//! names, and sends every rendering to a real API server).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use clap::{Args as _, FromArgMatches as _};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
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

/// Every YAML file under `config/` and `deploy/`, sorted.
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
    walk(&file("deploy"), &mut found);
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
                "Role" => round_trip::<Role>(document),
                "RoleBinding" => round_trip::<RoleBinding>(document),
                "ValidatingAdmissionPolicy" => round_trip::<ValidatingAdmissionPolicy>(document),
                "ValidatingAdmissionPolicyBinding" => {
                    round_trip::<ValidatingAdmissionPolicyBinding>(document)
                }
                // kustomize's own files: what they name is checked here, the rest by kubectl
                // (real_apiserver_kustomize.rs).
                "Kustomization" | "Component" => kustomization_names(&path, document),
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
        "Role",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ProxyConfiguration",
        "KubeletConfiguration",
        "Kustomization",
        "Component",
    ] {
        assert!(
            kinds_seen.contains(expected),
            "no {expected} under config/ or deploy/"
        );
    }
}

/// What a kustomization (`path`, one of `kustomization.yaml`'s documents) names, checked as
/// kustomize reads it with its default load restrictor: every resource, component and generated
/// file exists; a file (a resource or a generator's input) lies in the kustomization's own
/// directory tree; a directory is never one that contains the kustomization (kustomize calls that
/// a cycle). Keys this does not know fail the test, so that a new one gets its check. Returns the
/// problems found as `Err`.
fn kustomization_names(path: &Path, document: &Value) -> Result<Vec<String>, String> {
    let dir = path.parent().unwrap();
    let expected_version = match kind(document) {
        "Kustomization" => "kustomize.config.k8s.io/v1beta1",
        _ => "kustomize.config.k8s.io/v1alpha1",
    };
    if document["apiVersion"] != expected_version {
        return Err(format!("apiVersion is not {expected_version}"));
    }
    let names = |key: &str| -> Vec<String> {
        document[key]
            .as_array()
            .into_iter()
            .flatten()
            .map(|name| name.as_str().expect("a path").to_owned())
            .collect()
    };
    let inside = |name: &str| {
        Path::new(name)
            .components()
            .all(|c| c != std::path::Component::ParentDir)
    };
    // A base or a component: a directory with a kustomization of `wanted` kind that does not
    // contain this one.
    let directory = |name: &str, wanted: &str| -> Option<String> {
        let Ok(target) = dir.join(name).canonicalize() else {
            return Some(format!("{name}: no such directory"));
        };
        if dir.canonicalize().unwrap().starts_with(&target) {
            return Some(format!("{name}: contains this kustomization (a cycle)"));
        }
        let kustomization = target.join("kustomization.yaml");
        if !kustomization.is_file() {
            return Some(format!("{name}: no kustomization.yaml"));
        }
        let found = kind(&documents(&kustomization)[0]).to_owned();
        (found != wanted).then(|| format!("{name}: a {found}, not a {wanted}"))
    };
    let mut problems = Vec::new();
    for name in names("resources") {
        if dir.join(&name).is_dir() {
            problems.extend(directory(&name, "Kustomization"));
        } else if !inside(&name) || !dir.join(&name).is_file() {
            problems.push(format!(
                "resources: {name}: no such file in this directory tree"
            ));
        }
    }
    for name in names("components") {
        problems.extend(directory(&name, "Component"));
    }
    for generator in document["configMapGenerator"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for entry in generator["files"].as_array().into_iter().flatten() {
            let entry = entry.as_str().expect("a file");
            // `key=path` names the key apart from the file.
            let name = entry.split_once('=').map_or(entry, |(_, name)| name);
            if !inside(name) || !dir.join(name).is_file() {
                problems.push(format!(
                    "configMapGenerator: {name}: no such file in this directory tree"
                ));
            }
        }
    }
    let known = [
        "apiVersion",
        "kind",
        "resources",
        "components",
        "configMapGenerator",
        "patches",
        "replacements",
        "images",
    ];
    for key in document.as_object().unwrap().keys() {
        if !known.contains(&key.as_str()) {
            problems.push(format!(
                "{key}: a key this test does not check; add its check"
            ));
        }
    }
    // Patches and replacements are inline: kubectl checks them by rendering.
    for key in ["patches", "replacements"] {
        for entry in document[key].as_array().into_iter().flatten() {
            if entry.get("path").is_some() {
                problems.push(format!("{key}: a file; inline it or check it here"));
            }
        }
    }
    if problems.is_empty() {
        Ok(Vec::new())
    } else {
        Err(problems.join("; "))
    }
}

#[test]
fn the_kustomization_check_finds_what_kustomize_would_refuse() {
    let dir = TempDir::new("kustomization-check");
    dir.write("present.yaml", "kind: ConfigMap\n");
    let path = dir.write("kustomization.yaml", "");
    let document: Value = serde_saphyr::from_str(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
         resources: [present.yaml, missing.yaml, ../present.yaml, ..]\n\
         configMapGenerator: [{name: x, files: [key=present.yaml, absent.yaml]}]\n\
         namePrefix: x-\n",
    )
    .unwrap();
    let problems = kustomization_names(&path, &document).unwrap_err();
    for expected in [
        "resources: missing.yaml: no such file",
        "resources: ../present.yaml: no such file in this directory tree",
        "..: contains this kustomization (a cycle)",
        "configMapGenerator: absent.yaml: no such file",
        "namePrefix: a key this test does not check",
    ] {
        assert!(
            problems.contains(expected),
            "{expected:?} not in {problems}"
        );
    }
    assert!(!problems.contains("key=present.yaml"), "{problems}");
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

/// The local policies of `config/policy` (its `kustomization.yaml` is the DaemonSet's Component
/// that mounts them, not a policy).
fn policy_files() -> Vec<PathBuf> {
    let files: Vec<PathBuf> = yaml_files()
        .into_iter()
        .filter(|path| path.parent() == Some(&file("config/policy")))
        .filter(|path| !path.ends_with("kustomization.yaml"))
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

    // The file as the binary reads it. The local policies are shown commented out: the
    // DaemonSet's policies component adds them by flag (config/policy/kustomization.yaml).
    parse_config_file(&path).unwrap_or_else(|e| panic!("proxy.yaml: {e}"));
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
    let commented = parse_config_file(&commented_path)
        .unwrap_or_else(|e| panic!("proxy.yaml, commented-out settings: {e}"));
    assert_names_every_policy("proxy.yaml, commented-out settings", &commented);

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
    // The file leaves the API server credentials to the pod's service account (or to a
    // kubeconfig under systemd): a kubeconfig stands in for them.
    files.check(
        "proxy.yaml",
        &[
            format!("--config={}", stand_in_path.display()),
            format!(
                "--kubeconfig={}",
                files.stand_in("kubeconfig", "/etc/kubelet-auth-proxy/kubeconfig")
            ),
        ],
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

// --- The DaemonSet: the base's files, and each overlay as kubectl renders it -----------------

/// The pod's name in the examples: `$(POD_NAME)`, as a DaemonSet names its pods.
const EXAMPLE_POD: &str = "kubelet-auth-proxy-x7k2p";
/// The node's name in the examples: `$(NODE_NAME)`.
const EXAMPLE_NODE: &str = "node-1";
/// The label a draining pod gives itself (`--drain-release-pod`), which the selector excludes.
const DRAINING_LABEL: &str = "kubelet-auth-proxy/draining";
/// What `terminationGracePeriodSeconds` adds to the drain and the grace period: time for the
/// process to exit once both are over.
const TERMINATION_MARGIN: Duration = Duration::from_secs(30);

/// An installation: every object of the base's files as `config/kustomization.yaml` combines them,
/// or of an overlay as `kubectl kustomize` renders it.
pub(crate) struct Install {
    /// What it is, for messages: `config/` or an overlay's directory.
    pub(crate) what: String,
    /// Every object, as JSON.
    pub(crate) objects: Vec<Value>,
}

impl Install {
    /// The base's files: the resources `config/kustomization.yaml` lists, and the ConfigMaps it
    /// generates, under the names the DaemonSet refers to (kustomize adds a hash to both).
    pub(crate) fn base_files() -> Install {
        let kustomization = documents_of("config/kustomization.yaml");
        let mut objects = Vec::new();
        for resource in kustomization["resources"].as_array().unwrap() {
            objects.extend(documents(&file("config").join(resource.as_str().unwrap())));
        }
        for generator in kustomization["configMapGenerator"].as_array().unwrap() {
            let data: serde_json::Map<String, Value> = generator["files"]
                .as_array()
                .unwrap()
                .iter()
                .map(|name| {
                    let name = name.as_str().unwrap();
                    let text = read(&file("config").join(name));
                    (name.to_owned(), Value::String(text))
                })
                .collect();
            objects.push(serde_json::json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": generator["name"], "namespace": generator["namespace"]},
                "data": data,
            }));
        }
        Install {
            what: "config/ (its files)".to_owned(),
            objects,
        }
    }

    /// What `kubectl kustomize` printed for `what`.
    pub(crate) fn rendered(what: &str, yaml: &str) -> Install {
        let objects: Vec<Value> = serde_saphyr::from_multiple(yaml)
            .unwrap_or_else(|e| panic!("{what}: kubectl kustomize printed no YAML: {e}"));
        Install {
            what: what.to_owned(),
            objects,
        }
    }

    /// The objects of `kind`, typed.
    pub(crate) fn of_kind<T: DeserializeOwned>(&self, wanted: &str) -> Vec<T> {
        self.objects
            .iter()
            .filter(|object| kind(object) == wanted)
            .map(|object| {
                serde_json::from_value(object.clone())
                    .unwrap_or_else(|e| panic!("{}: {wanted}: {e}", self.what))
            })
            .collect()
    }

    /// The one DaemonSet.
    pub(crate) fn daemonset(&self) -> DaemonSet {
        let mut found = self.of_kind::<DaemonSet>("DaemonSet");
        assert_eq!(found.len(), 1, "{}: DaemonSets", self.what);
        found.remove(0)
    }

    /// The file at `path` in the proxy container, as the ConfigMap volume mounted there holds it.
    fn mounted_file(&self, path: &Path) -> String {
        let daemonset = self.daemonset();
        let container = proxy_container(&daemonset);
        let mount = container
            .volume_mounts
            .iter()
            .flatten()
            .find(|mount| path.starts_with(&mount.mount_path))
            .unwrap_or_else(|| panic!("{}: {} is in no mount", self.what, path.display()));
        let key = path
            .strip_prefix(&mount.mount_path)
            .unwrap()
            .to_str()
            .unwrap();
        let volume = daemonset
            .spec
            .template
            .spec
            .as_ref()
            .unwrap()
            .volumes
            .iter()
            .flatten()
            .find(|volume| volume.name == mount.name)
            .unwrap();
        let name = volume
            .config_map
            .as_ref()
            .unwrap_or_else(|| panic!("{}: {} is not a ConfigMap's", self.what, path.display()))
            .name
            .clone();
        self.of_kind::<ConfigMap>("ConfigMap")
            .into_iter()
            .find(|map| map.metadata.name.as_deref() == Some(name.as_str()))
            .and_then(|map| map.data)
            .and_then(|mut data| data.remove(key))
            .unwrap_or_else(|| panic!("{}: ConfigMap {name} has no {key}", self.what))
    }

    /// The proxy container's command line as a pod of the DaemonSet runs it: `$(VAR)` expanded,
    /// and the `--config` file, read from the ConfigMap mounted there, expanded into the flags it
    /// sets (before the command line's own, which override it), as the binary expands it.
    pub(crate) fn command_line(&self) -> Vec<String> {
        let daemonset = self.daemonset();
        let args = pod_args(&daemonset);
        let Some(config) = args.iter().find_map(|a| a.strip_prefix("--config=")) else {
            return args;
        };
        let dir = TempDir::new("daemonset-config");
        let copy = dir.write("proxy.yaml", self.mounted_file(Path::new(config)));
        let args: Vec<String> = args
            .iter()
            .map(|arg| match arg.strip_prefix("--config=") {
                Some(_) => format!("--config={}", copy.display()),
                None => arg.clone(),
            })
            .collect();
        expand_config(&args)
            .into_iter()
            .filter(|arg| !arg.starts_with("--config="))
            .collect()
    }

    /// The command line, parsed.
    pub(crate) fn flags(&self) -> ProxyFlags {
        parse_flags(&self.command_line()).unwrap_or_else(|e| panic!("{}: {e}", self.what))
    }
}

/// `args` (a command line with `--config`) with the file's flags inserted as the binary inserts
/// them.
fn expand_config(args: &[String]) -> Vec<String> {
    let args: Vec<OsString> = std::iter::once("kubelet-auth-proxy".into())
        .chain(args.iter().map(OsString::from))
        .collect();
    let command = ProxyFlags::augment_args(clap::Command::new("kubelet-auth-proxy"));
    let matches = command
        .clone()
        .try_get_matches_from(&args)
        .unwrap_or_else(|e| panic!("{e}"));
    let (expanded, _) = config_file::expand(&command, &matches, &args, 1)
        .unwrap_or_else(|e| panic!("{e}"))
        .expect("--config is given");
    expanded
        .into_iter()
        .skip(1)
        .map(|arg| arg.into_string().unwrap())
        .collect()
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

/// The proxy container's arguments with `$(VAR)` replaced as the kubelet replaces it: by the
/// variable's value, or for one from the downward API by an example of what the pod would get.
fn pod_args(daemonset: &DaemonSet) -> Vec<String> {
    let container = proxy_container(daemonset);
    let namespace = daemonset.metadata.namespace.clone().unwrap();
    let values: Vec<(String, String)> = container
        .env
        .iter()
        .flatten()
        .map(|var| {
            let field = var
                .value_from
                .as_ref()
                .and_then(|from| from.field_ref.as_ref())
                .map(|field| field.field_path.as_str());
            let value = match (var.value.as_deref(), field) {
                (Some(value), None) => value.to_owned(),
                (None, Some("spec.nodeName")) => EXAMPLE_NODE.to_owned(),
                (None, Some("metadata.name")) => EXAMPLE_POD.to_owned(),
                (None, Some("metadata.namespace")) => namespace.clone(),
                other => panic!(
                    "{}: a value this test has no example for: {other:?}",
                    var.name
                ),
            };
            (var.name.clone(), value)
        })
        .collect();
    container
        .args
        .iter()
        .flatten()
        .map(|arg| {
            let mut arg = arg.clone();
            for (name, value) in &values {
                arg = arg.replace(&format!("$({name})"), value);
            }
            assert!(!arg.contains("$("), "{arg}: an undefined variable");
            arg
        })
        .collect()
}

/// The image's `USER`, uid and gid.
fn image_user() -> (i64, i64) {
    let containerfile = read(&file("Containerfile"));
    let user = containerfile
        .lines()
        .find_map(|line| line.strip_prefix("USER "))
        .expect("a USER line");
    let ids: Vec<i64> = user
        .split(':')
        .map(|id| id.parse().expect("numeric USER"))
        .collect();
    assert_eq!(ids.len(), 2, "USER uid:gid");
    (ids[0], ids[1])
}

/// The labels of the DaemonSet's pod template.
fn template_labels(daemonset: &DaemonSet) -> BTreeMap<String, String> {
    daemonset
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|metadata| metadata.labels.clone())
        .expect("the pod template has labels")
}

/// Every check of an installation: the DaemonSet runs the proxy as it should and its command
/// line would start it from its mounts, and the objects it needs are there. `policies`: whether
/// the local policies are in (every overlay), or not (the base alone).
pub(crate) fn check_install(install: &Install, policies: bool) {
    let what = install.what.as_str();
    let daemonset = install.daemonset();
    let container = proxy_container(&daemonset);
    assert_eq!(
        container.image.as_deref(),
        Some(format!("kubelet-auth-proxy:{VERSION}").as_str()),
        "{what}"
    );
    let labels = template_labels(&daemonset);
    assert_eq!(labels["app.kubernetes.io/version"], VERSION, "{what}");
    let args = install.command_line();
    let flags = install.flags();
    check_authorization(install, &flags, policies);
    check_mounts_and_security(what, &daemonset, &args, &flags);
    check_rollout_and_drain(install, &flags);
    check_identity(install, &flags);
    let (uid, gid) = image_user();
    check_user(what, &daemonset, uid, gid);
    check_memory(what, &container, &flags);

    // Loads, with a kubeconfig standing in for the pod's service account.
    let files = StandInFiles::new();
    let mut args = args;
    args.push("--kubeconfig=/etc/kubelet-auth-proxy/kubeconfig".to_owned());
    files.check(what, &files.rewrite(&args));
}

/// The authorizer chain: `Node,RBAC,Webhook` without the local policies; with them, `Policy`
/// after `Node` and every shipped policy named, each read from the ConfigMap mounted at its path,
/// which holds the shipped file.
fn check_authorization(install: &Install, flags: &ProxyFlags, policies: bool) {
    use AuthorizationMode::{Node, Policy, Rbac, Webhook};
    let what = install.what.as_str();
    if !policies {
        assert_eq!(flags.authorization_mode, [Node, Rbac, Webhook], "{what}");
        assert!(flags.authorization_policy_file.is_empty(), "{what}");
        return;
    }
    assert_eq!(
        flags.authorization_mode,
        [Node, Policy, Rbac, Webhook],
        "{what}"
    );
    assert_names_every_policy(what, flags);
    for path in &flags.authorization_policy_file {
        let shipped = file("config/policy").join(path.file_name().unwrap());
        assert_eq!(
            install.mounted_file(path),
            read(&shipped),
            "{what}: {}",
            path.display()
        );
    }
}

/// Every file the command line names is inside a volume mounted into the container (or the
/// service account's own volume); the pod is non-root, read-only, without capabilities, on the
/// node's network; the admin listener stays on loopback and the probes ask the pod's own process.
fn check_mounts_and_security(
    what: &str,
    daemonset: &DaemonSet,
    args: &[String],
    flags: &ProxyFlags,
) {
    let container = proxy_container(daemonset);
    let pod = daemonset.spec.template.spec.clone().unwrap();
    let mounts: Vec<&str> = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|mount| mount.mount_path.as_str())
        .collect();
    for arg in args {
        let Some((_, value)) = arg.split_once('=') else {
            continue;
        };
        if value.starts_with('/') {
            let inside = |dir: &str| Path::new(value).starts_with(dir);
            assert!(
                mounts.iter().any(|dir| inside(dir)) || inside(SERVICE_ACCOUNT_DIR),
                "{what}: {arg}: not inside any volume mount {mounts:?}"
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
        assert!(
            volumes.contains(mount.name.as_str()),
            "{what}: {}",
            mount.name
        );
    }

    // Non-root, read-only, no capabilities, on the node's network.
    assert_eq!(pod.host_network, Some(true), "{what}");
    let pod_security = pod.security_context.as_ref().unwrap();
    assert_eq!(pod_security.run_as_non_root, Some(true), "{what}");
    assert!(
        pod_security.run_as_user.is_some_and(|uid| uid != 0),
        "{what}"
    );
    let security = container.security_context.as_ref().unwrap();
    assert_ne!(security.run_as_non_root, Some(false), "{what}");
    assert_ne!(security.run_as_user, Some(0), "{what}");
    assert_eq!(security.read_only_root_filesystem, Some(true), "{what}");
    assert_eq!(security.allow_privilege_escalation, Some(false), "{what}");
    let drop = security
        .capabilities
        .as_ref()
        .unwrap()
        .drop
        .as_ref()
        .unwrap();
    assert_eq!(drop, &["ALL"], "{what}");
    assert!(
        container.resources.as_ref().unwrap().requests.is_some(),
        "{what}"
    );

    // The admin listener stays on the host's loopback; the probes ask this pod's own process
    // through --admin-socket (in a volume of the pod's own), never the port both pods of a surge
    // rollout share.
    assert!(flags.admin_listen_address.ip().is_loopback(), "{what}");
    let socket = flags.admin_socket.as_ref().expect("--admin-socket is set");
    let socket_dir = socket.parent().unwrap().to_str().unwrap();
    assert!(
        container
            .volume_mounts
            .iter()
            .flatten()
            .any(|mount| mount.mount_path == socket_dir),
        "{what}: {socket_dir} is not a volume of the pod's own"
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
            ],
            "{what}"
        );
    }
}

/// A surge rollout that a draining pod does not hold: the selector excludes the label the pod
/// gives itself, which it names itself with from the downward API; the kubelet waits for the
/// drain, the grace period and a margin before it kills.
fn check_rollout_and_drain(install: &Install, flags: &ProxyFlags) {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let what = install.what.as_str();
    let daemonset = install.daemonset();
    let container = proxy_container(&daemonset);
    let pod = daemonset.spec.template.spec.clone().unwrap();

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
    assert_eq!(rolling.max_surge, Some(IntOrString::Int(1)), "{what}");
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)), "{what}");
    assert!(container.ports.as_ref().is_none_or(Vec::is_empty), "{what}");

    // The selector picks the pods by name, except those that drain; the template's labels are
    // picked.
    let selector = &daemonset.spec.selector;
    let by_name = BTreeMap::from([(
        "app.kubernetes.io/name".to_owned(),
        "kubelet-auth-proxy".to_owned(),
    )]);
    assert_eq!(selector.match_labels.as_ref(), Some(&by_name), "{what}");
    assert_eq!(
        selector.match_expressions.as_deref(),
        Some(
            &[LabelSelectorRequirement {
                key: DRAINING_LABEL.to_owned(),
                operator: "DoesNotExist".to_owned(),
                values: None,
            }][..]
        ),
        "{what}"
    );
    let labels = template_labels(&daemonset);
    assert_eq!(
        labels["app.kubernetes.io/name"], "kubelet-auth-proxy",
        "{what}"
    );
    assert!(!labels.contains_key(DRAINING_LABEL), "{what}");

    // The pod names itself from the downward API.
    let namespace = daemonset.metadata.namespace.clone().unwrap();
    assert_eq!(
        flags.drain_release_pod.as_deref(),
        Some(format!("{namespace}/{EXAMPLE_POD}").as_str()),
        "{what}: --drain-release-pod"
    );

    // The kubelet waits for the drain and the grace period before it kills.
    let grace = Duration::from_secs(
        pod.termination_grace_period_seconds
            .unwrap()
            .try_into()
            .unwrap(),
    );
    assert_eq!(
        grace,
        flags.session_drain_timeout + flags.shutdown_grace_period + TERMINATION_MARGIN,
        "{what}: terminationGracePeriodSeconds is not --session-drain-timeout {:?} + \
         --shutdown-grace-period {:?} + {TERMINATION_MARGIN:?}",
        flags.session_drain_timeout,
        flags.shutdown_grace_period
    );
}

/// The pod's service account, bound to what the proxy asks the API server (reviews, the issuer's
/// keys, the RBAC mode's lists and watches), to `get` and `patch` on pods of its namespace, and
/// held by the admission policy to the one label on its own pod.
fn check_identity(install: &Install, flags: &ProxyFlags) {
    let what = install.what.as_str();
    let daemonset = install.daemonset();
    let pod = daemonset.spec.template.spec.clone().unwrap();
    let account = pod.service_account_name.as_deref().unwrap();
    let namespace = daemonset.metadata.namespace.as_deref().unwrap();
    assert!(
        install
            .of_kind::<ServiceAccount>("ServiceAccount")
            .iter()
            .any(|sa| sa.metadata.name.as_deref() == Some(account)
                && sa.metadata.namespace.as_deref() == Some(namespace)),
        "{what}: no ServiceAccount {namespace}/{account}"
    );
    let binds_the_account = |subjects: Option<&Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.into_iter().flatten().any(|s| {
            s.kind == "ServiceAccount"
                && s.name == account
                && s.namespace.as_deref() == Some(namespace)
        })
    };
    let bindings = install.of_kind::<ClusterRoleBinding>("ClusterRoleBinding");
    // To the role that creates reviews, and to the one that reads the service-account issuer's
    // public keys, so tokens are checked on the node (docs/DELEGATION.md, "Forged tokens").
    for role in [
        "system:auth-delegator",
        "system:service-account-issuer-discovery",
    ] {
        assert!(
            bindings.iter().any(|binding| binding.role_ref.name == role
                && binds_the_account(binding.subjects.as_ref())),
            "{what}: {namespace}/{account} is not bound to {role}"
        );
    }

    // With RBAC in its chain, the account may list and watch the four kinds, and nothing else.
    assert!(
        flags.authorization_mode.contains(&AuthorizationMode::Rbac),
        "{what}"
    );
    let reader = bindings
        .iter()
        .find(|binding| {
            binds_the_account(binding.subjects.as_ref())
                && binding.role_ref.name.starts_with("kubelet-auth-proxy:")
        })
        .expect("a binding of the service account to a role of the project's own");
    let role = install
        .of_kind::<ClusterRole>("ClusterRole")
        .into_iter()
        .find(|role| role.metadata.name.as_deref() == Some(reader.role_ref.name.as_str()))
        .expect("the reader role");
    let rules = role.rules.unwrap_or_default();
    assert_eq!(rules.len(), 1, "{what}");
    assert_eq!(rules[0].verbs, ["list", "watch"], "{what}");
    assert_eq!(
        rules[0].api_groups.as_deref(),
        Some(&["rbac.authorization.k8s.io".to_owned()][..]),
        "{what}"
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
        ],
        "{what}"
    );

    // --drain-release-pod: get and patch on pods of its namespace, nothing else...
    let role_bindings = install.of_kind::<RoleBinding>("RoleBinding");
    let drain = role_bindings
        .iter()
        .find(|binding| {
            binding.metadata.namespace.as_deref() == Some(namespace)
                && binds_the_account(binding.subjects.as_ref())
        })
        .unwrap_or_else(|| panic!("{what}: no RoleBinding of {namespace}/{account}"));
    let role = install
        .of_kind::<Role>("Role")
        .into_iter()
        .find(|role| {
            role.metadata.name.as_deref() == Some(drain.role_ref.name.as_str())
                && role.metadata.namespace.as_deref() == Some(namespace)
        })
        .unwrap_or_else(|| panic!("{what}: no Role {}", drain.role_ref.name));
    let rules = role.rules.unwrap_or_default();
    assert_eq!(rules.len(), 1, "{what}");
    assert_eq!(
        rules[0].api_groups.as_deref(),
        Some(&[String::new()][..]),
        "{what}"
    );
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["pods".to_owned()][..]),
        "{what}"
    );
    assert_eq!(rules[0].verbs, ["get", "patch"], "{what}");

    // ...which the admission policy holds to the one label on its own pod (its rules are tried
    // against a real API server in real_apiserver_kustomize.rs).
    let policies = install.of_kind::<ValidatingAdmissionPolicy>("ValidatingAdmissionPolicy");
    let [policy] = &policies[..] else {
        panic!("{what}: not one ValidatingAdmissionPolicy");
    };
    let spec = policy.spec.clone().unwrap();
    let conditions = spec.match_conditions.unwrap_or_default();
    assert_eq!(
        conditions
            .iter()
            .map(|c| c.expression.as_str())
            .collect::<Vec<_>>(),
        [format!(
            "request.userInfo.username == 'system:serviceaccount:{namespace}:{account}'"
        )],
        "{what}"
    );
    let constraints = spec.match_constraints.unwrap();
    assert_eq!(
        constraints
            .namespace_selector
            .and_then(|selector| selector.match_labels),
        Some(BTreeMap::from([(
            "kubernetes.io/metadata.name".to_owned(),
            namespace.to_owned()
        )])),
        "{what}"
    );
    let rules = constraints.resource_rules.unwrap();
    assert_eq!(rules.len(), 1, "{what}");
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["pods".to_owned()][..]),
        "{what}"
    );
    assert_eq!(
        rules[0].operations.as_deref(),
        Some(&["UPDATE".to_owned()][..]),
        "{what}"
    );
    let bindings =
        install.of_kind::<ValidatingAdmissionPolicyBinding>("ValidatingAdmissionPolicyBinding");
    let [binding] = &bindings[..] else {
        panic!("{what}: not one ValidatingAdmissionPolicyBinding");
    };
    assert_eq!(
        Some(&binding.spec.policy_name),
        policy.metadata.name.as_ref(),
        "{what}"
    );
    assert_eq!(binding.spec.validation_actions, ["Deny"], "{what}");
}

/// The DaemonSet runs as the image's user and group, a pair of the proxy's own (not distroless's
/// "nonroot" nor "nobody", which other images share); its init container gives the copied key
/// pair and the handover directory that group (named once, in its environment) and closes the
/// directory to all but root and the group, and `--handover-socket` lies in that directory.
fn check_user(what: &str, daemonset: &DaemonSet, uid: i64, gid: i64) {
    let pod = daemonset.spec.template.spec.clone().unwrap();
    let security = pod.security_context.clone().unwrap();
    assert_eq!(security.run_as_user, Some(uid), "{what}");
    assert_eq!(security.run_as_group, Some(gid), "{what}");
    assert_eq!(security.fs_group, Some(gid), "{what}");
    for shared in [65532, 65534] {
        assert_ne!(uid, shared, "{what}: a user other images share");
        assert_ne!(gid, shared, "{what}: a group other images share");
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
    let group = init
        .env
        .iter()
        .flatten()
        .find(|var| var.name == "PROXY_GID")
        .and_then(|var| var.value.clone())
        .expect("PROXY_GID in the init container's environment");
    assert_eq!(group, gid.to_string(), "{what}: PROXY_GID");
    let script = init
        .command
        .iter()
        .flatten()
        .cloned()
        .collect::<Vec<_>>()
        .join(" ");
    let directory = mount(init);
    assert!(
        script.contains(&format!("chgrp \"$PROXY_GID\" {directory}")),
        "{what}: {script}"
    );
    assert!(
        script.contains(&format!("chmod 0770 {directory}")),
        "{what}: {script}"
    );
    for chgrp in script.split("chgrp ").skip(1) {
        assert!(
            chgrp.starts_with("\"$PROXY_GID\" "),
            "{what}: chgrp to another group: {script}"
        );
    }
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "handover")
        .and_then(|v| v.host_path.clone())
        .expect("the handover directory is the host's");
    assert_eq!(volume.type_.as_deref(), Some("DirectoryOrCreate"), "{what}");
    let container = proxy_container(daemonset);
    let socket = pod_args(daemonset)
        .iter()
        .find_map(|a| a.strip_prefix("--handover-socket=").map(PathBuf::from))
        .expect("--handover-socket");
    assert_eq!(
        socket.parent(),
        Some(Path::new(&mount(&container))),
        "{what}"
    );
}

/// Resident memory of an idle proxy and per idle client connection, as measured by `bench/run`
/// (docs/BENCHMARKS.md, "Idle connections": 13.4 MiB, 30.6 KiB a connection).
const IDLE_RSS_BYTES: f64 = 13.4 * 1024.0 * 1024.0;
const RSS_PER_CONNECTION_BYTES: f64 = 30.6 * 1024.0;

/// The DaemonSet's memory limit holds `--max-connections` idle connections with a quarter of it
/// to spare for requests in flight: the connection cap bites before the OOM killer does.
fn check_memory(what: &str, container: &Container, flags: &ProxyFlags) {
    let max_connections = f64::from(flags.max_connections);
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
        "{what}: --max-connections={max_connections} needs {:.0} MiB idle; the limit {limit} \
         leaves no room for requests in flight",
        needed / 1024.0 / 1024.0
    );
}

#[test]
fn the_base_daemonset_runs_a_command_line_the_proxy_starts_with_from_its_mounts() {
    check_install(&Install::base_files(), false);
}

/// The base mounts `proxy.yaml` as the DaemonSet's `--config`, and the flags override only what
/// must differ in a pod: the file's paths are a systemd node's, every other setting is the file's.
#[test]
fn the_daemonset_overrides_only_what_differs_in_a_pod() {
    let install = Install::base_files();
    let daemonset = install.daemonset();
    let overridden: BTreeSet<String> = pod_args(&daemonset)
        .iter()
        .filter_map(|arg| {
            arg.strip_prefix("--")?
                .split_once('=')
                .map(|(f, _)| camel_case(f))
        })
        .collect();
    let Value::Object(settings) = documents_of("config/proxy.yaml") else {
        panic!("proxy.yaml is not a mapping");
    };
    // Set in the file and given again: only the paths of the pod's volumes and where the audit
    // log goes, and the limits of a pod (its memory, the kubelet's rollout).
    let both: BTreeSet<&str> = settings
        .keys()
        .filter(|key| overridden.contains(*key))
        .map(String::as_str)
        .collect();
    assert_eq!(
        both,
        BTreeSet::from([
            "auditLogPath",
            "clientCaFile",
            "maxConnections",
            "tlsCertFile",
            "tlsPrivateKeyFile",
            "upstreamCaFile",
            "upstreamClientCertFile",
            "upstreamClientKeyFile",
        ])
    );
    // The pod's own: its config file, names, sockets, the wait for the kubelet's port, and the
    // admin address each overlay sets.
    let pod_only: BTreeSet<&str> = overridden
        .iter()
        .filter(|key| !settings.contains_key(*key))
        .map(String::as_str)
        .collect();
    assert_eq!(
        pod_only,
        BTreeSet::from([
            "adminListenAddress",
            "adminSocket",
            "config",
            "drainReleasePod",
            "handoverSocket",
            "listenRetryTimeout",
            "nodeName",
        ])
    );
    // The ConfigMap is generated from proxy.yaml and mounted where --config reads it.
    let config = pod_args(&daemonset)
        .iter()
        .find_map(|arg| arg.strip_prefix("--config=").map(PathBuf::from))
        .expect("--config");
    assert_eq!(
        install.mounted_file(&config),
        read(&file("config/proxy.yaml"))
    );
}

/// The overlays, each as `kubectl kustomize` renders it, pass the checks of the base; the base
/// rendered alone passes them without the local policies. Skipped without a kubectl (the one of
/// `KAP_REAL_APISERVER_KUBECTL`, else one on PATH).
#[test]
fn every_overlay_as_kubectl_renders_it_passes_the_daemonset_checks() {
    let kubectl = std::env::var_os(crate::support::real_apiserver::KUBECTL)
        .filter(|path| !path.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH")?)
                .map(|dir| dir.join("kubectl"))
                .find(|path| path.is_file())
        });
    let Some(kubectl) = kubectl else {
        eprintln!("skipped: no kubectl to render deploy/ with (KAP_REAL_APISERVER_KUBECTL, PATH)");
        return;
    };
    check_install(
        &Install::rendered("config", &kustomize(&kubectl, &file("config"))),
        false,
    );
    for overlay in overlays() {
        let what = overlay.strip_prefix(ROOT).unwrap().display().to_string();
        check_install(
            &Install::rendered(&what, &kustomize(&kubectl, &overlay)),
            true,
        );
    }
}

/// The overlays: every directory of `deploy/` with a Kustomization.
pub(crate) fn overlays() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(file("deploy"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|dir| {
            let kustomization = dir.join("kustomization.yaml");
            kustomization.is_file() && kind(&documents(&kustomization)[0]) == "Kustomization"
        })
        .collect();
    found.sort();
    assert_eq!(
        found
            .iter()
            .map(|dir| dir.file_name().unwrap().to_str().unwrap())
            .collect::<Vec<_>>(),
        ["k3s", "kubeadm", "kubelet", "rke2"]
    );
    found
}

/// `kubectl kustomize dir`'s output; panics with kubectl's error.
pub(crate) fn kustomize(kubectl: &Path, dir: &Path) -> String {
    let output = Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", kubectl.display()));
    assert!(
        output.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
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
    let daemonset = Install::base_files().flags();
    let Value::Object(proxy_yaml) = documents_of("config/proxy.yaml") else {
        panic!("proxy.yaml is not a mapping");
    };
    for (what, upstream_given) in [
        ("environment file", parse_flags(&env_args).unwrap().upstream),
        ("DaemonSet", daemonset.upstream),
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
        ("DaemonSet", daemonset.listen_address),
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
fn the_image_runs_the_binary_of_this_version_as_a_user_of_its_own() {
    let containerfile = read(&file("Containerfile"));
    assert!(
        containerfile.contains(&format!("org.opencontainers.image.version=\"{VERSION}\"")),
        "Containerfile label"
    );
    assert!(containerfile.contains("ENTRYPOINT [\"/kubelet-auth-proxy\"]"));
    assert!(containerfile.contains("--release --locked"));
    let (uid, gid) = image_user();
    assert_ne!(uid, 0);
    assert_ne!(gid, 0);
}

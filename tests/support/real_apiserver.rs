//! A real kube-apiserver, when one is given: where it is comes only from the environment
//! (`KAP_REAL_APISERVER_*`, which `.ci/run` sets after starting one), never from a path in the
//! repository. Without those variables the scenarios that need it are skipped, saying so, unless
//! `KAP_REAL_APISERVER_REQUIRED=1` asks for them: then a missing variable fails the scenario, so a
//! CI run that meant to meet the real API server cannot pass without it.
//!
//! A scenario that needs the API server started with flags of its own (an
//! `--authentication-config`) starts a [`DedicatedApiServer`] with the script `.ci/run` names in
//! `KAP_K8S_START_APISERVER`, under the same rule: skipped without it, failed without it when
//! required.
//!
//! Also the RBAC objects those scenarios and `examples/rbac_live.rs` create, built with
//! k8s-openapi's types and sent with kube's API through the admin kubeconfig (`system:masters`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::rbac::v1::{
    AggregationRule, ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::config::{KubeConfigOptions, Kubeconfig};

use super::TempDir;

/// `https://127.0.0.1:PORT`: the API server's URL.
pub const URL: &str = "KAP_REAL_APISERVER_URL";
/// The kubeconfig of a `system:masters` user: what the scenarios create and delete objects with.
pub const KUBECONFIG_ADMIN: &str = "KAP_REAL_APISERVER_KUBECONFIG_ADMIN";
/// The kubeconfig of the user `kubelet-auth-proxy` (list and watch of the four RBAC kinds,
/// `system:auth-delegator`): the proxy's `--kubeconfig`.
pub const KUBECONFIG_PROXY: &str = "KAP_REAL_APISERVER_KUBECONFIG_PROXY";
/// The absolute path of a `start-apiserver.sh` (`DIR` starts etcd and kube-apiserver under DIR and
/// prints `KEY=VALUE` lines; `DIR stop` stops them): how a scenario starts an API server of its
/// own, with `KUBE_APISERVER_EXTRA_ARGS`.
pub const START_SCRIPT: &str = "KAP_K8S_START_APISERVER";
/// The absolute path of a kubectl of the API server's version (with its built-in kustomize):
/// how the scenarios of `kubectl kustomize` and `kubectl apply` run it.
pub const KUBECTL: &str = "KAP_REAL_APISERVER_KUBECTL";
/// `1`: the variables above must be set; a scenario fails rather than skips without them.
pub const REQUIRED: &str = "KAP_REAL_APISERVER_REQUIRED";

/// The label every object a scenario creates carries, its value naming the scenario: what the
/// clean-up deletes by.
pub const OWNER_LABEL: &str = "kubelet-auth-proxy.test/owner";

/// Where the real API server is and how to reach it.
#[derive(Debug, Clone)]
pub struct RealApiServer {
    /// Its URL.
    pub url: String,
    /// The admin kubeconfig (`system:masters`).
    pub admin_kubeconfig: PathBuf,
    /// The proxy's kubeconfig.
    pub proxy_kubeconfig: PathBuf,
}

impl RealApiServer {
    /// The API server named by the environment; `None` (after saying that `scenario` is skipped)
    /// when it names none and none is required. Panics when one is required but the variables
    /// are missing.
    pub fn from_env(scenario: &str) -> Option<RealApiServer> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let required = var(REQUIRED).is_some_and(|v| v != "0");
        match (var(URL), var(KUBECONFIG_ADMIN), var(KUBECONFIG_PROXY)) {
            (Some(url), Some(admin), Some(proxy)) => Some(RealApiServer {
                url,
                admin_kubeconfig: PathBuf::from(admin),
                proxy_kubeconfig: PathBuf::from(proxy),
            }),
            _ if required => panic!(
                "{REQUIRED}=1 but {URL}, {KUBECONFIG_ADMIN} and {KUBECONFIG_PROXY} are not all \
                 set: the real API server .ci/run should have started is missing"
            ),
            _ => {
                eprintln!(
                    "skipped {scenario}: no real API server ({URL}, {KUBECONFIG_ADMIN} and \
                     {KUBECONFIG_PROXY} unset; .ci/run starts one and sets them)"
                );
                None
            }
        }
    }

    /// A kube client of the admin kubeconfig.
    pub async fn admin(&self) -> kube::Client {
        client_of(&self.admin_kubeconfig).await
    }
}

/// The start script named by [`START_SCRIPT`]; `None` (after saying that `scenario` is skipped)
/// when it is unset and no API server is required. Panics when one is required but it is unset.
pub fn start_script(scenario: &str) -> Option<PathBuf> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let required = var(REQUIRED).is_some_and(|v| v != "0");
    match var(START_SCRIPT) {
        Some(script) => Some(PathBuf::from(script)),
        None if required => panic!(
            "{REQUIRED}=1 but {START_SCRIPT} is not set: .ci/run should name the \
             start-apiserver.sh it found"
        ),
        None => {
            eprintln!(
                "skipped {scenario}: no way to start a real API server ({START_SCRIPT} unset; \
                 .ci/run sets it)"
            );
            None
        }
    }
}

/// The kubectl named by [`KUBECTL`]; `None` (after saying that `scenario` is skipped) when it is
/// unset and no API server is required. Panics when one is required but it is unset.
pub fn kubectl(scenario: &str) -> Option<PathBuf> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let required = var(REQUIRED).is_some_and(|v| v != "0");
    match var(KUBECTL) {
        Some(kubectl) => Some(PathBuf::from(kubectl)),
        None if required => panic!(
            "{REQUIRED}=1 but {KUBECTL} is not set: .ci/run should name the kubectl its \
             start-apiserver.sh printed"
        ),
        None => {
            eprintln!("skipped {scenario}: no kubectl ({KUBECTL} unset; .ci/run sets it)");
            None
        }
    }
}

/// A kube-apiserver (and its etcd) started for one scenario with flags of its own, in a
/// directory of its own; stopped (`start-apiserver.sh DIR stop`) when dropped, a panic's unwinding
/// included, and only then its directory removed.
pub struct DedicatedApiServer {
    /// Where to reach it, as [`RealApiServer::from_env`] would have said.
    pub api: RealApiServer,
    /// The CA of its serving certificate (and of its client certificates), PEM.
    pub ca_file: PathBuf,
    _started: Started,
}

/// The script and the directory it started processes under: stops them when dropped, then the
/// directory goes.
struct Started {
    script: PathBuf,
    dir: TempDir,
}

impl Drop for Started {
    fn drop(&mut self) {
        stop(&self.script, self.dir.path());
    }
}

impl DedicatedApiServer {
    /// Runs `script DIR` in a fresh directory with `KUBE_APISERVER_EXTRA_ARGS` set to
    /// `extra_args` joined by spaces (the script splits them on spaces), and waits for it (it
    /// returns once the API server is ready). Panics, showing the script's output, when it fails
    /// (after stopping whatever it started).
    pub async fn start(script: &Path, extra_args: &[String]) -> DedicatedApiServer {
        let started = Started {
            script: script.to_owned(),
            dir: TempDir::new("kube-apiserver"),
        };
        let mut command = Command::new(script);
        command
            .arg(started.dir.path())
            .env("KUBE_APISERVER_EXTRA_ARGS", extra_args.join(" "));
        let output = tokio::task::spawn_blocking(move || command.output())
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{} {} failed ({}):\n{stdout}\n{}",
            script.display(),
            started.dir.path().display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let printed: BTreeMap<String, String> = stdout
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .collect();
        let take = |key: &str| {
            printed
                .get(key)
                .unwrap_or_else(|| panic!("{} printed no {key}:\n{stdout}", script.display()))
                .clone()
        };
        let api = RealApiServer {
            url: take("KUBE_APISERVER_URL"),
            admin_kubeconfig: PathBuf::from(take("KUBECONFIG_ADMIN")),
            proxy_kubeconfig: PathBuf::from(take("KUBECONFIG_PROXY")),
        };
        let ca_file = PathBuf::from(take("KUBE_APISERVER_CA"));
        DedicatedApiServer {
            api,
            ca_file,
            _started: started,
        }
    }

    /// `IP:PORT` of its URL.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.api
            .url
            .strip_prefix("https://")
            .and_then(|authority| authority.parse().ok())
            .unwrap_or_else(|| panic!("not https://IP:PORT: {}", self.api.url))
    }
}

/// `script dir stop`, reporting (never panicking: it runs in drops) when it fails.
fn stop(script: &Path, dir: &Path) {
    match Command::new(script).arg(dir).arg("stop").output() {
        Ok(output) if output.status.success() => {}
        Ok(output) => eprintln!(
            "{} {} stop failed ({}): {}",
            script.display(),
            dir.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(e) => eprintln!("{} {} stop: {e}", script.display(), dir.display()),
    }
}

/// A kube client of the kubeconfig at `path`.
pub async fn client_of(path: &std::path::Path) -> kube::Client {
    let file = Kubeconfig::read_from(path)
        .unwrap_or_else(|e| panic!("reading the kubeconfig {}: {e}", path.display()));
    let config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("the kubeconfig {}: {e}", path.display()));
    kube::Client::try_from(config).unwrap_or_else(|e| panic!("a client of {}: {e}", path.display()))
}

/// Metadata naming an object `name`, owned by `owner` (see [`OWNER_LABEL`]), with `labels`.
pub fn meta(name: &str, owner: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    let labels: BTreeMap<String, String> = std::iter::once((OWNER_LABEL, owner))
        .chain(labels.iter().copied())
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(labels),
        ..ObjectMeta::default()
    }
}

/// A rule of the core group: `verbs` on `resources`.
pub fn core_rule(resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    }
}

/// A ClusterRole with `rules` and `labels`.
pub fn cluster_role(
    name: &str,
    owner: &str,
    labels: &[(&str, &str)],
    rules: Vec<PolicyRule>,
) -> ClusterRole {
    ClusterRole {
        metadata: meta(name, owner, labels),
        rules: Some(rules),
        ..ClusterRole::default()
    }
}

/// An aggregated ClusterRole (no rules of its own) selecting the ClusterRoles labelled
/// `key=value`.
pub fn aggregated_cluster_role(name: &str, owner: &str, key: &str, value: &str) -> ClusterRole {
    ClusterRole {
        metadata: meta(name, owner, &[]),
        aggregation_rule: Some(AggregationRule {
            cluster_role_selectors: Some(vec![LabelSelector {
                match_labels: Some(BTreeMap::from([(key.to_owned(), value.to_owned())])),
                ..LabelSelector::default()
            }]),
        }),
        rules: None,
    }
}

/// A `kind: User` subject.
pub fn user_subject(name: &str) -> Subject {
    Subject {
        kind: "User".to_owned(),
        api_group: Some("rbac.authorization.k8s.io".to_owned()),
        name: name.to_owned(),
        namespace: None,
    }
}

/// A ClusterRoleBinding of the ClusterRole `role` to `subjects`.
pub fn cluster_role_binding(
    name: &str,
    owner: &str,
    role: &str,
    subjects: Vec<Subject>,
) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: meta(name, owner, &[]),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: role.to_owned(),
        },
        subjects: Some(subjects),
    }
}

/// The sum of the samples of `metric` whose labels include all of `want`, in the API server's
/// own `/metrics` (Prometheus text), read through `client` (the admin's).
pub async fn apiserver_metric(client: &kube::Client, metric: &str, want: &[(&str, &str)]) -> f64 {
    let text = apiserver_metrics(client).await;
    super::metrics::total(&text, metric, want)
}

/// The API server's `/metrics` text.
pub async fn apiserver_metrics(client: &kube::Client) -> String {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    client
        .request_text(request)
        .await
        .unwrap_or_else(|e| panic!("GET /metrics of the API server: {e}"))
}

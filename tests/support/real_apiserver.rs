//! A real kube-apiserver, when one is given: where it is comes only from the environment
//! (`KAP_REAL_APISERVER_*`, which `.ci/run` sets after starting one), never from a path in the
//! repository. Without those variables the scenarios that need it are skipped, saying so, unless
//! `KAP_REAL_APISERVER_REQUIRED=1` asks for them: then a missing variable fails the scenario, so a
//! CI run that meant to meet the real API server cannot pass without it.
//!
//! Also the RBAC objects those scenarios and `examples/rbac_live.rs` create, built with
//! k8s-openapi's types and sent with kube's API through the admin kubeconfig (`system:masters`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::rbac::v1::{
    AggregationRule, ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// `https://127.0.0.1:PORT`: the API server's URL.
pub const URL: &str = "KAP_REAL_APISERVER_URL";
/// The kubeconfig of a `system:masters` user: what the scenarios create and delete objects with.
pub const KUBECONFIG_ADMIN: &str = "KAP_REAL_APISERVER_KUBECONFIG_ADMIN";
/// The kubeconfig of the user `kubelet-auth-proxy` (list and watch of the four RBAC kinds,
/// `system:auth-delegator`): the proxy's `--kubeconfig`.
pub const KUBECONFIG_PROXY: &str = "KAP_REAL_APISERVER_KUBECONFIG_PROXY";
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

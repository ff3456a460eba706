//! `--drain-release-pod` against a real kube-apiserver (v1.36): a proxy stopped after handing its
//! sockets to a successor over `--handover-socket` (a surge rollout) labels its own pod
//! `kubelet-auth-proxy/draining=true` with a JSON merge patch through `--kubeconfig`, so that the
//! shipped DaemonSet, whose selector excludes that label, lets go of the pod while its sessions
//! drain. Only the real API server can say whether that patch is the one it accepts (path,
//! content type, RBAC on `get` and `patch` of pods) and that it keeps the pod's other labels; and
//! only it refuses the way a cluster refuses a proxy without that grant (403), after which the
//! proxy must close its sessions with the grace period rather than hold the rollout.
//!
//! Skipped (saying so) unless `.ci/run` started an API server and set `KAP_REAL_APISERVER_*`
//! (see `support::real_apiserver`); failing, not skipped, when `KAP_REAL_APISERVER_REQUIRED=1`.
//! Each scenario works in a namespace of its own, labelled as its own and deleted when it ends,
//! passed or failed. The API server runs no controllers and has no nodes: the pod is an object
//! that is never scheduled, which is all the label needs. Every wait is bounded and polled;
//! nothing asserts how fast anything came.

use std::future::Future;
use std::time::Duration;

use http::StatusCode;
use k8s_openapi::api::core::v1::{Container, Namespace, Pod, PodSpec, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding, RoleRef};
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use crate::joining::handover_directory;
use crate::support::client::{H2_AND_HTTP1, HTTP1_ONLY};
use crate::support::process::{Deployment, ProcessSpec, ProxyProcess, run};
use crate::support::real_apiserver::{
    OWNER_LABEL, RealApiServer, client_of, core_rule, meta, user_subject,
};
use crate::support::streams::{EXEC_PROTOCOL, ExecSession};
use crate::support::{assert_contains, eventually, eventually_within};

/// The label the stopped proxy sets on its pod, and its value.
const DRAINING: (&str, &str) = ("kubelet-auth-proxy/draining", "true");
/// A label the pod has from its DaemonSet's template, which the merge patch must leave alone.
const APP: (&str, &str) = ("app.kubernetes.io/name", "kubelet-auth-proxy");
/// The user of `KAP_REAL_APISERVER_KUBECONFIG_PROXY` (`start-apiserver.sh` issues its
/// certificate): whom the Role is bound to.
const PROXY_USER: &str = "kubelet-auth-proxy";
/// The pod's name in its scenario's namespace.
const POD: &str = "kubelet-auth-proxy-x7k2p";
/// `--shutdown-grace-period` of the stopped proxy: short, so the scenarios pass it, and long
/// enough for a few attempts at the label on a shared machine.
const GRACE_PERIOD: &str = "4s";
/// How long an effect on the API server, or the proxy's reaction to one, may take to show:
/// generous (the machine is shared); it normally shows within milliseconds.
const CHANGE_BOUND: Duration = Duration::from_secs(20);
/// What the proxy logs once the pod is labelled.
const LABELLED: &str = "labelled this pod kubelet-auth-proxy/draining=true";
/// What it logs when it cannot label it.
const CANNOT_LABEL: &str = "--drain-release-pod: cannot label this pod";
/// What it logs when it goes on serving its sessions past the grace period.
const DRAINS_SESSIONS: &str = "a successor serves on the handed-over sockets";

/// The namespace of one scenario and the admin's client: every object the scenario creates
/// is in it, labelled as the scenario's own.
#[derive(Clone)]
struct Site {
    namespace: String,
    kube: kube::Client,
}

impl Site {
    fn new(kube: kube::Client, scenario: &str) -> Site {
        Site {
            namespace: format!("kap-e2e-{}-{scenario}", std::process::id()),
            kube,
        }
    }

    /// The owner label's value: the namespace's name, unique to this process and scenario.
    fn owner(&self) -> &str {
        &self.namespace
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.kube.clone(), &self.namespace)
    }

    /// The namespace, its `default` ServiceAccount (pod admission asks for it, and without a
    /// controller-manager nobody else creates it) and the pod, labelled as a DaemonSet's pod is.
    async fn create_pod(&self) {
        let namespaces: Api<Namespace> = Api::all(self.kube.clone());
        let namespace = Namespace {
            metadata: meta(&self.namespace, self.owner(), &[]),
            ..Namespace::default()
        };
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("creating the namespace {}: {e}", self.namespace));
        let account = ServiceAccount {
            metadata: meta("default", self.owner(), &[]),
            ..ServiceAccount::default()
        };
        self.api::<ServiceAccount>()
            .create(&PostParams::default(), &account)
            .await
            .unwrap_or_else(|e| panic!("creating the default ServiceAccount: {e}"));
        let pod = Pod {
            metadata: meta(POD, self.owner(), &[APP]),
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "proxy".to_owned(),
                    image: Some("local/busybox:1".to_owned()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        self.api::<Pod>()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("creating the pod {POD}: {e}"));
    }

    /// A Role of get and patch on pods in the namespace, bound to the proxy's user: what
    /// `config/rbac.yaml` grants the proxy's service account in its namespace.
    async fn grant_get_and_patch_on_pods(&self) {
        let role = Role {
            metadata: meta("pod-labeller", self.owner(), &[]),
            rules: Some(vec![core_rule(&["pods"], &["get", "patch"])]),
        };
        self.api::<Role>()
            .create(&PostParams::default(), &role)
            .await
            .unwrap_or_else(|e| panic!("creating the Role: {e}"));
        let binding = RoleBinding {
            metadata: meta("pod-labeller", self.owner(), &[]),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".to_owned()),
                kind: "Role".to_owned(),
                name: "pod-labeller".to_owned(),
            },
            subjects: Some(vec![user_subject(PROXY_USER)]),
        };
        self.api::<RoleBinding>()
            .create(&PostParams::default(), &binding)
            .await
            .unwrap_or_else(|e| panic!("creating the RoleBinding: {e}"));
    }

    /// The pod's labels, as the admin reads them.
    async fn pod_labels(&self) -> std::collections::BTreeMap<String, String> {
        self.api::<Pod>()
            .get(POD)
            .await
            .unwrap_or_else(|e| panic!("reading the pod {POD}: {e}"))
            .metadata
            .labels
            .unwrap_or_default()
    }

    /// `NAMESPACE/NAME` of the pod, for `--drain-release-pod`.
    fn pod_flag(&self) -> String {
        format!("--drain-release-pod={}/{POD}", self.namespace)
    }

    /// Deletes what the scenario created, then the namespace. Without a controller-manager no
    /// namespace controller empties a deleted namespace and removes its `kubernetes` finalizer,
    /// so the clean-up does both itself: the objects by the owner label, then the finalizer
    /// through the namespace's `finalize` subresource, as that controller would.
    async fn delete_all(&self) {
        let namespaces: Api<Namespace> = Api::all(self.kube.clone());
        let ns = &self.namespace;
        let found = namespaces
            .get_opt(ns)
            .await
            .unwrap_or_else(|e| panic!("cleaning up: reading the namespace {ns}: {e}"));
        let Some(mut namespace) = found else {
            return;
        };
        let selector = ListParams::default().labels(&format!("{OWNER_LABEL}={}", self.owner()));
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        let failed =
            |what: &str, e: kube::Error| -> ! { panic!("cleaning up the {what} of {ns}: {e}") };
        self.api::<Pod>()
            .delete_collection(&now, &selector)
            .await
            .unwrap_or_else(|e| failed("pods", e));
        self.api::<RoleBinding>()
            .delete_collection(&now, &selector)
            .await
            .unwrap_or_else(|e| failed("RoleBindings", e));
        self.api::<Role>()
            .delete_collection(&now, &selector)
            .await
            .unwrap_or_else(|e| failed("Roles", e));
        self.api::<ServiceAccount>()
            .delete_collection(&now, &selector)
            .await
            .unwrap_or_else(|e| failed("ServiceAccounts", e));
        namespaces
            .delete(ns, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| failed("namespace", e));
        namespace.metadata.resource_version = None;
        if let Some(spec) = namespace.spec.as_mut() {
            spec.finalizers = Some(Vec::new());
        }
        namespaces
            .replace_subresource("finalize", ns, &PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| failed("namespace's finalizer", e));
    }
}

/// Runs `scenario` against the real API server (or skips it) in a namespace of its own holding
/// the pod, then deletes the namespace and everything in it, whether the scenario passed or
/// not, and reports its outcome.
async fn with_pod<F, Fut>(scenario: &'static str, body: F)
where
    F: FnOnce(RealApiServer, Site) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(api) = RealApiServer::from_env(scenario) else {
        return;
    };
    eprintln!("{scenario}: against the real API server at {}", api.url);
    let site = Site::new(api.admin().await, scenario);
    let scenario_site = site.clone();
    let outcome = tokio::spawn(async move {
        scenario_site.create_pod().await;
        body(api, scenario_site).await;
    })
    .await;
    site.delete_all().await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// Two proxy processes of one node during a surge rollout: the old one (`old`), started with
/// `--drain-release-pod` naming the scenario's pod and the proxy's kubeconfig, with an exec
/// session open through it; and the new one (`new`), which took the sockets over through
/// `--handover-socket`. Nothing is stopped yet.
struct Surge {
    deployment: Deployment,
    old: ProxyProcess,
    new: ProxyProcess,
    session: ExecSession,
}

impl Surge {
    async fn start(label: &str, api: &RealApiServer, site: &Site) -> Surge {
        let deployment = ProcessSpec::new(label).prepare().await;
        let handover = format!(
            "--handover-socket={}",
            handover_directory(&deployment.dir, 0o700).display()
        );
        let old = deployment
            .start(
                "old",
                &[
                    handover.clone(),
                    format!("--kubeconfig={}", api.proxy_kubeconfig.display()),
                    site.pod_flag(),
                    format!("--shutdown-grace-period={GRACE_PERIOD}"),
                    // Far longer than any wait here: a session that ends sooner was either
                    // served to its end or closed with the grace period, never timed out.
                    "--session-drain-timeout=1h".to_owned(),
                ],
            )
            .await;
        // Opened before the successor starts, so it is the old process's for certain.
        let mut session = ExecSession::open(
            &deployment.client(old.addr(), "alice", HTTP1_ONLY),
            EXEC_PROTOCOL,
        )
        .await;
        session.echo(b"before the rollout").await;
        let new = deployment.start("new", &[handover]).await;
        assert_eq!(new.addr(), old.addr(), "{}", new.stderr());
        eventually("the old process hands its sockets over", || async {
            old.stderr()
                .contains("handed the listening sockets over through --handover-socket")
                .then_some(())
        })
        .await;
        Surge {
            deployment,
            old,
            new,
            session,
        }
    }
}

/// Asserts that the new process answers a request on a new connection: the rollout goes on.
async fn new_one_serves(deployment: &Deployment, new: &ProxyProcess) {
    let bob = deployment.client(new.addr(), "bob", H2_AND_HTTP1);
    assert_eq!(bob.get("/pods").await.status, StatusCode::OK);
}

/// The proxy's user may label pods in the namespace (a Role of get and patch bound to it): once
/// stopped with its successor serving and its session open, the old proxy labels its own pod
/// `kubelet-auth-proxy/draining=true` (keeping its other labels, so the merge patch touched only
/// that one), says so, and serves the session on past its grace period until the session ends,
/// then exits 0.
#[tokio::test]
async fn a_stopped_proxy_with_a_successor_labels_its_own_pod_so_its_daemonset_lets_go() {
    const SCENARIO: &str = "drain-release";
    with_pod(SCENARIO, |api, site| async move {
        site.grant_get_and_patch_on_pods().await;
        // The API server's RBAC authorizer learns of the binding from its own watch: wait
        // until it grants the proxy's user, so the scenario tests the proxy, not that watch.
        let as_proxy: Api<Pod> =
            Api::namespaced(client_of(&api.proxy_kubeconfig).await, &site.namespace);
        eventually_within(
            CHANGE_BOUND,
            "the Role lets the proxy's user read the pod",
            || {
                let as_proxy = as_proxy.clone();
                async move { as_proxy.get(POD).await.ok().map(|_| ()) }
            },
        )
        .await;
        assert!(
            !site.pod_labels().await.contains_key(DRAINING.0),
            "nothing labels the pod before the stop"
        );

        let mut surge = Surge::start(SCENARIO, &api, &site).await;
        surge.old.terminate();

        let labels = eventually_within(CHANGE_BOUND, "the stopped proxy labels its pod", || {
            let site = site.clone();
            async move {
                let labels = site.pod_labels().await;
                labels.contains_key(DRAINING.0).then_some(labels)
            }
        })
        .await;
        assert_eq!(
            labels.get(DRAINING.0).map(String::as_str),
            Some(DRAINING.1),
            "{labels:?}"
        );
        assert_eq!(
            labels.get(APP.0).map(String::as_str),
            Some(APP.1),
            "the DaemonSet's own label is kept: {labels:?}"
        );
        assert_eq!(
            labels.get(OWNER_LABEL).map(String::as_str),
            Some(site.owner()),
            "every other label is kept: {labels:?}"
        );
        assert_contains(&surge.old.stderr(), LABELLED);

        // The grace period ends with the session still open: the old process says it serves it
        // on, and does.
        eventually_within(
            CHANGE_BOUND,
            "the old process drains its session past the grace period",
            || async { surge.old.stderr().contains(DRAINS_SESSIONS).then_some(()) },
        )
        .await;
        surge.session.echo(b"after the grace period").await;
        // Meanwhile the successor serves everything new.
        new_one_serves(&surge.deployment, &surge.new).await;

        // The session ends by itself, and the old process with it.
        let Surge {
            deployment: _deployment,
            mut old,
            new: _new,
            session,
        } = surge;
        session.close().await;
        let status = old.wait().await;
        let log = old.stderr();
        assert_eq!(status.code(), Some(0), "{log}");
        assert!(!log.contains(CANNOT_LABEL), "{log}");
        assert_contains(&log, "every session has ended");
    })
    .await;
}

/// The proxy's user has no grant on pods (the API server answers 403): the old proxy cannot
/// label its pod, warns saying what grant it needs, leaves the pod as it was, and closes the
/// session still open at the end of its grace period, exiting by itself with 0, so that a pod
/// its DaemonSet still counts does not hold the rollout for the session's sake.
#[tokio::test]
async fn a_proxy_that_cannot_label_its_pod_closes_its_sessions_with_the_grace_period() {
    const SCENARIO: &str = "drain-refused";
    with_pod(SCENARIO, |api, site| async move {
        let mut surge = Surge::start(SCENARIO, &api, &site).await;
        surge.old.terminate();
        // The grace period serves the session as any stop does.
        surge.session.echo(b"during the grace period").await;
        // No SIGQUIT and an hour of --session-drain-timeout: only the grace period ends it.
        assert!(
            surge.session.cut().await,
            "the session was closed by the proxy at the end of its grace period, not ended \
             cleanly: {}",
            surge.old.stderr()
        );
        let status = surge.old.wait().await;
        let log = surge.old.stderr();
        assert_eq!(status.code(), Some(0), "{log}");
        assert_contains(&log, CANNOT_LABEL);
        assert_contains(&log, "403");
        assert_contains(&log, "needs get and patch on pods");
        assert_contains(
            &log,
            "still open after the shutdown grace period; closed them",
        );
        assert!(!log.contains(LABELLED), "{log}");
        assert!(!log.contains(DRAINS_SESSIONS), "{log}");
        assert!(
            !site.pod_labels().await.contains_key(DRAINING.0),
            "the API server refused the label"
        );
        // The successor serves on.
        new_one_serves(&surge.deployment, &surge.new).await;
    })
    .await;
}

/// `--drain-release-pod` that is not a pod's `NAMESPACE/NAME` is a configuration error naming
/// the flag and the value with the downward API's hint, exit status 2, before the API server's
/// credentials are even read. No API server needed.
#[tokio::test]
async fn check_config_refuses_a_drain_release_pod_that_is_not_namespace_slash_name() {
    let deployment = ProcessSpec::new("drain-release-flag").prepare().await;
    // Each value, and what the error says of it: the part that is wrong.
    for (bad, said) in [
        (
            "kubelet-auth-proxy-x7k2p",
            r#""kubelet-auth-proxy-x7k2p" is not NAMESPACE/NAME"#,
        ),
        (
            "Kube-System/pod",
            r#""Kube-System" is not a namespace name"#,
        ),
        ("kube-system/", r#""" is not a pod name"#),
    ] {
        let mut args = vec!["check-config".to_owned()];
        args.extend(deployment.command_line(&[format!("--drain-release-pod={bad}")]));
        let done = run(&deployment.dir, "check-config", &args).await;
        done.assert_code(2);
        assert_contains(&done.stderr, "--drain-release-pod");
        assert_contains(&done.stderr, said);
        assert_contains(&done.stderr, "downward API");
    }
}

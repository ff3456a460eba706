//! The kustomize installation (`config/` and `deploy/`) against the kubectl and the real
//! kube-apiserver `.ci/run` names: every kustomization (the base, the base with each of its
//! Components, each overlay) renders with `kubectl kustomize`, passes the DaemonSet checks of
//! manifests.rs, and is accepted object by object by the API server (`kubectl apply
//! --dry-run=server`: a field it would refuse, a CEL expression it cannot compile, fails here);
//! the admission policy, applied for real, lets the proxy's service account label its own pod as
//! draining and refuses everything else; and each setting of an overlay, changed once, reaches
//! every place of the DaemonSet it appears in.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::manifests::{Install, check_install, file, kustomize, overlays, read};
use crate::support::TempDir;
use crate::support::real_apiserver::{self, OWNER_LABEL, RealApiServer};

const SCENARIO: &str = "kustomize";
/// The namespace of the proxy's objects (system-node-critical pods are admitted there).
const NAMESPACE: &str = "kube-system";
/// The admission policy's name (config/admission-policy.yaml).
const POLICY: &str = "kubelet-auth-proxy-drain-label";
/// How long a new admission policy may take to be enforced (the API server loads it from its
/// watch), and RBAC bindings to apply.
const ENFORCED_WITHIN: Duration = Duration::from_secs(30);

/// Held by a scenario while it sends the base's objects to the API server: one applies the
/// service account, its RBAC and the admission policy for real and deletes them at its end, which
/// would pull them from under a dry run computing its changes to them at the same time.
static BASE_OBJECTS: Mutex<()> = Mutex::new(());

fn base_objects() -> MutexGuard<'static, ()> {
    BASE_OBJECTS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn owner() -> String {
    format!("kap-e2e-{}-{SCENARIO}", std::process::id())
}

/// kubectl with the admin kubeconfig.
fn admin(kubectl: &Path, api: &RealApiServer) -> Command {
    let mut command = Command::new(kubectl);
    command.arg("--kubeconfig").arg(&api.admin_kubeconfig);
    command
}

/// Runs `command`; its output, whatever its status.
fn output(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"))
}

/// Runs `command`, which must succeed; its standard output.
fn succeed(command: &mut Command) -> String {
    let done = output(command);
    assert!(
        done.status.success(),
        "{command:?} failed ({}): {}",
        done.status,
        String::from_utf8_lossy(&done.stderr)
    );
    String::from_utf8(done.stdout).unwrap()
}

/// Copies the directory `from` into `to`, recursively.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A copy of the repository's `config/` and `deploy/` in a directory of its own, where a test
/// may add kustomizations beside them (kustomize reads a base only by a relative path) or change
/// a file.
struct Copy {
    dir: TempDir,
}

impl Copy {
    fn new(label: &str) -> Copy {
        let dir = TempDir::new(label);
        for tree in ["config", "deploy"] {
            copy_tree(&file(tree), &dir.path().join(tree));
        }
        Copy { dir }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.dir.path().join(relative)
    }

    /// Writes `text` to `relative`, making its directory.
    fn write(&self, relative: &str, text: &str) {
        let path = self.path(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// Replaces `old` by `new` in the file at `relative`, where it appears exactly once.
    fn change(&self, relative: &str, old: &str, new: &str) {
        let text = read(&self.path(relative));
        assert_eq!(text.matches(old).count(), 1, "{relative}: {old:?}");
        self.write(relative, &text.replacen(old, new, 1));
    }
}

/// A minimal CRD for the Prometheus Operator's PrometheusRule, standing in for the operator's:
/// it checks that the Component's object has the kind, group, version and fields of a
/// PrometheusRule as kubectl sends them (unknown fields are refused under kubectl's strict field
/// validation), not the operator's own validation of the rules.
const PROMETHEUS_RULE_CRD: &str = r#"{
  "apiVersion": "apiextensions.k8s.io/v1",
  "kind": "CustomResourceDefinition",
  "metadata": {"name": "prometheusrules.monitoring.coreos.com"},
  "spec": {
    "group": "monitoring.coreos.com",
    "names": {"kind": "PrometheusRule", "listKind": "PrometheusRuleList",
              "plural": "prometheusrules", "singular": "prometheusrule"},
    "scope": "Namespaced",
    "versions": [{
      "name": "v1", "served": true, "storage": true,
      "schema": {"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
          "groups": {"type": "array", "items": {"type": "object", "required": ["name"],
            "properties": {
              "name": {"type": "string"},
              "interval": {"type": "string"},
              "rules": {"type": "array", "items": {"type": "object", "required": ["expr"],
                "properties": {
                  "alert": {"type": "string"},
                  "record": {"type": "string"},
                  "expr": {"x-kubernetes-int-or-string": true},
                  "for": {"type": "string"},
                  "keep_firing_for": {"type": "string"},
                  "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                  "annotations": {"type": "object", "additionalProperties": {"type": "string"}}
                }}}
            }}}
        }}
      }}}
    }]
  }
}"#;

/// Deletes the stand-in CRD when dropped, a panic's unwinding included.
struct CrdGuard<'a> {
    kubectl: &'a Path,
    api: &'a RealApiServer,
}

impl Drop for CrdGuard<'_> {
    fn drop(&mut self) {
        let done = output(admin(self.kubectl, self.api).args([
            "delete",
            "crd",
            "prometheusrules.monitoring.coreos.com",
            "--ignore-not-found",
            "--wait=false",
        ]));
        if !done.status.success() {
            eprintln!(
                "{SCENARIO}: deleting the PrometheusRule CRD: {}",
                String::from_utf8_lossy(&done.stderr)
            );
        }
    }
}

/// `objects` as one `List`, which kubectl applies item by item.
fn list(objects: Vec<Value>) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects})
}

/// `kubectl apply --dry-run=server` of `install`'s objects: each must be accepted, one line per
/// object. Prints the lines (`… created (server dry run)`).
fn dry_run(kubectl: &Path, api: &RealApiServer, dir: &TempDir, install: &Install) {
    let path = dir.write("rendered.json", list(install.objects.clone()).to_string());
    let printed = succeed(
        admin(kubectl, api)
            .args(["apply", "--dry-run=server", "-f"])
            .arg(&path),
    );
    let lines: Vec<&str> = printed.lines().collect();
    for line in &lines {
        assert!(
            [" created", " configured", " unchanged"]
                .iter()
                .any(|verb| line.ends_with(&format!("{verb} (server dry run)"))),
            "{}: {line}",
            install.what
        );
    }
    assert_eq!(
        lines.len(),
        install.objects.len(),
        "{}: {printed}",
        install.what
    );
    let kinds: BTreeSet<&str> = install
        .objects
        .iter()
        .map(|object| object["kind"].as_str().unwrap())
        .collect();
    println!(
        "== {}: {} objects, kinds {kinds:?}",
        install.what,
        lines.len()
    );
    println!("{printed}");
}

/// Every kustomization renders, passes the DaemonSet checks, and the API server accepts every
/// object of it.
#[test]
fn every_kustomization_renders_and_the_api_server_accepts_it() {
    let Some(api) = RealApiServer::from_env(SCENARIO) else {
        return;
    };
    let Some(kubectl) = real_apiserver::kubectl(SCENARIO) else {
        return;
    };
    eprintln!("{SCENARIO}: against the real API server at {}", api.url);
    let _base_objects = base_objects();
    let dir = TempDir::new("kustomize-dry-run");

    // The PrometheusRule needs its CRD, established before the dry run.
    let _crd = CrdGuard {
        kubectl: &kubectl,
        api: &api,
    };
    let crd = dir.write("crd.json", PROMETHEUS_RULE_CRD);
    succeed(admin(&kubectl, &api).arg("apply").arg("-f").arg(&crd));
    succeed(admin(&kubectl, &api).args([
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/prometheusrules.monitoring.coreos.com",
    ]));

    // The Components on the base, as an overlay would add them.
    let copy = Copy::new("kustomize-components");
    for component in ["policy", "monitoring"] {
        copy.write(
            &format!("with-{component}/kustomization.yaml"),
            &format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
                 resources: [../config]\ncomponents: [../config/{component}]\n"
            ),
        );
    }
    let mut targets: Vec<(String, PathBuf, bool)> = vec![
        ("config".to_owned(), file("config"), false),
        (
            "config + config/policy".to_owned(),
            copy.path("with-policy"),
            true,
        ),
        (
            "config + config/monitoring".to_owned(),
            copy.path("with-monitoring"),
            false,
        ),
    ];
    for overlay in overlays() {
        let what = format!("deploy/{}", overlay.file_name().unwrap().to_str().unwrap());
        targets.push((what, overlay, true));
    }
    for (what, path, policies) in targets {
        let install = Install::rendered(&what, &kustomize(&kubectl, &path));
        check_install(&install, policies);
        let rules = install
            .objects
            .iter()
            .filter(|object| object["kind"] == "PrometheusRule")
            .count();
        assert_eq!(rules, usize::from(what.ends_with("monitoring")), "{what}");
        dry_run(&kubectl, &api, &dir, &install);
    }
}

/// The objects of the base the admission policy needs (the service account, its Role and
/// RoleBinding, the policy and its binding), labelled as this scenario's and applied for real;
/// deleted when dropped.
struct DrainObjects<'a> {
    kubectl: &'a Path,
    api: &'a RealApiServer,
    pods: Vec<String>,
}

impl Drop for DrainObjects<'_> {
    fn drop(&mut self) {
        let mut deletions: Vec<Vec<String>> = self
            .pods
            .iter()
            .map(|pod| vec!["-n".into(), NAMESPACE.into(), "pod".into(), pod.clone()])
            .collect();
        for (kind, name) in [
            ("validatingadmissionpolicybinding", POLICY),
            ("validatingadmissionpolicy", POLICY),
        ] {
            deletions.push(vec![kind.into(), name.into()]);
        }
        for (kind, name) in [
            ("rolebinding", "kubelet-auth-proxy:drain-release"),
            ("role", "kubelet-auth-proxy:drain-release"),
            ("serviceaccount", "kubelet-auth-proxy"),
        ] {
            deletions.push(vec![
                "-n".into(),
                NAMESPACE.into(),
                kind.into(),
                name.into(),
            ]);
        }
        for deletion in deletions {
            let done = output(
                admin(self.kubectl, self.api)
                    .args(["delete", "--ignore-not-found", "--wait=false"])
                    .args(&deletion),
            );
            if !done.status.success() {
                eprintln!(
                    "{SCENARIO}: cleaning up {deletion:?}: {}",
                    String::from_utf8_lossy(&done.stderr)
                );
            }
        }
    }
}

/// A kubeconfig for the API server of `admin_kubeconfig` that authenticates with `token` alone.
fn token_kubeconfig(dir: &TempDir, admin_kubeconfig: &Path, token: &str, name: &str) -> PathBuf {
    let admin: Value = serde_saphyr::from_str(&read(admin_kubeconfig)).unwrap();
    let cluster = admin["clusters"][0]["cluster"].clone();
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "api", "cluster": cluster}],
        "users": [{"name": "token", "user": {"token": token}}],
        "contexts": [{"name": "token", "context": {"cluster": "api", "user": "token"}}],
        "current-context": "token",
    });
    dir.write(name, kubeconfig.to_string())
}

/// A pod's labels and annotations, as the API server keeps them.
fn labels_and_annotations(kubectl: &Path, api: &RealApiServer, pod: &str) -> (Value, Value) {
    let printed =
        succeed(admin(kubectl, api).args(["-n", NAMESPACE, "get", "pod", pod, "-o", "json"]));
    let pod: Value = serde_json::from_str(&printed).unwrap();
    (
        pod["metadata"]["labels"].clone(),
        pod["metadata"]["annotations"].clone(),
    )
}

/// The admission policy, for real: with a token bound to its pod, the proxy's service account
/// may label that pod `kubelet-auth-proxy/draining=true`, and is refused, with the policy's
/// message, another pod, another label or value, an annotation; a token bound to no pod may
/// change no pod.
#[test]
fn the_drain_policy_lets_the_proxy_mark_only_its_own_pod_as_draining() {
    let Some(api) = RealApiServer::from_env(SCENARIO) else {
        return;
    };
    let Some(kubectl) = real_apiserver::kubectl(SCENARIO) else {
        return;
    };
    let _base_objects = base_objects();
    let dir = TempDir::new("kustomize-drain-policy");
    let own = format!("{}-own", owner());
    let other = format!("{}-other", owner());
    let _objects = DrainObjects {
        kubectl: &kubectl,
        api: &api,
        pods: vec![own.clone(), other.clone()],
    };

    // The base's service account, Role, RoleBinding and admission policy.
    let base = Install::rendered("config", &kustomize(&kubectl, &file("config")));
    let needed: Vec<Value> = base
        .objects
        .iter()
        .filter(|object| {
            [
                "ServiceAccount",
                "Role",
                "RoleBinding",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
            ]
            .contains(&object["kind"].as_str().unwrap())
        })
        .map(|object| {
            let mut object = object.clone();
            object["metadata"]["labels"][OWNER_LABEL] = Value::String(owner());
            object
        })
        .collect();
    assert_eq!(needed.len(), 5, "{needed:?}");
    let objects = dir.write("objects.json", list(needed).to_string());
    succeed(admin(&kubectl, &api).arg("apply").arg("-f").arg(&objects));

    // Two pods of the service account (no node runs them: the API server keeps them pending).
    for pod in [&own, &other] {
        let manifest = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "namespace": NAMESPACE,
                         "labels": {OWNER_LABEL: owner()}},
            "spec": {"serviceAccountName": "kubelet-auth-proxy",
                     "containers": [{"name": "proxy", "image": "kubelet-auth-proxy"}]},
        });
        let path = dir.write(&format!("{pod}.json"), manifest.to_string());
        succeed(admin(&kubectl, &api).arg("apply").arg("-f").arg(&path));
    }

    // A token bound to the first pod, as the kubelet mounts into it, and one bound to nothing.
    let bound = succeed(admin(&kubectl, &api).args([
        "-n",
        NAMESPACE,
        "create",
        "token",
        "kubelet-auth-proxy",
        "--bound-object-kind=Pod",
        &format!("--bound-object-name={own}"),
    ]));
    let unbound = succeed(admin(&kubectl, &api).args([
        "-n",
        NAMESPACE,
        "create",
        "token",
        "kubelet-auth-proxy",
    ]));
    let as_pod = token_kubeconfig(
        &dir,
        &api.admin_kubeconfig,
        bound.trim(),
        "bound.kubeconfig",
    );
    let unbound = token_kubeconfig(
        &dir,
        &api.admin_kubeconfig,
        unbound.trim(),
        "unbound.kubeconfig",
    );
    let proxy = |kubeconfig: &Path, args: &[&str]| -> Output {
        output(
            Command::new(&kubectl)
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .args(["-n", NAMESPACE])
                .args(args),
        )
    };
    let refusal = |done: &Output| -> String {
        assert!(
            !done.status.success(),
            "allowed: {}",
            String::from_utf8_lossy(&done.stdout)
        );
        String::from_utf8_lossy(&done.stderr).trim().to_owned()
    };
    let by_policy = format!(
        "is forbidden: ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request: "
    );

    // The policy and the RBAC binding take a moment to apply: a request the policy refuses is
    // first refused by RBAC, or allowed. Asked as a dry run, so that one allowed changes nothing.
    let started = Instant::now();
    loop {
        let done = proxy(
            &as_pod,
            &[
                "label",
                "--dry-run=server",
                "pod",
                &other,
                "kubelet-auth-proxy/draining=true",
            ],
        );
        if !done.status.success() && String::from_utf8_lossy(&done.stderr).contains(&by_policy) {
            break;
        }
        assert!(
            started.elapsed() < ENFORCED_WITHIN,
            "the policy is not enforced within {ENFORCED_WITHIN:?}: {}{}",
            String::from_utf8_lossy(&done.stdout),
            String::from_utf8_lossy(&done.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Its own pod, marked as draining: allowed.
    let done = proxy(
        &as_pod,
        &["label", "pod", &own, "kubelet-auth-proxy/draining=true"],
    );
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let (labels, annotations) = labels_and_annotations(&kubectl, &api, &own);
    assert_eq!(labels["kubelet-auth-proxy/draining"], "true");

    // Another pod: refused, naming both.
    let message = refusal(&proxy(
        &as_pod,
        &["label", "pod", &other, "kubelet-auth-proxy/draining=true"],
    ));
    assert!(
        message.ends_with(&format!(
            "{by_policy}kubelet-auth-proxy may change only its own pod (the one its \
             service-account token is bound to: {own}), not {other}"
        )),
        "{message}"
    );
    // Another label, another value, a label removed, an annotation: refused, saying what may be
    // changed.
    let labels_only = format!(
        "{by_policy}kubelet-auth-proxy may only add the label kubelet-auth-proxy/draining=true \
         to its pod: no other label may be added, changed or removed"
    );
    for args in [
        &["label", "pod", &own, "team=proxy"][..],
        &[
            "label",
            "--overwrite",
            "pod",
            &own,
            "kubelet-auth-proxy/draining=false",
        ],
        &["label", "pod", &own, &format!("{OWNER_LABEL}-")],
    ] {
        let message = refusal(&proxy(&as_pod, args));
        assert!(message.ends_with(&labels_only), "{args:?}: {message}");
    }
    let message = refusal(&proxy(&as_pod, &["annotate", "pod", &own, "note=x"]));
    assert!(
        message.ends_with(&format!(
            "{by_policy}kubelet-auth-proxy may not change a pod's annotations"
        )),
        "{message}"
    );
    // A token bound to no pod: no pod is its own.
    let message = refusal(&proxy(
        &unbound,
        &["label", "pod", &other, "kubelet-auth-proxy/draining=true"],
    ));
    assert!(
        message.ends_with(&format!(
            "{by_policy}kubelet-auth-proxy may change only its own pod (the one its \
             service-account token is bound to: none), not {other}"
        )),
        "{message}"
    );

    // Nothing refused was changed.
    assert_eq!(
        labels_and_annotations(&kubectl, &api, &own),
        (labels, annotations)
    );
    let (labels, _) = labels_and_annotations(&kubectl, &api, &other);
    assert!(
        labels.get("kubelet-auth-proxy/draining").is_none(),
        "{labels}"
    );
}

/// The leaves of `value` (a rendered object) with their paths: `spec.template.spec.volumes[3]
/// .hostPath.path` → its value as text.
fn leaves(value: &Value, path: &str, found: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                leaves(value, &format!("{path}.{key}"), found);
            }
        }
        Value::Array(items) => {
            for (index, value) in items.iter().enumerate() {
                leaves(value, &format!("{path}[{index}]"), found);
            }
        }
        Value::String(text) => found.push((path.to_owned(), text.clone())),
        other => found.push((path.to_owned(), other.to_string())),
    }
}

/// Where a value appears in a rendered DaemonSet: the paths of the leaves `appears` picks.
fn places(daemonset: &Value, appears: &dyn Fn(&str, &str) -> bool) -> BTreeSet<String> {
    let mut found = Vec::new();
    leaves(daemonset, "", &mut found);
    found
        .into_iter()
        .filter(|(path, value)| appears(path, value))
        .map(|(path, _)| path)
        .collect()
}

/// Each setting of an overlay, and each image, stated once there: changed once, every place the
/// old value was in the rendered DaemonSet holds the new one, and the old one is nowhere.
#[test]
fn each_setting_of_an_overlay_is_changed_in_one_place() {
    let Some(kubectl) = real_apiserver::kubectl(SCENARIO) else {
        return;
    };
    let copy = Copy::new("kustomize-settings");
    let overlay = "deploy/k3s";
    let render = |dir: &Path| -> Value {
        let install = Install::rendered(overlay, &kustomize(&kubectl, dir));
        serde_json::to_value(install.daemonset()).unwrap()
    };
    let before = render(&copy.path(overlay));

    // (what, the text in the overlay, its replacement, the old value, the new one, where a value
    // counts as appearing: a hostPath's path, or anywhere).
    type Appears = fn(&str, &str, &str) -> bool;
    let anywhere: Appears = |_, value, wanted| value.contains(wanted);
    let host_path: Appears =
        |path, value, wanted| path.ends_with(".hostPath.path") && value == wanted;
    let changes: [(&str, &str, &str, &str, &str, Appears, usize); 8] = [
        (
            "settings.yaml",
            "uid: \"10250\"",
            "uid: \"20001\"",
            "10250",
            "20001",
            anywhere,
            4,
        ),
        (
            "settings.yaml",
            "handoverDirectory: /run/kubelet-auth-proxy",
            "handoverDirectory: /run/kap-handover",
            "/run/kubelet-auth-proxy",
            "/run/kap-handover",
            host_path,
            1,
        ),
        (
            "settings.yaml",
            "adminListenAddress: 127.0.0.1:10262",
            "adminListenAddress: 127.0.0.1:19999",
            "127.0.0.1:10262",
            "127.0.0.1:19999",
            anywhere,
            1,
        ),
        (
            "settings.yaml",
            "kubeletServingCertificate: /var/lib/rancher/k3s/agent/serving-kubelet.crt",
            "kubeletServingCertificate: /srv/k3s/serving.crt",
            "/var/lib/rancher/k3s/agent/serving-kubelet.crt",
            "/srv/k3s/serving.crt",
            host_path,
            1,
        ),
        (
            "settings.yaml",
            "kubeletServingKey: /var/lib/rancher/k3s/agent/serving-kubelet.key",
            "kubeletServingKey: /srv/k3s/serving.key",
            "/var/lib/rancher/k3s/agent/serving-kubelet.key",
            "/srv/k3s/serving.key",
            host_path,
            1,
        ),
        (
            "settings.yaml",
            "kubeletServingCA: /var/lib/rancher/k3s/agent/server-ca.crt",
            "kubeletServingCA: /srv/k3s/ca.crt",
            "/var/lib/rancher/k3s/agent/server-ca.crt",
            "/srv/k3s/ca.crt",
            host_path,
            1,
        ),
        (
            "kustomization.yaml",
            "newName: kubelet-auth-proxy\n    newTag: \"0.1.0\"",
            "newName: registry.example/kubelet-auth-proxy\n    newTag: \"9.9.9\"",
            "kubelet-auth-proxy:0.1.0",
            "registry.example/kubelet-auth-proxy:9.9.9",
            anywhere,
            1,
        ),
        (
            "kustomization.yaml",
            "newName: busybox\n    newTag: \"1.37\"",
            "newName: registry.example/busybox\n    newTag: \"1.36\"",
            "busybox:1.37",
            "registry.example/busybox:1.36",
            anywhere,
            1,
        ),
    ];
    for (name, text, replacement, ..) in &changes {
        copy.change(&format!("{overlay}/{name}"), text, replacement);
    }
    let after = render(&copy.path(overlay));

    for (name, text, _, old, new, appears, count) in changes {
        let was = places(&before, &|path, value| appears(path, value, old));
        let now = places(&after, &|path, value| appears(path, value, new));
        assert_eq!(was.len(), count, "{name}: {text}: {old} appears at {was:?}");
        assert_eq!(now, was, "{name}: {text}: {new} is not where {old} was");
        let left = places(&after, &|path, value| appears(path, value, old));
        assert!(left.is_empty(), "{name}: {text}: {old} is left at {left:?}");
    }
}

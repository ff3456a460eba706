//! Set-ups shared by the unit tests of several modules: the user a request is judged as, the
//! authorizers and deciders with which the request decision's tests and `explain`'s tests judge
//! the same requests, an HTTP/2 client on loopback, and scratch directories. Built in one place, so that those tests
//! state only what they ask and what they expect.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use crate::authn::User;
use crate::authn::x509::CREDENTIAL_ID_EXTRA;
use crate::authz::attributes::AttributeMapping;
use crate::authz::node::NodeAuthorizer;
use crate::authz::policy::PolicyAuthorizer;
use crate::authz::{Authorizer, AuthorizerChain};
use crate::base::reload::Reloadable;
use crate::request::decision::Decider;
use crate::test_data::{MONITORING_POLICY, text};

/// How long a loopback exchange may take: a bug fails the test, it never hangs it.
const WAIT: Duration = Duration::from_secs(10);

/// The node every fixture decider and Node authorizer serves.
pub(crate) const NODE: &str = "node-a";

/// Pod-level grants for `--pod-scoped-authz`: alice may exec, attach, port-forward and read logs
/// in pod team-a/web-0 only (through a Role, whose `nodes/proxy` rule can never match: a Role is
/// only asked about pods), and do all of that to every pod of team-b (through a RoleBinding to a
/// ClusterRole); ops may create nodes/proxy (every pod, as the kubelet allows).
pub(crate) const POD_POLICY: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: web-0-debugger, namespace: team-a}
rules:
- {apiGroups: [""], resources: [pods/exec, pods/attach, pods/portforward], verbs: [create], resourceNames: [web-0]}
- {apiGroups: [""], resources: [pods/log], verbs: [get], resourceNames: [web-0]}
- {apiGroups: [""], resources: [nodes/proxy], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: alice-web-0, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: web-0-debugger}
subjects: [{kind: User, name: alice}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: pod-debugger}
rules:
- {apiGroups: [""], resources: [pods/exec, pods/attach, pods/portforward], verbs: [create]}
- {apiGroups: [""], resources: [pods/log], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: alice-team-b, namespace: team-b}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pod-debugger}
subjects: [{kind: User, name: alice}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: node-exec}
rules: [{apiGroups: [""], resources: [nodes/proxy], verbs: [create, get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ops-node-exec}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: node-exec}
subjects: [{kind: User, name: ops}]
"#;

/// `name` in `groups`, with no uid and no extra.
pub(crate) fn user(name: &str, groups: &[&str]) -> User {
    User {
        name: name.into(),
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        ..User::default()
    }
}

/// `name` with uid `uid` in `groups`, as a client certificate authenticates it: with the
/// certificate's credential id (`X509SHA256=…`) as an extra attribute.
pub(crate) fn certificate_user(
    name: &str,
    uid: &str,
    groups: &[&str],
    credential_id: &str,
) -> User {
    User {
        uid: uid.to_owned(),
        extra: BTreeMap::from([(
            CREDENTIAL_ID_EXTRA.to_owned(),
            vec![credential_id.to_owned()],
        )]),
        ..user(name, groups)
    }
}

/// Runs `future` on a current-thread runtime of its own: a decision is async, the tests that
/// judge one need not be.
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime")
        .block_on(future)
}

/// The Policy authorizer of one file named `file` holding `text`, loaded as the server loads it
/// (a [`Reloadable`]).
pub(crate) fn policy(file: &str, text: &str) -> Authorizer {
    let source = [(file.to_owned(), text.to_owned())];
    let policy = Reloadable::load("policy", Vec::new(), move |_| {
        PolicyAuthorizer::from_sources(&source).map_err(|e| e.to_string())
    })
    .unwrap_or_else(|e| panic!("the test policy {file} loads: {e}"));
    Authorizer::Policy(Arc::new(policy))
}

/// The Policy authorizer of [`MONITORING_POLICY`], as the file `p.yaml`.
pub(crate) fn monitoring_policy() -> Authorizer {
    policy("p.yaml", &text(MONITORING_POLICY))
}

/// The Node authorizer of [`NODE`].
pub(crate) fn node_authorizer() -> Authorizer {
    Authorizer::Node(NodeAuthorizer::new(NODE.into()))
}

/// A decider on [`NODE`] asking `authorizers` in order, with the kubelet's default mapping.
pub(crate) fn decider(authorizers: Vec<Authorizer>) -> Decider {
    Decider {
        authorizers: AuthorizerChain::new(authorizers),
        mapping: AttributeMapping::default(),
        node_name: Arc::from(NODE),
    }
}

/// The Node authorizer, then [`POD_POLICY`] (as `pods.yaml`), with `--pod-scoped-authz` on or
/// off.
pub(crate) fn pod_decider(pod_scoped: bool) -> Decider {
    Decider {
        mapping: AttributeMapping {
            pod_scoped,
            ..AttributeMapping::default()
        },
        ..decider(vec![node_authorizer(), policy("pods.yaml", POD_POLICY)])
    }
}

/// An HTTP/2 connection (prior knowledge, no TLS) to `addr`, driven in the background.
pub(crate) async fn http2_connect(addr: SocketAddr) -> http2::SendRequest<Full<Bytes>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

/// Sends `req` on the HTTP/2 connection of `sender`; the answer must come within [`WAIT`].
pub(crate) async fn send_http2(
    sender: &mut http2::SendRequest<Full<Bytes>>,
    req: Request<Full<Bytes>>,
) -> Response<Incoming> {
    tokio::time::timeout(WAIT, sender.send_request(req))
        .await
        .unwrap()
        .unwrap()
}

/// A scratch directory under the system temp dir, unique in the process, removed on drop. The
/// path is public so tests join names to it as they need.
pub(crate) struct TempDir(pub(crate) std::path::PathBuf);

impl TempDir {
    /// A new directory, `0700`, named after `name`.
    pub(crate) fn new(name: &str) -> TempDir {
        TempDir::with_mode(name, 0o700)
    }

    /// A new directory with the permission bits `mode`.
    pub(crate) fn with_mode(name: &str, mode: u32) -> TempDir {
        use std::os::unix::fs::PermissionsExt as _;
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "kubelet-auth-proxy-unit-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

//! A webhook's CEL `matchConditions` through the real proxy over TLS, configured with
//! `--authorization-config`, reviewing with the stand-in API server: which requests reach the
//! webhook at all and the exact SubjectAccessReview bodies those send (the examples of the
//! Kubernetes authorization documentation: skip the nodes, ask only about `nodes/proxy`), an
//! evaluation error answered by the failure policy (Deny: the kubelet's 500; NoOpinion: the next
//! authorizer decides), a condition over the cost limit on one review answered the same way, the
//! metrics, `explain` showing each condition's result, and the example of docs/OPERATIONS.md.

use http::StatusCode;
use serde_json::{Value, json};

use crate::manifests::{file, read};
use crate::support::TempDir;
use crate::support::answers::assert_authorization_error;
use crate::support::apiserver::{ApiServer, Flavour, TokenUser};
use crate::support::client::Identity;
use crate::support::harness::{Harness, NODE_NAME, ProxySpec};
use crate::support::pki::{CertSpec, sha256_hex};
use crate::support::process::run;

const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";
const EXCLUSIONS: &str = "kubelet_auth_proxy_authorization_match_condition_exclusions_total";
const ERRORS: &str = "kubelet_auth_proxy_authorization_match_condition_evaluation_errors_total";

/// Skip the webhook for the nodes (Kubernetes documentation, "Configuring the API Server using
/// an Authorization Config File").
const NOT_NODES: &str = "!('system:nodes' in request.groups)";
/// Ask the webhook only about `nodes/proxy`.
const ONLY_NODES_PROXY: &str = "has(request.resourceAttributes) && \
     request.resourceAttributes.resource == 'nodes' && \
     request.resourceAttributes.subresource == 'proxy'";

/// An AuthorizationConfiguration of these authorizers (YAML list items).
fn authorization_config(dir: &TempDir, authorizers: &str) -> String {
    dir.write(
        "authorization.yaml",
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthorizationConfiguration\n\
             authorizers:\n{authorizers}"
        ),
    )
    .display()
    .to_string()
}

/// A Webhook authorizer named `name` reviewing with `api`, with `failure_policy` and these
/// conditions, not caching (every review the proxy makes reaches the stand-in).
fn webhook(api: &ApiServer, name: &str, failure_policy: &str, conditions: &[&str]) -> String {
    let conditions: String = conditions
        .iter()
        .map(|c| format!("        - expression: {}\n", json!(c)))
        .collect();
    format!(
        "  - type: Webhook
    name: {name}
    webhook:
      timeout: 3s
      cacheAuthorizedRequests: false
      cacheUnauthorizedRequests: false
      subjectAccessReviewVersion: v1
      matchConditionSubjectAccessReviewVersion: v1
      failurePolicy: {failure_policy}
      connectionInfo:
        type: KubeConfigFile
        kubeConfigFile: {kubeconfig}
      matchConditions:
{conditions}",
        kubeconfig = api.kubeconfig(Flavour::ClientCertificate).display()
    )
}

async fn proxy(dir: &TempDir, authorizers: &str) -> Harness {
    let config = authorization_config(dir, authorizers);
    ProxySpec::new(&[&format!("--authorization-config={config}")])
        .start()
        .await
}

/// The spec the kubelet sends for the x509 user `name` (in `groups`) asking `get nodes/<sub>`.
fn review(name: &str, groups: &[&str], subresource: &str, leaf: &[u8]) -> Value {
    let mut groups: Vec<&str> = groups.to_vec();
    groups.push("system:authenticated");
    json!({
        "resourceAttributes": {
            "verb": "get",
            "version": "v1",
            "resource": "nodes",
            "subresource": subresource,
            "name": NODE_NAME,
        },
        "user": name,
        "groups": groups,
        "extra": {CREDENTIAL_ID: [format!("X509SHA256={}", sha256_hex(leaf))]},
    })
}

/// Sends `GET path` as the x509 user `name` in `groups`: answered 200, and the stand-in has then
/// received `reviews` reviews, the last exactly the kubelet's for `get nodes/<subresource>`.
async fn assert_reviewed(
    h: &Harness,
    api: &ApiServer,
    (name, groups): (&str, &[&str]),
    path: &str,
    subresource: &str,
    reviews: usize,
) {
    let spec = groups
        .iter()
        .fold(CertSpec::client(name), |spec, group| spec.org(group));
    let cert = h.ca.issue(&spec);
    let reply = h.client(Identity::of(&cert)).get(path).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let received = api.access_reviews();
    assert_eq!(received.len(), reviews, "{received:?}");
    assert_eq!(
        received[reviews - 1],
        review(name, groups, subresource, cert.leaf())
    );
}

/// `webhook` followed by an AlwaysAllow authorizer.
fn then_allow(webhook: String) -> String {
    format!("{webhook}  - {{type: AlwaysAllow, name: allow}}\n")
}

#[tokio::test]
async fn the_nodes_never_reach_the_webhook_and_others_only_for_nodes_proxy() {
    let api = ApiServer::start_allowing().await;
    let dir = TempDir::new("match-conditions");
    let h = proxy(
        &dir,
        &webhook(&api, "apiserver", "Deny", &[NOT_NODES, ONLY_NODES_PROXY]),
    )
    .await;

    // A node: the first condition is false for both attribute sets (pods, then proxy), so the
    // webhook is skipped twice, no review is sent, and nothing else allows: the kubelet's 403.
    let node = h.user("system:node:node-b", &["system:nodes"]);
    let reply = node.get("/pods").await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.text());
    assert_eq!(
        reply.text(),
        "Forbidden (user=system:node:node-b, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
    );
    assert_eq!(api.access_reviews(), Vec::<Value>::new());
    assert_eq!(h.metric(EXCLUSIONS, &[("name", "apiserver")]).await, 2.0);

    // Anyone else: nodes/pods is skipped (not proxy), then the nodes/proxy fallback is reviewed,
    // with exactly the kubelet's body; the stand-in allows.
    let alice = ("alice", &["team-a"][..]);
    assert_reviewed(&h, &api, alice, "/pods", "proxy", 1).await;
    assert_eq!(h.metric(EXCLUSIONS, &[("name", "apiserver")]).await, 3.0);

    // Asked about nodes/proxy directly: reviewed once, nothing skipped.
    let logs = "/containerLogs/default/web-0/app";
    assert_reviewed(&h, &api, alice, logs, "proxy", 2).await;
    assert_eq!(h.metric(EXCLUSIONS, &[("name", "apiserver")]).await, 3.0);
    assert_eq!(h.metric(ERRORS, &[("name", "apiserver")]).await, 0.0);
}

/// True for a caller with an organization (x509 groups: the orgs, then system:authenticated); an
/// index out of range, an evaluation error, for one without.
const SECOND_GROUP: &str = "request.groups[1] == 'system:authenticated'";

#[tokio::test]
async fn an_evaluation_error_follows_the_failure_policy() {
    let api = ApiServer::start_allowing().await;

    // Deny: the chain stops at the error, before the AlwaysAllow after it, with the kubelet's 500;
    // nothing is sent to the webhook.
    let dir = TempDir::new("match-conditions-deny");
    let h = proxy(
        &dir,
        &then_allow(webhook(&api, "strict", "Deny", &[SECOND_GROUP, "true"])),
    )
    .await;
    let reply = h.user("bob", &[]).get("/pods").await;
    assert_authorization_error(&reply, "bob", "get", "pods");
    assert_eq!(api.access_reviews(), Vec::<Value>::new());
    assert_eq!(h.metric(ERRORS, &[("name", "strict")]).await, 1.0);
    assert_eq!(h.metric(EXCLUSIONS, &[("name", "strict")]).await, 0.0);
    // A caller for whom every condition is true is reviewed as usual.
    assert_reviewed(&h, &api, ("carol", &["ops"]), "/pods", "pods", 1).await;

    // NoOpinion: the error is set aside and the next authorizer decides; it allows.
    let dir = TempDir::new("match-conditions-no-opinion");
    let h = proxy(
        &dir,
        &then_allow(webhook(&api, "lenient", "NoOpinion", &[SECOND_GROUP])),
    )
    .await;
    let reply = h.user("bob", &[]).get("/pods").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(api.access_reviews().len(), 1, "no review for bob");
    assert_eq!(h.metric(ERRORS, &[("name", "lenient")]).await, 1.0);
}

/// A deny list, linear in the groups: within the load limit for the largest review, over the
/// per-call limit (1,000,000) for a user of 50,000 groups (26 a group).
const DENY_LIST: &str =
    "request.groups.all(g, !(g in ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j']))";
/// The cost limit error for a user of 50,000 groups: 26 a group, 3 for the rest.
const OVER_THE_LIMIT: &str =
    "operation cancelled: actual cost limit exceeded (cost 1300003, limit 1000000)";

/// 50,000 groups, about 400 KB of TokenReview answer, within the proxy's 1 MiB.
fn many_groups() -> Vec<String> {
    (0..50_000).map(|i| format!("g{i}")).collect()
}

#[tokio::test]
async fn a_condition_over_the_cost_limit_follows_the_failure_policy() {
    let api = ApiServer::start_allowing().await;
    let groups = many_groups();
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    api.add_token("many-groups", TokenUser::new("dave").groups(&groups));
    api.add_token("few-groups", TokenUser::new("erin").groups(&["ops"]));
    let start = |dir: &TempDir, failure_policy: &str, name: &str| {
        let config = authorization_config(
            dir,
            &then_allow(webhook(&api, name, failure_policy, &[DENY_LIST])),
        );
        ProxySpec::new(&[
            "--authentication-token-webhook",
            &format!("--authorization-config={config}"),
        ])
        .apiserver(&api)
        .start()
    };

    // Deny: the condition is not evaluated for dave, the error stops the chain before the
    // AlwaysAllow after it (the kubelet's 500) and no review is sent.
    let dir = TempDir::new("match-conditions-cost-deny");
    let h = start(&dir, "Deny", "strict").await;
    let reply = h.bearer_get("/pods", "many-groups").await;
    assert_authorization_error(&reply, "dave", "get", "pods");
    assert_eq!(api.access_reviews(), Vec::<Value>::new());
    assert_eq!(h.metric(ERRORS, &[("name", "strict")]).await, 1.0);
    // A user with few groups costs little: the condition is true and the webhook allows.
    let reply = h.bearer_get("/pods", "few-groups").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(api.access_reviews().len(), 1);
    assert_eq!(api.access_reviews()[0]["user"], "erin");

    // NoOpinion: the error is set aside and the AlwaysAllow after it decides.
    let dir = TempDir::new("match-conditions-cost-no-opinion");
    let h = start(&dir, "NoOpinion", "lenient").await;
    let reply = h.bearer_get("/pods", "many-groups").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(api.access_reviews().len(), 1, "no review for dave");
    assert_eq!(h.metric(ERRORS, &[("name", "lenient")]).await, 1.0);

    // `explain` names the cost and the limit.
    let mut args = vec![
        "explain".to_owned(),
        format!(
            "--authorization-config={}",
            authorization_config(&dir, &webhook(&api, "strict", "Deny", &[DENY_LIST]))
        ),
        format!("--node-name={NODE_NAME}"),
        "--user=dave".to_owned(),
        "--output=json".to_owned(),
    ];
    args.extend(many_groups().iter().map(|g| format!("--group={g}")));
    args.extend(["GET".to_owned(), "/pods".to_owned()]);
    let done = run(&dir, "explain-cost", &args).await;
    let e: Value = serde_json::from_str(&done.stdout).unwrap_or_else(|_| panic!("{}", done.stderr));
    let conditions = &e["attributes"][0]["answers"][0]["matchConditions"];
    assert_eq!(
        conditions,
        &json!([{"expression": DENY_LIST, "result": "error", "error": OVER_THE_LIMIT}]),
    );
}

#[tokio::test]
async fn explain_shows_each_condition_and_whether_the_webhook_was_called() {
    let api = ApiServer::start_allowing().await;
    let dir = TempDir::new("match-conditions-explain");
    let config = authorization_config(
        &dir,
        &webhook(&api, "apiserver", "Deny", &[NOT_NODES, ONLY_NODES_PROXY]),
    );
    let done = run(
        &dir,
        "explain",
        &[
            "explain".to_owned(),
            format!("--authorization-config={config}"),
            format!("--node-name={NODE_NAME}"),
            "--user=alice".to_owned(),
            "--output=json".to_owned(),
            "GET".to_owned(),
            "/pods".to_owned(),
        ],
    )
    .await;
    done.assert_code(0);
    let e: Value = serde_json::from_str(&done.stdout).unwrap();
    let condition = |result: &str| json!({"expression": ONLY_NODES_PROXY, "result": result});
    let pods = &e["attributes"][0]["answers"][0];
    assert_eq!(pods["answer"], "NoOpinion");
    assert_eq!(
        pods["matchConditions"],
        json!([{"expression": NOT_NODES, "result": "true"}, condition("false")])
    );
    assert_eq!(pods["webhook"], "skipped");
    let proxy = &e["attributes"][1]["answers"][0];
    assert_eq!(proxy["answer"], "Allow");
    assert_eq!(
        proxy["matchConditions"],
        json!([{"expression": NOT_NODES, "result": "true"}, condition("true")])
    );
    assert_eq!(proxy["webhook"], "called");
    // Only the proxy attribute set was reviewed.
    let reviewed: Vec<Value> = api
        .access_reviews()
        .iter()
        .map(|spec| spec["resourceAttributes"]["subresource"].clone())
        .collect();
    assert_eq!(reviewed, [json!("proxy")]);

    // The same in text, for a node: both conditions shown, the second not evaluated.
    let done = run(
        &dir,
        "explain-text",
        &[
            "explain".to_owned(),
            format!("--authorization-config={config}"),
            format!("--node-name={NODE_NAME}"),
            "--user=system:node:node-b".to_owned(),
            "--group=system:nodes".to_owned(),
            "GET".to_owned(),
            "/healthz".to_owned(),
        ],
    )
    .await;
    done.assert_code(1);
    for line in [
        format!("      condition false         {NOT_NODES}\n"),
        format!("      condition not evaluated {ONLY_NODES_PROXY}\n"),
        "      webhook skipped: a condition is false (no opinion)\n".to_owned(),
    ] {
        assert!(
            done.stdout.contains(&line),
            "{line:?} not in:\n{}",
            done.stdout
        );
    }
    assert_eq!(api.access_reviews().len(), 1);
}

/// The AuthorizationConfiguration example of docs/OPERATIONS.md, reviewing with the stand-in in
/// place of its kubeconfig, serves as documented: a caller is reviewed about nodes/proxy only.
#[tokio::test]
async fn the_documented_example_reviews_only_nodes_proxy() {
    let doc = read(&file("docs/OPERATIONS.md"));
    let start = doc
        .find("apiVersion: apiserver.config.k8s.io/v1\nkind: AuthorizationConfiguration\n")
        .expect("OPERATIONS.md has an AuthorizationConfiguration example");
    let block = &doc[start..];
    let example = &block[..block.find("```").unwrap()];
    let api = ApiServer::start_allowing().await;
    let kubeconfig = api.kubeconfig(Flavour::ClientCertificate);
    let example = example.replace(
        "/etc/kubelet-auth-proxy/kubeconfig",
        &kubeconfig.display().to_string(),
    );
    assert!(example.contains("matchConditions:"), "{example}");
    let dir = TempDir::new("match-conditions-documented");
    let config = dir.write("authorization.yaml", example);
    let h = ProxySpec::new(&[&format!("--authorization-config={}", config.display())])
        .start()
        .await;

    assert_reviewed(&h, &api, ("alice", &[]), "/pods", "proxy", 1).await;
    // Node identities are never reviewed: another node's is denied by Node, this node's own is
    // skipped by the webhook and, with nothing else in the chain, refused.
    for node in [
        format!("system:node:{NODE_NAME}"),
        "system:node:node-b".to_owned(),
    ] {
        let reply = h.user(&node, &["system:nodes"]).get("/pods").await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.text());
    }
    assert_eq!(api.access_reviews().len(), 1);
}

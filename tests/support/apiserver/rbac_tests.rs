//! The stand-in API server's RBAC side, driven by the client library the proxy uses: lists and
//! their pages, kube-runtime's watcher through its initial list, changes, cut watches, compaction
//! and bookmarks, streaming lists; and, read raw, what kube hides (error events, bookmarks, the
//! end of a watch at its timeout).

use std::pin::Pin;

use futures::{Stream, StreamExt};
use http::StatusCode;
use http_body_util::BodyExt;
use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;

use super::*;
use crate::support::client::{Client, Identity, empty, request};
use crate::support::real_apiserver::client_of;

const CLUSTER_ROLES: &str = "/apis/rbac.authorization.k8s.io/v1/clusterroles";

type Events<K> = Pin<Box<dyn Stream<Item = Result<Event<K>, watcher::Error>> + Send>>;

async fn kube_client(api: &ApiServer) -> kube::Client {
    client_of(&api.kubeconfig(Flavour::ClientCertificate)).await
}

fn proxy_client(api: &ApiServer) -> Client {
    Client::new(
        api.ca().cert(),
        api.addr(),
        Identity::of(&api.ca().issue(&CertSpec::client(PROXY_IDENTITY))),
    )
}

fn cluster_role(name: &str, verbs: &[&str]) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": verbs}],
    })
}

fn role(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": [{"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}],
    })
}

/// A watcher over every ClusterRole, as the RBAC authorizer starts one.
fn watch_cluster_roles(client: kube::Client, config: watcher::Config) -> Events<ClusterRole> {
    kube::runtime::watcher(Api::<ClusterRole>::all(client), config).boxed()
}

/// The ClusterRoles `names` (each granting `get`), then a watcher over them with kube's default
/// configuration, past its initial list (which must name them in order, without an error) and
/// watching: what each watch scenario starts from.
async fn watching(api: &ApiServer, names: &[&str]) -> Events<ClusterRole> {
    for name in names {
        api.apply_rbac(cluster_role(name, &["get"]));
    }
    let mut events = watch_cluster_roles(
        kube_client(api).await,
        watcher::Config::default().any_semantic(),
    );
    let listed = names.iter().map(|name| format!("InitApply {name}"));
    let expected: Vec<String> = std::iter::once("Init".to_owned())
        .chain(listed)
        .chain(["InitDone".to_owned()])
        .collect();
    for expected in expected {
        assert_eq!(describe(&next(&mut events).await.unwrap()), expected);
    }
    until_watching(&mut events, api, RbacKind::ClusterRole, 1).await;
    events
}

async fn next<K>(events: &mut Events<K>) -> Result<Event<K>, watcher::Error> {
    within("the next watcher event", events.next())
        .await
        .expect("a watcher never ends")
}

/// Polls the watcher (it sends its watch only when polled) until the stand-in has its `n`th
/// watch of `kind`, open: changes made after this reach it. The watcher must say nothing
/// meanwhile.
async fn until_watching<K: kube::Resource>(
    events: &mut Events<K>,
    api: &ApiServer,
    kind: RbacKind,
    n: usize,
) {
    tokio::select! {
        event = next(events) => panic!("unexpected {:?}", event.map(|e| describe(&e))),
        () = api.wait_for_rbac_watches(kind, n) => {}
    }
}

/// The next event, named, past the errors of watches cut or refused on the way.
async fn next_event<K: kube::Resource>(events: &mut Events<K>) -> String {
    within("the next watcher event past errors", async {
        loop {
            if let Ok(event) = next(events).await {
                return describe(&event);
            }
        }
    })
    .await
}

fn describe<K: kube::Resource>(event: &Event<K>) -> String {
    match event {
        Event::Init => "Init".to_owned(),
        Event::InitApply(object) => format!("InitApply {}", object.name_any()),
        Event::InitDone => "InitDone".to_owned(),
        Event::Apply(object) => format!("Apply {}", object.name_any()),
        Event::Delete(object) => format!("Delete {}", object.name_any()),
    }
}

/// Reads a raw watch response line by line until it ends (cleanly or not).
async fn watch_lines(client: &Client, target: &str) -> (StatusCode, Vec<Value>) {
    let response = client
        .open(request("GET", target).body(empty()).unwrap())
        .await;
    let status = response.status();
    assert_eq!(
        response.headers().get("content-type").map(|v| v.as_bytes()),
        Some(&b"application/json"[..])
    );
    let mut body = response.into_body();
    let mut text = Vec::new();
    while let Some(Ok(frame)) = within("the next watch frame", body.frame()).await {
        if let Ok(data) = frame.into_data() {
            text.extend_from_slice(&data);
        }
    }
    assert!(text.is_empty() || text.ends_with(b"\n"), "events end lines");
    let lines = text
        .split(|b| *b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| serde_json::from_slice(line).unwrap())
        .collect();
    (status, lines)
}

#[tokio::test]
async fn lists_page_at_one_version_as_the_real_server_does() {
    let api = ApiServer::start().await;
    for name in ["a", "b", "c"] {
        api.apply_rbac(cluster_role(name, &["get"]));
    }
    let c = proxy_client(&api);
    let first = c.get(&format!("{CLUSTER_ROLES}?limit=2")).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    let first: Value = serde_json::from_slice(&first.body).unwrap();
    assert_eq!(first["apiVersion"], "rbac.authorization.k8s.io/v1");
    assert_eq!(first["kind"], "ClusterRoleList");
    assert_eq!(first["metadata"]["resourceVersion"], "4");
    assert_eq!(first["metadata"]["remainingItemCount"], json!(1));
    let items = first["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["metadata"]["name"], "a");
    assert_eq!(items[0]["metadata"]["resourceVersion"], "2");
    assert_eq!(
        items[0].get("kind"),
        None,
        "lists leave out their items' kind"
    );
    assert_eq!(items[0]["rules"], cluster_role("a", &["get"])["rules"]);

    // The next page is read at the first page's version: later changes are not in it.
    api.apply_rbac(cluster_role("b", &["get", "list"]));
    api.apply_rbac(cluster_role("d", &["get"]));
    let token = first["metadata"]["continue"].as_str().unwrap();
    let second = c
        .get(&format!("{CLUSTER_ROLES}?limit=2&continue={token}"))
        .await;
    let second: Value = serde_json::from_slice(&second.body).unwrap();
    assert_eq!(second["metadata"]["resourceVersion"], "4");
    assert_eq!(second["metadata"].get("continue"), None);
    assert_eq!(second["items"][0]["metadata"]["name"], "c");
    assert_eq!(second["items"].as_array().unwrap().len(), 1);

    // Through kube, pages and all.
    let roles: Api<ClusterRole> = Api::all(kube_client(&api).await);
    let listed = within("kube list", roles.list(&ListParams::default().limit(3)))
        .await
        .unwrap();
    assert_eq!(listed.metadata.resource_version.as_deref(), Some("6"));
    assert_eq!(listed.items.len(), 3);
    assert_eq!(
        listed.items[1].rules.as_ref().unwrap()[0].verbs,
        ["get", "list"]
    );

    // After a compaction, a continue token from before it has expired.
    api.compact_rbac_history();
    let expired = c
        .get(&format!("{CLUSTER_ROLES}?limit=2&continue={token}"))
        .await;
    assert_eq!(expired.status, StatusCode::GONE);
    let expired: Value = serde_json::from_slice(&expired.body).unwrap();
    assert_eq!(expired["reason"], "Expired");
    assert_eq!(expired["code"], json!(410));

    // An update that changes nothing is no change.
    assert_eq!(api.apply_rbac(cluster_role("d", &["get"])), "6");
    let requests: Vec<RbacRequest> = api.rbac_requests();
    assert_eq!(requests.len(), 4);
    assert_eq!(requests[0].verb, RbacVerb::List);
    assert_eq!(requests[0].kind, RbacKind::ClusterRole);
    assert!(requests[1].continued);
    assert_eq!(
        requests[2].caller,
        Some(Caller::Certificate(PROXY_IDENTITY.to_owned()))
    );
    assert_eq!(api.rbac_lists(RbacKind::ClusterRole), 2);
}

#[tokio::test]
async fn roles_list_across_namespaces_or_in_one() {
    let api = ApiServer::start().await;
    api.apply_rbac(role("ns-b", "reader"));
    api.apply_rbac(role("ns-a", "reader"));
    api.apply_rbac(role("ns-a", "writer"));
    let client = kube_client(&api).await;
    let all = within(
        "listing roles",
        Api::<Role>::all(client.clone()).list(&ListParams::default()),
    )
    .await
    .unwrap();
    let names: Vec<_> = all
        .items
        .iter()
        .map(|r| format!("{}/{}", r.namespace().unwrap(), r.name_any()))
        .collect();
    assert_eq!(names, ["ns-a/reader", "ns-a/writer", "ns-b/reader"]);
    let one = within(
        "listing one namespace's roles",
        Api::<Role>::namespaced(client.clone(), "ns-b").list(&ListParams::default()),
    )
    .await
    .unwrap();
    assert_eq!(one.items.len(), 1);

    // Watched across namespaces, as the RBAC authorizer watches them.
    let mut events: Events<Role> = kube::runtime::watcher(
        Api::<Role>::all(client),
        watcher::Config::default().any_semantic(),
    )
    .boxed();
    for expected in [
        "Init",
        "InitApply reader",
        "InitApply writer",
        "InitApply reader",
        "InitDone",
    ] {
        assert_eq!(next_event(&mut events).await, expected);
    }
    until_watching(&mut events, &api, RbacKind::Role, 1).await;
    api.delete_rbac(RbacKind::Role, "ns-b", "reader");
    match next(&mut events).await.unwrap() {
        Event::Delete(deleted) => {
            assert_eq!(deleted.namespace().as_deref(), Some("ns-b"));
            assert_eq!(deleted.resource_version().as_deref(), Some("5"));
        }
        other => panic!("expected Delete reader, got {}", describe(&other)),
    }
    // In one namespace, only its changes.
    api.apply_rbac(role("ns-b", "auditor"));
    api.apply_rbac(role("ns-a", "auditor"));
    let (_, lines) = watch_lines(
        &proxy_client(&api),
        "/apis/rbac.authorization.k8s.io/v1/namespaces/ns-a/roles?watch=true&resourceVersion=5&timeoutSeconds=1",
    )
    .await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["object"]["metadata"]["namespace"], "ns-a");
    assert_eq!(api.rbac_lists(RbacKind::Role), 3);
    assert_eq!(api.rbac_lists(RbacKind::RoleBinding), 0);
}

#[tokio::test]
async fn refusals_unauthenticated_unavailable_and_slow_lists() {
    let api = ApiServer::start().await;
    let anonymous = Client::new(api.ca().cert(), api.addr(), Identity::None);
    let refused = anonymous.get(CLUSTER_ROLES).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    let token = api.caller_token().to_owned();
    let by_token = anonymous.get_with_token(CLUSTER_ROLES, &token).await;
    assert_eq!(by_token.status, StatusCode::OK);
    let c = proxy_client(&api);
    let posted = c
        .send(request("POST", CLUSTER_ROLES).body(empty()).unwrap())
        .await;
    assert_eq!(posted.status, StatusCode::METHOD_NOT_ALLOWED);

    api.set_rbac_available(false);
    for target in [
        CLUSTER_ROLES.to_owned(),
        format!("{CLUSTER_ROLES}?watch=true&resourceVersion=1"),
    ] {
        let unavailable = c.get(&target).await;
        assert_eq!(unavailable.status, StatusCode::SERVICE_UNAVAILABLE);
        let status: Value = serde_json::from_slice(&unavailable.body).unwrap();
        assert_eq!(status["reason"], "ServiceUnavailable");
    }
    api.set_rbac_available(true);

    // A slow list is read when it is answered: a change made meanwhile is in it.
    api.set_rbac_list_delay(Duration::from_secs(1));
    let roles: Api<ClusterRole> = Api::all(kube_client(&api).await);
    let slow = tokio::spawn(async move { roles.list(&ListParams::default()).await });
    crate::support::eventually("the slow list arrives", || async {
        (api.rbac_lists(RbacKind::ClusterRole) == 4).then_some(())
    })
    .await;
    api.apply_rbac(cluster_role("late", &["get"]));
    let listed = within("the slow list", slow).await.unwrap().unwrap();
    assert_eq!(listed.items.len(), 1);
    let callers: Vec<_> = api.rbac_requests().into_iter().map(|r| r.caller).collect();
    assert_eq!(callers[..2], [None, Some(Caller::Token)]);
}

#[tokio::test]
async fn the_watcher_lists_then_follows_changes() {
    let api = ApiServer::start().await;
    let mut events = watching(&api, &["a", "b"]).await;
    api.apply_rbac(role("ns-a", "unseen"));
    let changed = api.apply_rbac(cluster_role("a", &["get", "list"]));
    api.apply_rbac(cluster_role("c", &["get"]));
    api.delete_rbac(RbacKind::ClusterRole, "", "b");
    match next(&mut events).await.unwrap() {
        Event::Apply(applied) => {
            assert_eq!(applied.name_any(), "a");
            assert_eq!(applied.resource_version(), Some(changed));
            assert_eq!(applied.rules.unwrap()[0].verbs, ["get", "list"]);
        }
        other => panic!("expected Apply a, got {}", describe(&other)),
    }
    assert_eq!(next_event(&mut events).await, "Apply c");
    assert_eq!(next_event(&mut events).await, "Delete b");
    assert_eq!(api.rbac_lists(RbacKind::ClusterRole), 1);
    assert_eq!(api.rbac_watches(RbacKind::ClusterRole), ["3"]);
}

#[tokio::test]
async fn a_cut_watch_resumes_from_its_last_version_without_a_relist() {
    let api = ApiServer::start().await;
    let mut events = watching(&api, &["a"]).await;
    let last = api.apply_rbac(cluster_role("b", &["get"]));
    assert_eq!(next_event(&mut events).await, "Apply b");
    api.drop_rbac_watches();
    // Made while the watcher is away: the resumed watch replays it.
    api.apply_rbac(cluster_role("c", &["get"]));
    assert_eq!(next_event(&mut events).await, "Apply c");
    assert_eq!(
        api.rbac_watches(RbacKind::ClusterRole),
        ["2", last.as_str()]
    );
    assert_eq!(api.rbac_lists(RbacKind::ClusterRole), 1);
}

#[tokio::test]
async fn compaction_answers_410_and_the_watcher_relists_once() {
    let api = ApiServer::start().await;
    let mut events = watching(&api, &["a"]).await;
    api.drop_rbac_watches();
    let added = api.apply_rbac(cluster_role("b", &["get"]));
    api.compact_rbac_history();

    // The resumed watch from "2" is told its version is gone, as an event.
    let (status, lines) = watch_lines(
        &proxy_client(&api),
        &format!("{CLUSTER_ROLES}?watch=true&resourceVersion=2&allowWatchBookmarks=true"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        lines,
        [json!({
            "type": "ERROR",
            "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "too old resource version: 2 (3)", "reason": "Expired", "code": 410,
            },
        })]
    );

    let mut gone = false;
    loop {
        match next(&mut events).await {
            Err(watcher::Error::WatchError(status)) if status.code == 410 => gone = true,
            Err(_) => {}
            Ok(Event::Init) => break,
            Ok(other) => panic!("expected a relist, got {}", describe(&other)),
        }
    }
    assert!(gone, "the watcher saw the 410");
    for expected in ["InitApply a", "InitApply b", "InitDone"] {
        assert_eq!(next_event(&mut events).await, expected);
    }
    until_watching(&mut events, &api, RbacKind::ClusterRole, 4).await;
    assert_eq!(api.rbac_lists(RbacKind::ClusterRole), 2);
    assert_eq!(
        api.rbac_watches(RbacKind::ClusterRole),
        ["2", "2", "2", added.as_str()]
    );
}

#[tokio::test]
async fn bookmarks_advance_the_version_a_watch_resumes_from() {
    let api = ApiServer::start().await;
    let mut events = watching(&api, &[]).await;
    // Changes to other kinds move the version on; only a bookmark tells the watcher.
    let moved = api.apply_rbac(role("ns-a", "reader"));
    api.rbac_bookmark();
    api.drop_rbac_watches();
    api.apply_rbac(cluster_role("a", &["get"]));
    assert_eq!(next_event(&mut events).await, "Apply a");
    assert_eq!(
        api.rbac_watches(RbacKind::ClusterRole),
        ["1", moved.as_str()]
    );
    assert_eq!(api.rbac_lists(RbacKind::ClusterRole), 1);
}

#[tokio::test]
async fn watches_end_at_their_timeout_after_a_last_bookmark() {
    let api = ApiServer::start().await;
    api.apply_rbac(cluster_role("a", &["get"]));
    let c = proxy_client(&api);
    let (status, lines) = watch_lines(
        &c,
        &format!(
            "{CLUSTER_ROLES}?watch=true&resourceVersion=1&allowWatchBookmarks=true&timeoutSeconds=1"
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["type"], "ADDED");
    assert_eq!(lines[0]["object"]["kind"], "ClusterRole");
    assert_eq!(
        lines[0]["object"]["apiVersion"],
        "rbac.authorization.k8s.io/v1"
    );
    assert_eq!(lines[0]["object"]["metadata"]["resourceVersion"], "2");
    assert_eq!(
        lines[1],
        json!({
            "type": "BOOKMARK",
            "object": {
                "kind": "ClusterRole", "apiVersion": "rbac.authorization.k8s.io/v1",
                "metadata": {"resourceVersion": "2"},
            },
        })
    );
    // Without allowWatchBookmarks, no bookmark.
    let (_, lines) = watch_lines(
        &c,
        &format!("{CLUSTER_ROLES}?watch=true&resourceVersion=2&timeoutSeconds=1"),
    )
    .await;
    assert!(lines.is_empty(), "{lines:?}");
    // A streaming list needs bookmarks.
    let invalid = c
        .get(&format!(
            "{CLUSTER_ROLES}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
        ))
        .await;
    assert_eq!(invalid.status, StatusCode::UNPROCESSABLE_ENTITY);
}

/// A cut watch ends in an error, not a clean end of the stream, over either HTTP version: the
/// events sent before the cut arrive first.
#[tokio::test]
async fn cut_watches_end_in_an_error() {
    let api = ApiServer::start().await;
    api.apply_rbac(cluster_role("a", &["get"]));
    let identity = || Identity::of(&api.ca().issue(&CertSpec::client(PROXY_IDENTITY)));
    let clients = [
        Client::new(api.ca().cert(), api.addr(), identity()),
        Client::http1(api.ca().cert(), api.addr(), identity()),
    ];
    for c in clients {
        let target = format!("{CLUSTER_ROLES}?watch=true&resourceVersion=1");
        let response = c.open(request("GET", &target).body(empty()).unwrap()).await;
        assert_eq!(response.status(), StatusCode::OK);
        api.drop_rbac_watches();
        let mut body = response.into_body();
        let mut received = Vec::new();
        let ending = loop {
            match within("the next frame of a cut watch", body.frame()).await {
                Some(Ok(frame)) => received.extend_from_slice(&frame.into_data().unwrap()),
                other => break other,
            }
        };
        assert!(matches!(ending, Some(Err(_))), "{ending:?}");
        let event: Value = serde_json::from_slice(&received).unwrap();
        assert_eq!(event["type"], "ADDED");
    }
}

#[tokio::test]
async fn streaming_lists_send_the_state_then_a_closing_bookmark() {
    let api = ApiServer::start().await;
    api.apply_rbac(cluster_role("a", &["get"]));
    api.apply_rbac(cluster_role("b", &["get"]));
    let mut events = watch_cluster_roles(
        kube_client(&api).await,
        watcher::Config::default().streaming_lists(),
    );
    for expected in ["Init", "InitApply a", "InitApply b", "InitDone"] {
        assert_eq!(next_event(&mut events).await, expected);
    }
    api.apply_rbac(cluster_role("c", &["get"]));
    assert_eq!(next_event(&mut events).await, "Apply c");
    assert_eq!(api.rbac_lists(RbacKind::ClusterRole), 0);
    assert_eq!(api.rbac_watches(RbacKind::ClusterRole), ["0"]);
}

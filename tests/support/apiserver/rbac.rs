//! RBAC objects in the stand-in API server, for the RBAC authorizer's watches: ClusterRoles,
//! ClusterRoleBindings, Roles and RoleBindings kept as etcd keeps them (one global
//! resourceVersion, a history of changes), listed and watched as kube-apiserver answers
//! (`limit`/`continue` paging, newline-delimited watch events, bookmarks, `410 Expired` after a
//! compaction, streaming lists), and the faults those watches must survive: dropped connections,
//! compacted history, slow lists, endpoints that answer 503.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};

use super::serve::{ResponseBody, json_response, status_json};
use super::{ApiServer, Caller, Shared};

/// The group and version every RBAC path and object carries.
const API_VERSION: &str = "rbac.authorization.k8s.io/v1";
/// Where RBAC paths start.
const API_PREFIX: &str = "/apis/rbac.authorization.k8s.io/v1/";
/// A watch without `timeoutSeconds` lasts as long as the real server's shortest
/// (`--min-request-timeout`, 1800 s).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// The real watch cache sends its last bookmark this long before a watch times out, so the
/// client resumes from a recent version.
const BOOKMARK_BEFORE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a cut watch waits before it errors, so the events sent before the cut leave first.
const CUT_AFTER: Duration = Duration::from_millis(20);
/// The annotation on the bookmark that ends a streaming list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// The four kinds of RBAC object the stand-in serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RbacKind {
    /// `clusterroles`.
    ClusterRole,
    /// `clusterrolebindings`.
    ClusterRoleBinding,
    /// `roles`, namespaced.
    Role,
    /// `rolebindings`, namespaced.
    RoleBinding,
}

impl RbacKind {
    const ALL: [RbacKind; 4] = [
        RbacKind::ClusterRole,
        RbacKind::ClusterRoleBinding,
        RbacKind::Role,
        RbacKind::RoleBinding,
    ];

    fn kind(self) -> &'static str {
        match self {
            RbacKind::ClusterRole => "ClusterRole",
            RbacKind::ClusterRoleBinding => "ClusterRoleBinding",
            RbacKind::Role => "Role",
            RbacKind::RoleBinding => "RoleBinding",
        }
    }

    fn resource(self) -> &'static str {
        match self {
            RbacKind::ClusterRole => "clusterroles",
            RbacKind::ClusterRoleBinding => "clusterrolebindings",
            RbacKind::Role => "roles",
            RbacKind::RoleBinding => "rolebindings",
        }
    }

    fn namespaced(self) -> bool {
        matches!(self, RbacKind::Role | RbacKind::RoleBinding)
    }

    fn from_kind(kind: &str) -> Option<RbacKind> {
        RbacKind::ALL.into_iter().find(|k| k.kind() == kind)
    }

    fn from_resource(resource: &str) -> Option<RbacKind> {
        RbacKind::ALL.into_iter().find(|k| k.resource() == resource)
    }
}

/// What an RBAC request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RbacVerb {
    /// A list (one page of it).
    List,
    /// A watch (`watch=true`).
    Watch,
}

/// One RBAC request, recorded on arrival whatever it was answered with, so a test can tell a
/// resumed watch from a relist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbacRequest {
    /// The kind listed or watched.
    pub kind: RbacKind,
    /// List or watch.
    pub verb: RbacVerb,
    /// The `resourceVersion` asked for ("" when none was given): where a watch resumes from.
    pub resource_version: String,
    /// A later page of a list (it carried a `continue` token).
    pub continued: bool,
    /// Who asked (`None`: unauthenticated, answered 401).
    pub caller: Option<Caller>,
}

/// Why a watch stream ended early: the test cut it, as a network failure or an API server
/// restart does. Ends the response body with an error, so the connection is torn down.
#[derive(Debug, thiserror::Error)]
#[error("the stand-in cut the watch")]
pub(super) struct Cut;

/// What the store hands an open watch.
enum Delivery {
    /// One newline-terminated event.
    Line(Bytes),
    /// The normal end of the stream (after an `ERROR` event).
    End,
    /// The abrupt end of the stream.
    Cut,
}

/// The event types of a watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    fn name(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as etcd's history keeps it.
struct Change {
    revision: u64,
    kind: RbacKind,
    key: String,
    event: EventType,
    /// The object as of this change, `metadata.resourceVersion` included.
    object: Value,
}

/// An open watch.
struct Watch {
    kind: RbacKind,
    /// Only this namespace's objects (a `/namespaces/{ns}/...` watch).
    namespace: Option<String>,
    /// It asked for bookmarks (`allowWatchBookmarks=true`).
    bookmarks: bool,
    deliveries: mpsc::UnboundedSender<Delivery>,
}

impl Watch {
    fn sees(&self, kind: RbacKind, key: &str) -> bool {
        self.kind == kind && in_namespace(key, self.namespace.as_deref())
    }
}

/// The RBAC objects, their history, the open watches and the record of requests.
pub(super) struct Store {
    /// The last resourceVersion given out, shared by every kind as etcd's revision is.
    revision: u64,
    /// The current objects (with `apiVersion` and `kind`) by kind and etcd key
    /// (`<name>` or `<namespace>/<name>`), in etcd's key order.
    objects: BTreeMap<(RbacKind, String), Value>,
    /// Every change ever made, oldest first.
    history: Vec<Change>,
    /// Versions older than this one are compacted away: watching or continuing from them is
    /// answered `410 Expired`.
    compacted: u64,
    watches: Vec<Watch>,
    /// Every list and watch, in order of arrival.
    pub(super) requests: Vec<RbacRequest>,
    list_delay: Duration,
    available: bool,
}

impl Default for Store {
    fn default() -> Store {
        Store {
            // An empty etcd is at revision 1.
            revision: 1,
            objects: BTreeMap::new(),
            history: Vec::new(),
            compacted: 0,
            watches: Vec::new(),
            requests: Vec::new(),
            list_delay: Duration::ZERO,
            available: true,
        }
    }
}

impl Store {
    /// Records a change and hands it to every open watch that sees it.
    fn commit(&mut self, kind: RbacKind, key: String, event: EventType, object: Value) {
        let line = event_line(event, &object);
        self.watches.retain(|w| !w.deliveries.is_closed());
        for watch in self.watches.iter().filter(|w| w.sees(kind, &key)) {
            let _ = watch.deliveries.send(Delivery::Line(line.clone()));
        }
        self.history.push(Change {
            revision: self.revision,
            kind,
            key,
            event,
            object,
        });
    }

    /// The objects of `kind` as they were at `revision`, in key order.
    fn snapshot(&self, kind: RbacKind, revision: u64) -> BTreeMap<String, Value> {
        if revision >= self.revision {
            return self
                .objects
                .range((kind, String::new())..)
                .take_while(|((k, _), _)| *k == kind)
                .map(|((_, key), object)| (key.clone(), object.clone()))
                .collect();
        }
        let mut objects = BTreeMap::new();
        for change in self
            .history
            .iter()
            .take_while(|c| c.revision <= revision)
            .filter(|c| c.kind == kind)
        {
            match change.event {
                EventType::Deleted => objects.remove(&change.key),
                _ => objects.insert(change.key.clone(), change.object.clone()),
            };
        }
        objects
    }

    fn bookmark_line(&self, kind: RbacKind, initial_events_end: bool) -> Bytes {
        let mut metadata = json!({"resourceVersion": self.revision.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({INITIAL_EVENTS_END: "true"});
        }
        line(&json!({
            "type": "BOOKMARK",
            "object": {"kind": kind.kind(), "apiVersion": API_VERSION, "metadata": metadata},
        }))
    }
}

/// Whether the object at etcd key `key` is in `namespace` (any namespace when `None`).
fn in_namespace(key: &str, namespace: Option<&str>) -> bool {
    namespace.is_none_or(|ns| key.split_once('/').is_some_and(|(n, _)| n == ns))
}

fn line(value: &Value) -> Bytes {
    // Serializing a `Value` cannot fail: its keys are strings.
    let mut bytes = serde_json::to_vec(value).expect("a JSON value serializes");
    bytes.push(b'\n');
    Bytes::from(bytes)
}

fn event_line(event: EventType, object: &Value) -> Bytes {
    line(&json!({"type": event.name(), "object": object}))
}

/// An RBAC path: the kind, and the namespace of a namespaced path.
pub(super) struct Route {
    kind: RbacKind,
    namespace: Option<String>,
}

/// The RBAC collection `path` names, if it names one: `/apis/rbac.authorization.k8s.io/v1/
/// {resource}` for every kind, `.../namespaces/{ns}/{resource}` for Roles and RoleBindings.
pub(super) fn route(path: &str) -> Option<Route> {
    let rest = path.strip_prefix(API_PREFIX)?;
    let segments: Vec<&str> = rest.split('/').collect();
    match segments.as_slice() {
        [resource] => Some(Route {
            kind: RbacKind::from_resource(resource)?,
            namespace: None,
        }),
        ["namespaces", namespace, resource] if !namespace.is_empty() => {
            let kind = RbacKind::from_resource(resource)?;
            kind.namespaced().then(|| Route {
                kind,
                namespace: Some((*namespace).to_owned()),
            })
        }
        _ => None,
    }
}

/// The query parameters the stand-in reads. Their values are taken as they come: every value
/// it reads (numbers, booleans, URL-safe continue tokens) is URL-safe.
fn query(uri: &http::Uri) -> BTreeMap<&str, &str> {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .filter(|(name, _)| !name.is_empty())
        .collect()
}

fn bad_request(message: &str) -> (StatusCode, Value) {
    status_json(StatusCode::BAD_REQUEST, "BadRequest", message, None)
}

fn expired(message: &str) -> (StatusCode, Value) {
    status_json(StatusCode::GONE, "Expired", message, None)
}

/// Answers an RBAC list or watch from `caller`, authenticated as the reviews are.
pub(super) async fn serve(
    uri: &http::Uri,
    route: Route,
    caller: Option<Caller>,
    shared: &Arc<Shared>,
) -> Response<ResponseBody> {
    let params = query(uri);
    let watch = params
        .get("watch")
        .is_some_and(|w| *w == "true" || *w == "1");
    let authenticated = caller.is_some();
    let (available, list_delay) = {
        let mut state = shared.lock();
        state.rbac.requests.push(RbacRequest {
            kind: route.kind,
            verb: if watch {
                RbacVerb::Watch
            } else {
                RbacVerb::List
            },
            resource_version: params
                .get("resourceVersion")
                .copied()
                .unwrap_or_default()
                .to_owned(),
            continued: params.contains_key("continue"),
            caller,
        });
        (state.rbac.available, state.rbac.list_delay)
    };
    let answer = if !authenticated {
        Err(status_json(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "Unauthorized",
            None,
        ))
    } else if !available {
        Err(status_json(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
            None,
        ))
    } else if watch {
        start_watch(&params, &route, shared)
    } else {
        tokio::time::sleep(list_delay).await;
        list(&params, &route, shared).map(|list| json_response(StatusCode::OK, &list))
    };
    answer.unwrap_or_else(|(code, status)| json_response(code, &status))
}

/// A continue token as the real server writes it: where the next page starts, and the version
/// the whole list is read at.
fn continue_token(revision: u64, start: &str) -> String {
    let token = json!({"v": "meta.k8s.io/v1", "rv": revision, "start": start});
    URL_SAFE_NO_PAD.encode(token.to_string())
}

fn parse_continue(token: &str) -> Option<(u64, String)> {
    let bytes = URL_SAFE_NO_PAD.decode(token).ok()?;
    let token: Value = serde_json::from_slice(&bytes).ok()?;
    (token["v"] == "meta.k8s.io/v1").then_some(())?;
    Some((token["rv"].as_u64()?, token["start"].as_str()?.to_owned()))
}

/// One page of a list, read at the current version or the one a `continue` token or
/// `resourceVersionMatch=Exact` names.
fn list(
    params: &BTreeMap<&str, &str>,
    route: &Route,
    shared: &Shared,
) -> Result<Value, (StatusCode, Value)> {
    let limit = match params.get("limit") {
        None => 0,
        Some(limit) => limit
            .parse::<usize>()
            .map_err(|_| bad_request(&format!("limit: Invalid value: \"{limit}\"")))?,
    };
    let resource_version = params.get("resourceVersion").copied().unwrap_or_default();
    let state = shared.lock();
    let store = &state.rbac;
    let (revision, start) = match params.get("continue") {
        Some(token) => {
            if !resource_version.is_empty() {
                return Err(bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            let (revision, start) = parse_continue(token)
                .ok_or_else(|| bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"))?;
            if revision < store.compacted {
                return Err(expired(
                    "The provided continue parameter is too old to display a consistent list \
                     result. You can start a new list without the continue parameter, or use \
                     the continue token in this response to retrieve the remainder of the \
                     results. Continuing with the provided token results in an inconsistent \
                     list - objects that were created, modified, or deleted between the time \
                     the first chunk was returned and now may show up in the list.",
                ));
            }
            (revision, start)
        }
        None if params.get("resourceVersionMatch") == Some(&"Exact") => {
            let revision = resource_version.parse::<u64>().map_err(|_| {
                bad_request(&format!(
                    "resourceVersion: Invalid value: \"{resource_version}\""
                ))
            })?;
            if revision < store.compacted {
                return Err(expired(
                    "The resourceVersion for the provided list is too old.",
                ));
            }
            (revision.min(store.revision), String::new())
        }
        None => (store.revision, String::new()),
    };
    let mut matching = store
        .snapshot(route.kind, revision)
        .into_iter()
        .filter(|(key, _)| key.as_str() >= start.as_str())
        .filter(|(key, _)| in_namespace(key, route.namespace.as_deref()));
    let mut items = Vec::new();
    let mut last_key = String::new();
    for (key, mut object) in matching.by_ref() {
        if let Some(fields) = object.as_object_mut() {
            // The real server leaves them out of a list's items.
            fields.remove("apiVersion");
            fields.remove("kind");
        }
        items.push(object);
        last_key = key;
        if items.len() == limit {
            break;
        }
    }
    let remaining = matching.count();
    let mut metadata = json!({"resourceVersion": revision.to_string()});
    if remaining > 0 {
        metadata["continue"] = json!(continue_token(revision, &format!("{last_key}\u{0}")));
        metadata["remainingItemCount"] = json!(remaining);
    }
    Ok(json!({
        "apiVersion": API_VERSION,
        "kind": format!("{}List", route.kind.kind()),
        "metadata": metadata,
        "items": items,
    }))
}

/// Opens a watch: the events it replays (or the initial state, or a `410 Expired` error event),
/// then the live ones, until `timeoutSeconds`.
fn start_watch(
    params: &BTreeMap<&str, &str>,
    route: &Route,
    shared: &Arc<Shared>,
) -> Result<Response<ResponseBody>, (StatusCode, Value)> {
    let flag = |name: &str| params.get(name).is_some_and(|v| *v == "true" || *v == "1");
    let bookmarks = flag("allowWatchBookmarks");
    let send_initial_events = flag("sendInitialEvents");
    let resource_version = params.get("resourceVersion").copied().unwrap_or_default();
    let timeout =
        match params.get("timeoutSeconds") {
            None => DEFAULT_WATCH_TIMEOUT,
            Some(seconds) => Duration::from_secs(seconds.parse().map_err(|_| {
                bad_request(&format!("timeoutSeconds: Invalid value: \"{seconds}\""))
            })?),
        };
    if send_initial_events {
        let problem = if params.get("resourceVersionMatch") != Some(&"NotOlderThan") {
            Some(
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            )
        } else if !bookmarks {
            Some(
                "allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
            )
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(status_json(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                &format!("ListOptions.meta.k8s.io \"\" is invalid: {problem}"),
                Some(json!({"group": "meta.k8s.io", "kind": "ListOptions"})),
            ));
        }
    }
    let since = match resource_version {
        "" | "0" => None,
        version => Some(version.parse::<u64>().map_err(|_| {
            bad_request(&format!(
                "resourceVersion: Invalid value: \"{version}\": must be a number"
            ))
        })?),
    };
    let (deliveries, receiver) = mpsc::unbounded_channel();
    let mut state = shared.lock();
    let store = &mut state.rbac;
    let namespace = route.namespace.as_deref();
    let mut open = true;
    match since {
        Some(since) if since < store.compacted && !send_initial_events => {
            open = false;
            let (_, status) = expired(&format!(
                "too old resource version: {since} ({})",
                store.compacted
            ));
            let _ = deliveries.send(Delivery::Line(line(
                &json!({"type": "ERROR", "object": status}),
            )));
            let _ = deliveries.send(Delivery::End);
        }
        Some(since) if !send_initial_events => {
            for change in store.history.iter().filter(|c| {
                c.revision > since && c.kind == route.kind && in_namespace(&c.key, namespace)
            }) {
                let _ = deliveries.send(Delivery::Line(event_line(change.event, &change.object)));
            }
        }
        _ => {
            // The current state as ADDED events: a watch from "any" version, or a streaming
            // list's initial events (ended by a bookmark).
            for (key, object) in store.snapshot(route.kind, store.revision) {
                if in_namespace(&key, namespace) {
                    let _ = deliveries.send(Delivery::Line(event_line(EventType::Added, &object)));
                }
            }
            if send_initial_events {
                let _ = deliveries.send(Delivery::Line(store.bookmark_line(route.kind, true)));
            }
        }
    }
    if open {
        store.watches.push(Watch {
            kind: route.kind,
            namespace: route.namespace.clone(),
            bookmarks,
            deliveries,
        });
    }
    drop(state);
    let deadline = Instant::now() + timeout;
    let body = WatchBody {
        deliveries: receiver,
        pending: VecDeque::new(),
        shared: shared.clone(),
        kind: route.kind,
        bookmark: bookmarks.then(|| {
            Box::pin(tokio::time::sleep_until(
                deadline
                    .checked_sub(BOOKMARK_BEFORE_TIMEOUT)
                    .unwrap_or_else(Instant::now),
            ))
        }),
        deadline: Box::pin(tokio::time::sleep_until(deadline)),
        cut: None,
        done: false,
    };
    let mut response = Response::new(body.boxed());
    response.headers_mut().insert(
        CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// A watch's response body: what the store delivers, the bookmark shortly before the timeout,
/// and the end of the stream at the timeout.
struct WatchBody {
    deliveries: mpsc::UnboundedReceiver<Delivery>,
    /// Deliveries taken from the channel ahead of the pre-timeout bookmark.
    pending: VecDeque<Delivery>,
    /// For the current version when the pre-timeout bookmark is due.
    shared: Arc<Shared>,
    kind: RbacKind,
    /// When the pre-timeout bookmark is due (`None`: not asked for, or sent).
    bookmark: Option<Pin<Box<Sleep>>>,
    deadline: Pin<Box<Sleep>>,
    /// When the cut the store delivered takes effect.
    cut: Option<Pin<Box<Sleep>>>,
    done: bool,
}

impl WatchBody {
    fn deliver(
        &mut self,
        delivery: Delivery,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Cut>>> {
        match delivery {
            Delivery::Line(line) => Poll::Ready(Some(Ok(Frame::data(line)))),
            Delivery::End => {
                self.done = true;
                Poll::Ready(None)
            }
            Delivery::Cut => {
                // hyper drops what it has not written yet when a body fails: let it write the
                // events sent before the cut, as a real connection would have.
                self.cut = Some(Box::pin(tokio::time::sleep(CUT_AFTER)));
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }
}

impl http_body::Body for WatchBody {
    type Data = Bytes;
    type Error = Cut;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Cut>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(cut) = this.cut.as_mut() {
            return match cut.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.done = true;
                    Poll::Ready(Some(Err(Cut)))
                }
                Poll::Pending => Poll::Pending,
            };
        }
        if let Some(delivery) = this.pending.pop_front() {
            return this.deliver(delivery, cx);
        }
        match this.deliveries.poll_recv(cx) {
            Poll::Ready(Some(delivery)) => return this.deliver(delivery, cx),
            // The store forgot the watch without a word: only when the stand-in goes away.
            Poll::Ready(None) => return this.deliver(Delivery::End, cx),
            Poll::Pending => {}
        }
        if let Some(due) = this.bookmark.as_mut()
            && due.as_mut().poll(cx).is_ready()
        {
            this.bookmark = None;
            // Every event up to the current version was sent under the lock: take them first,
            // so the bookmark never runs ahead of an event still queued.
            let state = this.shared.lock();
            while let Ok(delivery) = this.deliveries.try_recv() {
                this.pending.push_back(delivery);
            }
            let bookmark = state.rbac.bookmark_line(this.kind, false);
            drop(state);
            this.pending.push_back(Delivery::Line(bookmark));
            // Non-empty: the bookmark was just queued.
            let next = this.pending.pop_front().unwrap_or(Delivery::End);
            return this.deliver(next, cx);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.done = true;
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

/// The key of `object` of `kind` in etcd (`<name>` or `<namespace>/<name>`), panicking on an
/// object a test got wrong.
fn key_of(kind: RbacKind, object: &Value) -> String {
    let name = object["metadata"]["name"]
        .as_str()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| panic!("an RBAC object needs metadata.name: {object}"));
    if kind.namespaced() {
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| panic!("a {} needs metadata.namespace: {object}", kind.kind()));
        format!("{namespace}/{name}")
    } else {
        name.to_owned()
    }
}

/// The RBAC side of the test's handle.
impl ApiServer {
    /// Creates or updates an RBAC object (its kind from `object["kind"]`: ClusterRole,
    /// ClusterRoleBinding, Role or RoleBinding), as `kubectl apply` would: the next
    /// resourceVersion, a uid and creationTimestamp on creation, and an ADDED or MODIFIED
    /// event to every open watch that sees it. An update that changes nothing is no change (no
    /// new version, no event), as in the real server. Returns the object's resourceVersion.
    pub fn apply_rbac(&self, object: Value) -> String {
        let kind = object["kind"]
            .as_str()
            .and_then(RbacKind::from_kind)
            .unwrap_or_else(|| panic!("not an RBAC kind: {}", object["kind"]));
        let key = key_of(kind, &object);
        let mut object = object;
        object["apiVersion"] = json!(API_VERSION);
        if !kind.namespaced()
            && let Some(metadata) = object["metadata"].as_object_mut()
        {
            metadata.remove("namespace");
        }
        let mut state = self.shared.lock();
        let store = &mut state.rbac;
        let existing = store.objects.get(&(kind, key.clone()));
        let event = if let Some(existing) = existing {
            for field in ["uid", "creationTimestamp", "resourceVersion"] {
                object["metadata"][field] = existing["metadata"][field].clone();
            }
            if &object == existing {
                return existing["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
            }
            EventType::Modified
        } else {
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |since| since.as_secs());
            let created = i64::try_from(now)
                .ok()
                .and_then(|now| jiff::Timestamp::from_second(now).ok())
                .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
            object["metadata"]["uid"] = json!(format!(
                "00000000-0000-4000-8000-{:012x}",
                store.revision + 1
            ));
            object["metadata"]["creationTimestamp"] = json!(created.to_string());
            EventType::Added
        };
        store.revision += 1;
        let version = store.revision.to_string();
        object["metadata"]["resourceVersion"] = json!(version);
        store.objects.insert((kind, key.clone()), object.clone());
        store.commit(kind, key, event, object);
        version
    }

    /// Deletes an RBAC object (`namespace` "" for the cluster-scoped kinds): the next
    /// resourceVersion, and a DELETED event carrying the object at that version. Panics when
    /// there is no such object. Returns the version of the deletion.
    pub fn delete_rbac(&self, kind: RbacKind, namespace: &str, name: &str) -> String {
        let key = if kind.namespaced() {
            format!("{namespace}/{name}")
        } else {
            name.to_owned()
        };
        let mut state = self.shared.lock();
        let store = &mut state.rbac;
        let Some(mut object) = store.objects.remove(&(kind, key.clone())) else {
            panic!("no {} {key:?} to delete", kind.kind());
        };
        store.revision += 1;
        let version = store.revision.to_string();
        object["metadata"]["resourceVersion"] = json!(version);
        store.commit(kind, key, EventType::Deleted, object);
        version
    }

    /// Ends every open RBAC watch abruptly (the connection torn down mid-stream, no clean end),
    /// as a network failure or an API server restart does.
    pub fn drop_rbac_watches(&self) {
        for watch in self.shared.lock().rbac.watches.drain(..) {
            let _ = watch.deliveries.send(Delivery::Cut);
        }
    }

    /// Compacts the history at the current version: watches from an older version (and
    /// continue tokens of lists read at one) are answered `410 Expired` from now on.
    pub fn compact_rbac_history(&self) {
        let mut state = self.shared.lock();
        state.rbac.compacted = state.rbac.revision;
    }

    /// Sends a BOOKMARK at the current version to every open watch that asked for bookmarks.
    pub fn rbac_bookmark(&self) {
        let mut state = self.shared.lock();
        let store = &mut state.rbac;
        store.watches.retain(|w| !w.deliveries.is_closed());
        for watch in store.watches.iter().filter(|w| w.bookmarks) {
            let bookmark = store.bookmark_line(watch.kind, false);
            let _ = watch.deliveries.send(Delivery::Line(bookmark));
        }
    }

    /// Delays every later list answer by `delay` (read at the end of it), as a loaded API
    /// server answers a large list slowly.
    pub fn set_rbac_list_delay(&self, delay: Duration) {
        self.shared.lock().rbac.list_delay = delay;
    }

    /// While not `available`, RBAC lists and watches are answered `503` with a
    /// `ServiceUnavailable` Status (open watches go on: cut them with
    /// [`ApiServer::drop_rbac_watches`]). Reviews are not affected.
    pub fn set_rbac_available(&self, available: bool) {
        self.shared.lock().rbac.available = available;
    }
}

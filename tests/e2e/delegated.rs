//! Delegated authentication and authorization through the real proxy (the token and
//! SubjectAccessReview cases T1–T8, S1–S8 and F3–F9 of `docs/COMPATIBILITY.md`): bearer tokens
//! checked with TokenReview and requests authorized with SubjectAccessReview by the stand-in API
//! server named in `--kubeconfig`, with their caches, retries, coalescing, faults, the chain with
//! local authorizers, and the metrics (secrets kept out of logs: secrets.rs).

use std::time::Duration;

use http::StatusCode;
use serde_json::json;

use crate::support::answers::{assert_authorization_error, assert_forbidden, assert_unauthorized};
use crate::support::apiserver::{
    API_AUDIENCES, ApiServer, Caller, Fault, Flavour, Kind, PROXY_IDENTITY, Target, TokenUser,
    Verdict,
};
use crate::support::client::{ForwardedIdentity, Identity, authorized, bearer, empty, request};
use crate::support::harness::{Harness, NODE_NAME, ProxySpec, Subject, grant};
use crate::support::metrics::total;
use crate::support::pki::{Authority, CertSpec, sha256_hex};
use crate::support::process::ProcessSpec;
use crate::support::streams::{WEBSOCKET_TOKEN_PREFIX, websocket_request, websocket_with_token};
use crate::support::within;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";
/// Longer than a TTL of 1 s: the entry has expired.
const PAST_ONE_SECOND: Duration = Duration::from_millis(1500);

/// The proxy with these flags and then `extra`, reviewing with the stand-in (client-certificate
/// kubeconfig).
async fn proxy(api: &ApiServer, args: &[&str], extra: &[&str]) -> Harness {
    ProxySpec::new(args)
        .args(extra)
        .apiserver(api)
        .start()
        .await
}

/// Token webhook on, every authenticated request allowed, identity shown to the kubelet.
async fn token_proxy(api: &ApiServer, extra: &[&str]) -> Harness {
    let args = [
        "--authentication-token-webhook",
        "--authorization-mode=AlwaysAllow",
        "--forward-identity-headers",
    ];
    proxy(api, &args, extra).await
}

fn user(name: &str, uid: &str, groups: &[&str], extra: &[(&str, &[&str])]) -> ForwardedIdentity {
    ForwardedIdentity {
        extra: extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.iter().map(|v| (*v).to_owned()).collect()))
            .collect(),
        ..ForwardedIdentity::new(name, uid, groups)
    }
}

fn anonymous() -> ForwardedIdentity {
    user("system:anonymous", "", &["system:unauthenticated"], &[])
}

async fn metrics(h: &Harness) -> String {
    let reply = h.admin_get("/metrics").await;
    assert_eq!(reply.status, StatusCode::OK);
    reply.text()
}

const API_CALLS: &str = "kubelet_auth_proxy_apiserver_calls_total";
const CACHE_LOOKUPS: &str = "kubelet_auth_proxy_review_cache_lookups_total";

/// API server calls of `kind` answered with `code` (0: no answer), as the proxy counted them.
async fn api_calls(h: &Harness, kind: &str, code: &str) -> f64 {
    total(
        &metrics(h).await,
        API_CALLS,
        &[("kind", kind), ("code", code)],
    )
}

/// Waits (bounded, best effort) until the proxy has `n` client connections open, then a moment
/// more so their requests reach the review caches. Coalescing is asserted by call counts, which
/// hold whatever the timing; this only makes the requests overlap as much as it can.
async fn wait_for_connections(h: &Harness, n: usize) {
    let _ = tokio::time::timeout(Duration::from_secs(8), async {
        while total(
            &metrics(h).await,
            "kubelet_auth_proxy_connections_open",
            &[],
        ) < n as f64
        {
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
}

// ---------------------------------------------------------------------------------------------
// Bearer tokens: header and WebSocket subprotocol (bearertoken.go, websocket/protocol.go, token
// webhook.go)
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn bearer_token_authenticates_and_never_reaches_the_kubelet() {
    let api = ApiServer::start().await;
    api.add_token(
        "tok-bob",
        TokenUser::new("bob")
            .uid("u-9")
            .groups(&["g1", "system:authenticated"])
            .extra("scopes", &["a", "b"]),
    );
    // T8: the API server's answer lacks system:authenticated; the proxy adds it.
    api.add_token("tok-dave", TokenUser::new("dave").groups(&["g2"]));
    let h = token_proxy(&api, &[]).await;

    let reply = h.bearer_get("/echo", "tok-bob").await;
    let echo = reply.echo();
    // T1: the user verbatim, groups unchanged (system:authenticated not repeated).
    assert_eq!(
        echo.identity(),
        user(
            "bob",
            "u-9",
            &["g1", "system:authenticated"],
            &[("scopes", &["a", "b"])]
        )
    );
    assert_eq!(echo.header("authorization"), Vec::<String>::new());

    let dave = h.bearer_get("/echo", "tok-dave").await.echo();
    assert_eq!(
        dave.identity(),
        user("dave", "", &["g2", "system:authenticated"], &[])
    );

    // The request the kubelet makes (token webhook.go `AuthenticateToken`), no audiences; made with
    // the kubeconfig's identity.
    assert_eq!(
        api.token_reviews(),
        vec![json!({"token": "tok-bob"}), json!({"token": "tok-dave"})]
    );
    assert!(
        api.calls()
            .iter()
            .all(|c| c.caller == Some(Caller::Certificate(PROXY_IDENTITY.to_owned())))
    );
}

#[tokio::test]
async fn token_kubeconfig_flavour_works_too() {
    let api = ApiServer::start().await;
    api.add_token("tok-bob", TokenUser::new("bob"));
    let h = ProxySpec::new(&[
        "--authentication-token-webhook",
        "--authorization-mode=Webhook",
    ])
    .kubeconfig(&api.kubeconfig(Flavour::Token))
    .start()
    .await;
    api.set_rules(|r| Verdict::allow_when(r.user == "bob"));
    let reply = h.bearer_get("/pods", "tok-bob").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let callers: Vec<_> = api.calls().into_iter().map(|c| c.caller).collect();
    assert_eq!(callers, vec![Some(Caller::Token), Some(Caller::Token)]);
}

#[tokio::test]
async fn websocket_protocol_token_authenticates_and_is_removed() {
    let api = ApiServer::start().await;
    // '?' and '>' make base64url differ from standard base64.
    let token = "ws-tok??>>";
    api.add_token(
        token,
        TokenUser::new("bob").groups(&["system:authenticated"]),
    );
    let h = token_proxy(&api, &[]).await;
    let client = h.http1_client(Identity::None);

    // A WebSocket handshake to a path the kubelet answers without upgrading shows what reached it.
    let reply = client.send(websocket_with_token("/echo", token)).await;
    let echo = reply.echo();
    assert_eq!(
        echo.identity(),
        user("bob", "", &["system:authenticated"], &[])
    );
    let protocols: Vec<String> = echo
        .header("sec-websocket-protocol")
        .iter()
        .flat_map(|v| v.split(',').map(|p| p.trim().to_owned()))
        .collect();
    assert_eq!(protocols, vec!["v4.channel.k8s.io".to_owned()]);
    assert_eq!(echo.header("authorization"), Vec::<String>::new());

    // And an exec upgrade goes through with it.
    let exec = client
        .open(websocket_with_token(
            "/exec/ns/pod/ctr?command=sh&stdin=true",
            token,
        ))
        .await;
    assert_eq!(exec.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(api.token_reviews(), vec![json!({"token": token})]);
}

#[tokio::test]
async fn websocket_protocol_token_errors() {
    let api = ApiServer::start().await;
    api.add_token("tok-bob", TokenUser::new("bob"));
    let h = token_proxy(&api, &["--anonymous-auth"]).await;
    let client = h.http1_client(Identity::None);
    let encoded = URL_SAFE_NO_PAD.encode("tok-bob");
    for (protocols, what) in [
        (
            format!("{WEBSOCKET_TOKEN_PREFIX}{encoded}"),
            "no other subprotocol",
        ),
        (
            format!(
                "{WEBSOCKET_TOKEN_PREFIX}{encoded}, {WEBSOCKET_TOKEN_PREFIX}{encoded}, v4.channel.k8s.io"
            ),
            "two tokens",
        ),
        (
            format!("{WEBSOCKET_TOKEN_PREFIX}tok+bob=, v4.channel.k8s.io"),
            "not base64url",
        ),
        (
            format!(
                "{WEBSOCKET_TOKEN_PREFIX}{}, v4.channel.k8s.io",
                URL_SAFE_NO_PAD.encode([0xff, 0xfe])
            ),
            "not UTF-8",
        ),
    ] {
        assert_unauthorized(
            &client.send(websocket_request("/echo", &protocols)).await,
            what,
        );
    }
    assert!(api.token_reviews().is_empty());
    // Not a WebSocket request: the subprotocol is not a credential; anonymous.
    let plain = client
        .send(
            request("GET", "/echo")
                .header(
                    "sec-websocket-protocol",
                    format!("{WEBSOCKET_TOKEN_PREFIX}{encoded}, v4.channel.k8s.io"),
                )
                .body(empty())
                .unwrap(),
        )
        .await;
    assert_eq!(plain.echo().identity(), anonymous());
}

#[tokio::test]
async fn credential_precedence_table() {
    let api = ApiServer::start().await;
    api.add_token(
        "tok-bob",
        TokenUser::new("bob").groups(&["system:authenticated"]),
    );
    let h = token_proxy(&api, &["--anonymous-auth"]).await;
    let bob = user("bob", "", &["system:authenticated"], &[]);

    // Valid certificate + valid token: the certificate wins; the token is never reviewed, and
    // still never reaches the kubelet.
    let alice_cert = h.ca.issue(&CertSpec::client("alice").org("a"));
    let reply = h
        .client(Identity::of(&alice_cert))
        .get_with_token("/echo", "tok-bob")
        .await;
    let echo = reply.echo();
    assert_eq!(echo.identity().user, vec!["alice".to_owned()]);
    assert_eq!(echo.header("authorization"), Vec::<String>::new());
    assert!(api.token_reviews().is_empty());

    // Certificate without CN + valid token: the token user.
    let nameless = h.ca.issue(&CertSpec::client("").without_common_name());
    let reply = h
        .client(Identity::of(&nameless))
        .get_with_token("/echo", "tok-bob")
        .await;
    assert_eq!(reply.echo().identity(), bob);

    // Invalid certificate (unknown CA) + valid token: the token user.
    let stranger = Authority::root("stranger").issue(&CertSpec::client("mallory"));
    let reply = h
        .client(Identity::of(&stranger))
        .get_with_token("/echo", "tok-bob")
        .await;
    assert_eq!(reply.echo().identity(), bob);
    // Invalid certificate + rejected token: 401.
    let reply = h
        .client(Identity::of(&stranger))
        .get_with_token("/echo", "tok-nobody")
        .await;
    assert_unauthorized(&reply, "invalid certificate and rejected token");

    // No certificate + rejected token: 401 even with anonymous on.
    assert_unauthorized(&h.bearer_get("/echo", "tok-nobody").await, "rejected token");
    // No certificate + a token whose TokenReview fails: 401.
    api.inject(Kind::TokenReview, Fault::Forbidden, 1);
    assert_unauthorized(
        &h.bearer_get("/echo", "tok-failing").await,
        "TokenReview failed",
    );
    let reviewed = api.token_reviews().len();

    // Not bearer credentials: anonymous, nothing reviewed, nothing forwarded.
    for authorization in [
        "Basic Ym9iOnNlY3JldA==",
        "Bearer  tok-bob",
        "Bearer",
        "Bearer ",
    ] {
        let reply = h.anonymous().send(authorized("/echo", authorization)).await;
        let echo = reply.echo();
        assert_eq!(echo.identity(), anonymous(), "{authorization:?}");
        assert_eq!(echo.header("authorization"), Vec::<String>::new());
    }
    assert_eq!(api.token_reviews().len(), reviewed);

    // Scheme case-insensitive; a third part is ignored.
    for authorization in ["bearer tok-bob", "BEARER tok-bob extra"] {
        let reply = h.anonymous().send(authorized("/echo", authorization)).await;
        assert_eq!(reply.echo().identity(), bob, "{authorization:?}");
    }
}

#[tokio::test]
async fn anonymous_off_turns_the_anonymous_cells_into_401() {
    let api = ApiServer::start().await;
    let h = token_proxy(&api, &["--anonymous-auth=false"]).await;
    assert_unauthorized(&h.anonymous().get("/echo").await, "no credentials");
    assert_unauthorized(
        &h.anonymous()
            .send(authorized("/echo", "Basic Ym9iOnNlY3JldA=="))
            .await,
        "basic",
    );
    assert_unauthorized(
        &h.anonymous().send(authorized("/echo", "Bearer  x")).await,
        "double space",
    );
    assert!(api.token_reviews().is_empty());
}

#[tokio::test]
async fn token_webhook_off_ignores_bearer_tokens() {
    let api = ApiServer::start().await;
    api.add_token("tok-bob", TokenUser::new("bob"));
    let h = proxy(
        &api,
        &[
            "--authentication-token-webhook=false",
            "--anonymous-auth",
            "--authorization-mode=AlwaysAllow",
            "--forward-identity-headers",
        ],
        &[],
    )
    .await;
    let reply = h.bearer_get("/echo", "tok-bob").await;
    let echo = reply.echo();
    assert_eq!(echo.identity(), anonymous());
    assert_eq!(echo.header("authorization"), Vec::<String>::new());
    assert!(api.token_reviews().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Token cache and audiences (T1–T3, T7)
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn token_cache_keeps_successes_failures_and_refusals_never_failed_calls() {
    let api = ApiServer::start().await;
    api.add_token("tok-bob", TokenUser::new("bob"));
    api.reject_token("tok-quiet", "");
    api.reject_token("tok-expired", "token expired");
    let h = token_proxy(&api, &[]).await;

    // T1 + T7: the same token from another client certificate and another path is a hit.
    assert_eq!(
        h.bearer_get("/echo", "tok-bob").await.status,
        StatusCode::OK
    );
    let other = h.user("carol", &[]);
    assert_eq!(
        other
            .get_with_token("/pods", "tok-nobody-else")
            .await
            .status,
        StatusCode::OK,
        "the certificate wins, no review"
    );
    let nameless = h.client(Identity::of(
        &h.ca.issue(&CertSpec::client("").without_common_name()),
    ));
    assert_eq!(
        nameless
            .get_with_token("/stats/summary", "tok-bob")
            .await
            .status,
        StatusCode::OK
    );
    // T2: not authenticated without an error: 401, cached.
    for _ in 0..2 {
        assert_unauthorized(&h.bearer_get("/echo", "tok-quiet").await, "T2");
    }
    // T3: not authenticated with an error: 401, cached too (for at most 30 s), unlike the
    // kubelet, so a replayed refused token costs one review.
    for _ in 0..2 {
        assert_unauthorized(&h.bearer_get("/echo", "tok-expired").await, "T3");
    }
    let tokens: Vec<String> = api
        .token_reviews()
        .iter()
        .map(|spec| spec["token"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(tokens, vec!["tok-bob", "tok-quiet", "tok-expired"]);

    // A failed call is never cached: the next request reviews again and succeeds.
    api.inject(Kind::TokenReview, Fault::Forbidden, 1);
    assert_unauthorized(
        &h.bearer_get("/echo", "tok-new").await,
        "TokenReview forbidden",
    );
    api.add_token("tok-new", TokenUser::new("erin"));
    let reply = h.bearer_get("/echo", "tok-new").await;
    assert_eq!(reply.echo().identity().user, vec!["erin".to_owned()]);
    assert_eq!(api.statuses(Kind::TokenReview).len(), 5);
}

#[tokio::test]
async fn token_cache_entries_expire_after_the_ttl_flag() {
    let api = ApiServer::start().await;
    api.add_token("tok-bob", TokenUser::new("bob"));
    api.reject_token("tok-quiet", "");
    // A new key's first entry lives a random part of the TTL, from a quarter of it (0.5 s) up
    // to all of it: kept for the second request of a round, never past the TTL.
    let h = token_proxy(&api, &["--authentication-token-webhook-cache-ttl=2s"]).await;
    for round in 1..=2 {
        for _ in 0..2 {
            assert_eq!(
                h.bearer_get("/echo", "tok-bob").await.status,
                StatusCode::OK
            );
            assert_unauthorized(&h.bearer_get("/echo", "tok-quiet").await, "quiet failure");
        }
        assert_eq!(api.arrivals(Kind::TokenReview), 2 * round);
        tokio::time::sleep(PAST_ONE_SECOND * 2).await;
    }
}

#[tokio::test]
async fn token_audiences_are_sent_and_enforced() {
    let api = ApiServer::start().await;
    api.add_token("tok-kubelet", TokenUser::new("bob").audiences(&["kubelet"]));
    api.add_token("tok-api", TokenUser::new("carol"));
    let h = token_proxy(&api, &["--authentication-token-audiences=kubelet,other"]).await;
    let reply = h.bearer_get("/echo", "tok-kubelet").await;
    assert_eq!(reply.echo().identity().user, vec!["bob".to_owned()]);
    assert_unauthorized(
        &h.bearer_get("/echo", "tok-api").await,
        "token for the API server's audiences only",
    );
    assert_eq!(
        api.token_reviews(),
        vec![
            json!({"token": "tok-kubelet", "audiences": ["kubelet", "other"]}),
            json!({"token": "tok-api", "audiences": ["kubelet", "other"]}),
        ]
    );

    // Without the flag the API server's own audiences apply.
    let plain = token_proxy(&api, &[]).await;
    assert_unauthorized(
        &plain.bearer_get("/echo", "tok-kubelet").await,
        "kubelet-only token, implicit audiences",
    );
    let reply = plain.bearer_get("/echo", "tok-api").await;
    assert_eq!(reply.echo().identity().user, vec!["carol".to_owned()]);
    assert_eq!(
        api.token_reviews()[2..],
        [json!({"token": "tok-kubelet"}), json!({"token": "tok-api"})]
    );
    assert!(!API_AUDIENCES.contains(&"kubelet"));
}

// ---------------------------------------------------------------------------------------------
// SubjectAccessReview: request body, decisions, cache (F3–F9, S1–S4, S8)
// ---------------------------------------------------------------------------------------------

/// Mode Webhook (alone), token webhook on, anonymous on.
async fn webhook_proxy(api: &ApiServer, extra: &[&str]) -> Harness {
    let args = [
        "--authentication-token-webhook",
        "--authorization-mode=Webhook",
        "--anonymous-auth",
    ];
    proxy(api, &args, extra).await
}

fn subresources(api: &ApiServer) -> Vec<String> {
    api.access_reviews()
        .iter()
        .map(|spec| {
            spec["resourceAttributes"]["subresource"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn access_review_request_body_is_the_kubelets() {
    let api = ApiServer::start().await;
    api.add_token(
        "tok-agent",
        TokenUser::new("system:serviceaccount:monitoring:agent")
            .uid("8d3c")
            .groups(&[
                "system:serviceaccounts",
                "system:serviceaccounts:monitoring",
                "system:authenticated",
            ])
            .extra("authentication.kubernetes.io/pod-name", &["agent-x7k2p"]),
    );
    api.set_rules(|r| Verdict::allow_when(r.subresource == "pods" || r.verb.is_empty()));
    let h = webhook_proxy(&api, &[]).await;

    let reply = h.bearer_get("/pods", "tok-agent").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(
        api.access_reviews(),
        vec![json!({
            "resourceAttributes": {
                "verb": "get",
                "version": "v1",
                "resource": "nodes",
                "subresource": "pods",
                "name": NODE_NAME,
            },
            "user": "system:serviceaccount:monitoring:agent",
            "groups": [
                "system:serviceaccounts",
                "system:serviceaccounts:monitoring",
                "system:authenticated",
            ],
            "extra": {"authentication.kubernetes.io/pod-name": ["agent-x7k2p"]},
            "uid": "8d3c",
        })]
    );

    // HEAD has the empty verb: `verb` is omitted. An x509 user carries its credential-id.
    let cert =
        h.ca.issue(&CertSpec::client("alice").org("team-a").uid("u-1"));
    let reply = h
        .client(Identity::of(&cert))
        .send(request("HEAD", "/healthz").body(empty()).unwrap())
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        api.access_reviews()[1],
        json!({
            "resourceAttributes": {
                "version": "v1",
                "resource": "nodes",
                "subresource": "healthz",
                "name": NODE_NAME,
            },
            "user": "alice",
            "groups": ["team-a", "system:authenticated"],
            "extra": {CREDENTIAL_ID: [format!("X509SHA256={}", sha256_hex(cert.leaf()))]},
            "uid": "u-1",
        })
    );

    // Anonymous: no uid, no extra.
    let reply = h.anonymous().get("/pods").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        api.access_reviews()[2],
        json!({
            "resourceAttributes": {
                "verb": "get", "version": "v1", "resource": "nodes",
                "subresource": "pods", "name": NODE_NAME,
            },
            "user": "system:anonymous",
            "groups": ["system:unauthenticated"],
        })
    );
}

#[tokio::test]
async fn decisions_f4_f5_f8_f9() {
    let api = ApiServer::start().await;
    api.set_rules(|r| match (r.user.as_str(), r.subresource.as_str()) {
        // F4: pods no opinion, proxy allowed.
        ("f4", "proxy") => Verdict::allow(),
        // F5: pods denied, proxy allowed: Deny does not stop the fallback.
        ("f5", "pods") => Verdict::deny(),
        ("f5", "proxy") => Verdict::allow(),
        // F8: allowed and denied at once is an error.
        ("f8", "pods") => Verdict::allowed_and_denied(),
        // F9: both denied.
        ("f9", _) => Verdict::deny(),
        _ => Verdict::no_opinion(),
    });
    let h = webhook_proxy(&api, &[]).await;

    let f4 = h.user("f4", &[]).get("/pods").await;
    assert_eq!(f4.status, StatusCode::OK, "{}", f4.text());
    assert_eq!(subresources(&api), vec!["pods", "proxy"]);

    let f5 = h.user("f5", &[]).get("/pods").await;
    assert_eq!(f5.status, StatusCode::OK, "{}", f5.text());

    let f8 = h.user("f8", &[]).get("/pods").await;
    assert_authorization_error(&f8, "f8", "get", "pods");
    // S8 + F8: the proxy attribute was never asked about.
    assert_eq!(
        subresources(&api),
        vec!["pods", "proxy", "pods", "proxy", "pods"]
    );

    let f9 = h.user("f9", &[]).get("/pods").await;
    assert_forbidden(&f9, "f9", "get", "pods proxy");
    let none = h.anonymous().get("/metrics").await;
    // F3.
    assert_forbidden(&none, "system:anonymous", "get", "metrics");
}

#[tokio::test]
async fn review_errors_f6_f7_are_500_and_stop_the_list() {
    let api = ApiServer::start().await;
    api.set_rules(|r| Verdict::allow_when(r.subresource == "proxy"));
    let h = webhook_proxy(&api, &[]).await;
    let alice = h.user("alice", &[]);

    // F6 / S7: the first SAR fails (403, not retried): 500 naming pods; proxy never tried.
    api.inject(Kind::SubjectAccessReview, Fault::Forbidden, 1);
    let reply = alice.get("/pods").await;
    assert_authorization_error(&reply, "alice", "get", "pods");
    assert_eq!(api.statuses(Kind::SubjectAccessReview), vec![403]);

    // F7: pods has no opinion (cached), proxy fails (here: allowed and denied at once): 500
    // naming proxy.
    api.set_rules(|r| {
        if r.subresource == "proxy" {
            Verdict::allowed_and_denied()
        } else {
            Verdict::no_opinion()
        }
    });
    let reply = alice.get("/pods").await;
    assert_authorization_error(&reply, "alice", "get", "proxy");
    assert_eq!(api.statuses(Kind::SubjectAccessReview), vec![403, 201, 201]);
    // Errors are not cached: proxy is asked again (pods comes from the cache); a 403 is not
    // retried and is again a 500 naming proxy.
    api.inject(Kind::SubjectAccessReview, Fault::Forbidden, 1);
    let reply = alice.get("/pods").await;
    assert_authorization_error(&reply, "alice", "get", "proxy");
    assert_eq!(
        api.statuses(Kind::SubjectAccessReview),
        vec![403, 201, 201, 403]
    );
    // Once the API server allows, so does the proxy.
    api.set_rules(|r| Verdict::allow_when(r.subresource == "proxy"));
    let reply = alice.get("/pods").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(
        subresources(&api),
        vec!["pods", "pods", "proxy", "proxy", "proxy"]
    );
}

#[tokio::test]
async fn access_cache_s1_s3_s4_allowed_and_denied_entries() {
    let api = ApiServer::start().await;
    api.set_rules(|r| match r.subresource.as_str() {
        "stats" | "proxy" => Verdict::allow(),
        "metrics" => Verdict::deny(),
        _ => Verdict::no_opinion(),
    });
    let h = webhook_proxy(&api, &[]).await;
    let cert = h.ca.issue(&CertSpec::client("alice"));
    let alice = h.client(Identity::of(&cert));

    // S1: allowed, then the same spec again: no second call.
    assert_eq!(alice.get("/stats/summary").await.status, StatusCode::OK);
    assert_eq!(alice.get("/stats/summary").await.status, StatusCode::OK);
    // Denied: cached too (30 s by default).
    assert_forbidden(&alice.get("/metrics").await, "alice", "get", "metrics");
    assert_forbidden(&alice.get("/metrics").await, "alice", "get", "metrics");
    // S3: another subresource is another entry; F4's two attributes are cached separately.
    assert_eq!(alice.get("/pods").await.status, StatusCode::OK);
    assert_eq!(alice.get("/pods").await.status, StatusCode::OK);
    assert_eq!(
        subresources(&api),
        vec!["stats", "metrics", "pods", "proxy"]
    );
    // S4: the same user with another certificate (another credential-id): new entries.
    let other = h.client(Identity::of(&h.ca.issue(&CertSpec::client("alice"))));
    assert_eq!(other.get("/stats/summary").await.status, StatusCode::OK);
    let specs = api.access_reviews();
    assert_eq!(specs.len(), 5);
    assert_ne!(specs[4]["extra"], specs[0]["extra"]);
    assert_eq!(specs[4]["user"], specs[0]["user"]);
}

/// A stand-in API server allowing `nodes/stats` and answering `otherwise` for the rest, and a
/// proxy asking it with these cache TTLs for authorized and unauthorized answers.
async fn stats_allowed(
    otherwise: Verdict,
    authorized: &str,
    unauthorized: &str,
) -> (ApiServer, Harness) {
    let api = ApiServer::start().await;
    api.set_rules(move |r| {
        if r.subresource == "stats" {
            Verdict::allow()
        } else {
            otherwise.clone()
        }
    });
    let authorized = format!("--authorization-webhook-cache-authorized-ttl={authorized}");
    let unauthorized = format!("--authorization-webhook-cache-unauthorized-ttl={unauthorized}");
    let h = webhook_proxy(&api, &[authorized.as_str(), unauthorized.as_str()]).await;
    (api, h)
}

#[tokio::test]
async fn access_cache_ttls_follow_their_flags() {
    // Authorized entries live at most 1 s, unauthorized ones at least a quarter of 1 h (a new
    // key's first entry lives a random part of its TTL, never more): only the allowed one is
    // asked again.
    let (api, h) = stats_allowed(Verdict::deny(), "1s", "1h").await;
    let alice = h.user("alice", &[]);
    for _ in 0..2 {
        assert_eq!(alice.get("/stats/summary").await.status, StatusCode::OK);
        assert_forbidden(&alice.get("/metrics").await, "alice", "get", "metrics");
        tokio::time::sleep(PAST_ONE_SECOND).await;
    }
    assert_eq!(subresources(&api), vec!["stats", "metrics", "stats"]);

    // S2: and the other way round.
    let (api, h) = stats_allowed(Verdict::no_opinion(), "1h", "1s").await;
    let alice = h.user("alice", &[]);
    for _ in 0..2 {
        assert_eq!(alice.get("/stats/summary").await.status, StatusCode::OK);
        assert_forbidden(&alice.get("/metrics").await, "alice", "get", "metrics");
        assert_forbidden(&alice.get("/metrics").await, "alice", "get", "metrics");
        tokio::time::sleep(PAST_ONE_SECOND).await;
    }
    assert_eq!(subresources(&api), vec!["stats", "metrics", "metrics"]);
}

// ---------------------------------------------------------------------------------------------
// Retries (T4–T6, S5–S7)
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn token_review_retries_500s_then_succeeds_t4() {
    let api = ApiServer::start().await;
    api.add_token("tok-bob", TokenUser::new("bob"));
    let h = token_proxy(&api, &[]).await;
    api.inject(Kind::TokenReview, Fault::InternalError, 3);
    let reply = h.bearer_get("/echo", "tok-bob").await;
    assert_eq!(reply.echo().identity().user, vec!["bob".to_owned()]);
    assert_eq!(api.statuses(Kind::TokenReview), vec![500, 500, 500, 201]);
    assert_eq!(api_calls(&h, "TokenReview", "500").await, 3.0);
}

#[tokio::test]
async fn token_review_connection_refused_is_one_attempt_t5() {
    let mut api = ApiServer::start().await;
    api.add_token("tok-bob", TokenUser::new("bob"));
    let h = token_proxy(&api, &[]).await;
    assert_eq!(
        h.bearer_get("/echo", "tok-bob").await.status,
        StatusCode::OK
    );
    api.stop().await;
    assert_unauthorized(&h.bearer_get("/echo", "tok-other").await, "T5");
    assert_eq!(api_calls(&h, "TokenReview", "0").await, 1.0);
    // The cached user is still served while the API server is down.
    let reply = h.bearer_get("/echo", "tok-bob").await;
    assert_eq!(reply.status, StatusCode::OK);
}

/// T6. Blocked: the kube client the proxy builds keeps kube's default retry layer
/// (`kube::Config::default_retry`), which retries 429/503/504 up to 15 times inside each of the
/// proxy's attempts, so five 429s never reach the proxy's own retry loop.
#[tokio::test]
async fn token_review_gives_up_after_five_429s_t6() {
    let api = ApiServer::start().await;
    api.add_token("tok-bob", TokenUser::new("bob"));
    let h = token_proxy(&api, &[]).await;
    api.inject(
        Kind::TokenReview,
        Fault::TooManyRequests {
            retry_after_seconds: 1,
        },
        5,
    );
    assert_unauthorized(&h.bearer_get("/echo", "tok-bob").await, "T6");
    assert_eq!(api.statuses(Kind::TokenReview), vec![429; 5]);
}

/// A 503 without `Retry-After` is final (`DefaultShouldRetry` retries a 503 only with
/// `Retry-After`). Blocked by the same hidden kube retry layer as T6.
#[tokio::test]
async fn service_unavailable_without_retry_after_is_final() {
    let api = ApiServer::start().await;
    api.add_token("tok-bob", TokenUser::new("bob"));
    api.set_rules(|_| Verdict::allow());
    let h = webhook_proxy(&api, &[]).await;
    api.inject(Target::Both, Fault::ServiceUnavailable, 1);
    assert_unauthorized(
        &h.bearer_get("/stats/summary", "tok-bob").await,
        "503 TokenReview",
    );
    assert_eq!(api.statuses(Kind::TokenReview), vec![503]);
    api.inject(Target::Both, Fault::ServiceUnavailable, 1);
    let reply = h.user("alice", &[]).get("/stats/summary").await;
    assert_authorization_error(&reply, "alice", "get", "stats");
    assert_eq!(api.statuses(Kind::SubjectAccessReview), vec![503]);
}

#[tokio::test]
async fn access_review_retries_s5_s6() {
    let mut api = ApiServer::start_allowing().await;
    let h = webhook_proxy(&api, &[]).await;
    let alice = h.user("alice", &[]);

    // S5: 500, 500, then allowed: 3 attempts, allowed, cached.
    api.inject(Kind::SubjectAccessReview, Fault::InternalError, 2);
    assert_eq!(alice.get("/stats/summary").await.status, StatusCode::OK);
    assert_eq!(alice.get("/stats/summary").await.status, StatusCode::OK);
    assert_eq!(api.statuses(Kind::SubjectAccessReview), vec![500, 500, 201]);

    // S6: connection refused: one attempt, 500 naming the attribute.
    api.stop().await;
    let reply = alice.get("/metrics").await;
    assert_authorization_error(&reply, "alice", "get", "metrics");
    assert_eq!(api_calls(&h, "SubjectAccessReview", "0").await, 1.0);
    // The cached decision still stands.
    assert_eq!(alice.get("/stats/summary").await.status, StatusCode::OK);

    // Recovery: the API server is back, the proxy uses it again.
    api.restart().await;
    assert_eq!(alice.get("/metrics").await.status, StatusCode::OK);
    assert_eq!(
        api.statuses(Kind::SubjectAccessReview),
        vec![500, 500, 201, 201]
    );
}

// ---------------------------------------------------------------------------------------------
// Coalescing (one API server call for a burst of identical cold requests)
// ---------------------------------------------------------------------------------------------

/// Sends `count` concurrent `GET /pods`, each on its own connection, with `token(i)`.
async fn burst(h: &Harness, count: usize, token: impl Fn(usize) -> String) -> Vec<StatusCode> {
    let client = h.anonymous();
    let tasks: Vec<_> = (0..count)
        .map(|i| {
            let client = client.clone();
            let token = token(i);
            tokio::spawn(async move {
                client
                    .try_send(bearer("/pods", &token))
                    .await
                    .map(|reply| reply.status)
            })
        })
        .collect();
    let mut statuses = Vec::with_capacity(count);
    for task in tasks {
        let status = within("a burst request", task)
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("burst request failed: {e}"));
        statuses.push(status);
    }
    statuses
}

#[tokio::test]
async fn five_hundred_concurrent_requests_one_token_review_one_review_per_attribute() {
    let api = ApiServer::start().await;
    api.add_token("tok-burst", TokenUser::new("bob"));
    api.set_rules(|r| Verdict::allow_when(r.subresource == "proxy"));
    // Room for the held review: the pile-up below waits up to ~9 s.
    let h = webhook_proxy(&api, &["--apiserver-request-timeout=30s"]).await;

    // The TokenReview is held until the requests have piled up behind it.
    let gate = api.hold(Kind::TokenReview);
    let requests = burst(&h, 500, |_| "tok-burst".to_owned());
    let pile_up = async {
        api.wait_for_arrivals(Kind::TokenReview, 1).await;
        wait_for_connections(&h, 500).await;
        gate.release();
    };
    let (statuses, ()) = tokio::join!(requests, pile_up);
    let failed: Vec<_> = statuses.iter().filter(|s| **s != StatusCode::OK).collect();
    assert!(
        failed.is_empty(),
        "{} of 500 were not 200: {failed:?}",
        failed.len()
    );
    let text = metrics(&h).await;
    let lookups = |cache: &str, result: &str| {
        total(
            &text,
            CACHE_LOOKUPS,
            &[("cache", cache), ("result", result)],
        )
    };
    eprintln!(
        "coalescing: {} TokenReview(s), {} SubjectAccessReview(s) for 500 requests; token cache \
         hit/miss/coalesced {}/{}/{}; access cache hit/miss/coalesced {}/{}/{}",
        api.arrivals(Kind::TokenReview),
        api.arrivals(Kind::SubjectAccessReview),
        lookups("TokenReview", "hit"),
        lookups("TokenReview", "miss"),
        lookups("TokenReview", "coalesced"),
        lookups("SubjectAccessReview", "hit"),
        lookups("SubjectAccessReview", "miss"),
        lookups("SubjectAccessReview", "coalesced"),
    );
    assert_eq!(api.arrivals(Kind::TokenReview), 1);
    // Two attribute sets (pods: no opinion, then proxy: allowed): one review each.
    assert_eq!(subresources(&api), vec!["pods", "proxy"]);
    assert_eq!(
        lookups("TokenReview", "hit")
            + lookups("TokenReview", "miss")
            + lookups("TokenReview", "coalesced"),
        500.0
    );
    assert_eq!(lookups("TokenReview", "miss"), 1.0);
}

#[tokio::test]
async fn fifty_distinct_tokens_concurrently_make_fifty_token_reviews() {
    let api = ApiServer::start().await;
    for i in 0..50 {
        api.add_token(&format!("tok-{i}"), TokenUser::new(&format!("user-{i}")));
    }
    api.set_rules(|r| Verdict::allow_when(r.subresource == "pods"));
    let h = webhook_proxy(&api, &[]).await;
    let statuses = burst(&h, 50, |i| format!("tok-{i}")).await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );
    assert_eq!(api.arrivals(Kind::TokenReview), 50);
    assert_eq!(api.arrivals(Kind::SubjectAccessReview), 50);
    let mut tokens: Vec<String> = api
        .token_reviews()
        .iter()
        .map(|spec| spec["token"].as_str().unwrap().to_owned())
        .collect();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 50);
}

// ---------------------------------------------------------------------------------------------
// Faults: slow, malformed, oversized, down and back
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn slow_api_server_fails_closed_within_the_request_timeout() {
    let api = ApiServer::start().await;
    api.add_token("tok-bob", TokenUser::new("bob"));
    api.set_rules(|_| Verdict::allow());
    let h = webhook_proxy(&api, &["--apiserver-request-timeout=1s"]).await;
    // Longer than the timeout, for every attempt the proxy may make.
    api.inject(Target::Both, Fault::Slow(Duration::from_secs(8)), 10);
    // Each step is bounded by STEP_TIMEOUT (20 s): an unbounded wait fails the test.
    assert_unauthorized(&h.bearer_get("/echo", "tok-bob").await, "slow TokenReview");
    let reply = h.user("alice", &[]).get("/stats/summary").await;
    assert_authorization_error(&reply, "alice", "get", "stats");
    api.clear_faults();
    // Once the API server is quick again, both work.
    assert_eq!(
        h.bearer_get("/stats/summary", "tok-bob").await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn malformed_and_oversized_answers_fail_closed_and_the_proxy_keeps_serving() {
    let api = ApiServer::start().await;
    api.add_token("tok-bob", TokenUser::new("bob"));
    api.set_rules(|_| Verdict::allow());
    let h = webhook_proxy(&api, &[]).await;
    let oversized = Fault::Oversized {
        bytes: 64 * 1024 * 1024,
    };
    for (fault, what) in [
        (Fault::MalformedJson, "malformed"),
        (oversized, "oversized"),
    ] {
        api.inject(Kind::TokenReview, fault.clone(), 5);
        assert_unauthorized(&h.bearer_get("/echo", "tok-bob").await, what);
        api.clear_faults();
        api.inject(Kind::SubjectAccessReview, fault, 5);
        let reply = h.user("alice", &[]).get("/stats/summary").await;
        assert_authorization_error(&reply, "alice", "get", "stats");
        api.clear_faults();
    }
    // Still serving, and nothing bad was cached.
    let reply = h.bearer_get("/stats/summary", "tok-bob").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(
        h.user("alice", &[]).get("/stats/summary").await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn recovers_when_the_api_server_comes_back() {
    let mut api = ApiServer::start().await;
    api.add_token("tok-bob", TokenUser::new("bob"));
    api.set_rules(|_| Verdict::allow());
    let h = webhook_proxy(&api, &[]).await;
    assert_eq!(
        h.bearer_get("/pods", "tok-bob").await.status,
        StatusCode::OK
    );
    api.stop().await;
    assert_unauthorized(&h.bearer_get("/pods", "tok-new").await, "API server down");
    assert_authorization_error(
        &h.user("alice", &[]).get("/pods").await,
        "alice",
        "get",
        "pods",
    );
    api.restart().await;
    api.add_token("tok-new", TokenUser::new("erin"));
    assert_eq!(
        h.bearer_get("/pods", "tok-new").await.status,
        StatusCode::OK
    );
    assert_eq!(
        h.user("alice", &[]).get("/pods").await.status,
        StatusCode::OK
    );
}

// ---------------------------------------------------------------------------------------------
// Chain: Node,Policy,Webhook (union.go: the first Allow or Deny wins)
// ---------------------------------------------------------------------------------------------

/// Mode `Node,Policy,Webhook` with `extra` flags: the local policy lets alice get `resource`,
/// the stand-in allows bob and has no opinion about anyone else.
async fn chain_proxy(api: &ApiServer, resource: &str, extra: &[&str]) -> Harness {
    api.set_rules(|r| Verdict::allow_when(r.user == "bob"));
    let policy = grant(
        "alice-reader",
        &[resource],
        &["get"],
        &[Subject::User("alice")],
    );
    ProxySpec::new(&["--authorization-mode=Node,Policy,Webhook"])
        .args(extra)
        .policy(&policy)
        .apiserver(api)
        .start()
        .await
}

#[tokio::test]
async fn chain_node_policy_webhook_asks_the_api_server_last() {
    let api = ApiServer::start().await;
    let h = chain_proxy(&api, "nodes/stats", &["--authentication-token-webhook"]).await;

    // The local policy allows: no SubjectAccessReview.
    assert_eq!(
        h.user("alice", &[]).get("/stats/summary").await.status,
        StatusCode::OK
    );
    // Another node's identity: the Node authorizer denies, no SubjectAccessReview.
    let other_node = h.user("system:node:node-b", &["system:nodes"]);
    assert_forbidden(
        &other_node.get("/stats/summary").await,
        "system:node:node-b",
        "get",
        "stats",
    );
    assert!(api.access_reviews().is_empty());

    // Neither local authorizer allows: the webhook is asked.
    assert_eq!(
        h.user("bob", &[]).get("/stats/summary").await.status,
        StatusCode::OK
    );
    assert_forbidden(
        &h.user("alice", &[]).get("/metrics").await,
        "alice",
        "get",
        "metrics",
    );
    assert_eq!(subresources(&api), vec!["stats", "metrics"]);
}

#[tokio::test]
async fn local_authorizers_answer_every_attribute_set_before_any_review() {
    let api = ApiServer::start().await;
    // GET /pods asks nodes/pods, then nodes/proxy: the policy grants only the second.
    let h = chain_proxy(&api, "nodes/proxy", &[]).await;

    // The kubelet's loop would ask the webhook about nodes/pods first; the local policy is
    // asked about both sets before any review, and allows the second.
    assert_eq!(
        h.user("alice", &[]).get("/pods").await.status,
        StatusCode::OK
    );
    assert!(
        api.access_reviews().is_empty(),
        "{:?}",
        api.access_reviews()
    );

    // Nothing local allows: the webhook is asked, set by set, as the kubelet asks.
    assert_eq!(h.user("bob", &[]).get("/pods").await.status, StatusCode::OK);
    assert_eq!(subresources(&api), vec!["pods"]);
    assert_forbidden(
        &h.user("carol", &[]).get("/pods").await,
        "carol",
        "get",
        "pods proxy",
    );
    assert_eq!(subresources(&api), vec!["pods", "pods", "proxy"]);

    // Counted by the mode that decided.
    let text = metrics(&h).await;
    let decisions = |mode: &str, decision: &str| {
        total(
            &text,
            "kubelet_auth_proxy_authorization_decisions_total",
            &[("mode", mode), ("decision", decision)],
        )
    };
    assert_eq!(decisions("Policy", "allowed"), 1.0, "{text}");
    assert_eq!(decisions("Webhook", "allowed"), 1.0, "{text}");
    assert_eq!(decisions("none", "forbidden"), 1.0, "{text}");
}

// ---------------------------------------------------------------------------------------------
// Metrics (secrets in logs: see secrets.rs)
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn metrics_count_calls_cache_lookups_and_coalesced_waits() {
    let api = ApiServer::start().await;
    api.add_token("tok-bob", TokenUser::new("bob"));
    api.set_rules(|_| Verdict::allow());
    let h = webhook_proxy(&api, &[]).await;
    api.inject(Kind::TokenReview, Fault::InternalError, 1);
    for _ in 0..3 {
        let reply = h.bearer_get("/stats/summary", "tok-bob").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    let text = metrics(&h).await;
    let calls = |kind: &str, code: &str| total(&text, API_CALLS, &[("kind", kind), ("code", code)]);
    assert_eq!(calls("TokenReview", "500"), 1.0, "{text}");
    assert_eq!(calls("TokenReview", "201"), 1.0, "{text}");
    assert_eq!(calls("SubjectAccessReview", "201"), 1.0, "{text}");
    let lookups = |cache: &str, result: &str| {
        total(
            &text,
            CACHE_LOOKUPS,
            &[("cache", cache), ("result", result)],
        )
    };
    assert_eq!(lookups("TokenReview", "miss"), 1.0, "{text}");
    assert_eq!(lookups("TokenReview", "hit"), 2.0, "{text}");
    assert_eq!(lookups("SubjectAccessReview", "miss"), 1.0, "{text}");
    assert_eq!(lookups("SubjectAccessReview", "hit"), 2.0, "{text}");

    // Coalesced waits: two requests for a new token while its review is held. Whether the
    // second one is already waiting when the review is released depends on scheduling, so a
    // round where it was not (it then hits the cache) is tried again with a new token.
    let mut coalesced = 0.0;
    let before = api.arrivals(Kind::TokenReview);
    for round in 0..3 {
        let token = format!("tok-round-{round}");
        api.add_token(&token, TokenUser::new("carol"));
        let gate = api.hold(Kind::TokenReview);
        let pending = burst(&h, 2, |_| token.clone());
        let release = async {
            api.wait_for_arrivals(Kind::TokenReview, before + 1 + round)
                .await;
            wait_for_connections(&h, 2).await;
            gate.release();
        };
        let (statuses, ()) = tokio::join!(pending, release);
        assert_eq!(statuses, vec![StatusCode::OK; 2]);
        assert_eq!(api.arrivals(Kind::TokenReview), before + 1 + round);
        let text = metrics(&h).await;
        let lookups = |result: &str| {
            total(
                &text,
                CACHE_LOOKUPS,
                &[("cache", "TokenReview"), ("result", result)],
            )
        };
        assert_eq!(lookups("miss"), 2.0 + round as f64, "{text}");
        assert_eq!(
            lookups("hit") + lookups("coalesced"),
            3.0 + round as f64,
            "{text}"
        );
        coalesced = lookups("coalesced");
        if coalesced > 0.0 {
            break;
        }
    }
    assert!(coalesced >= 1.0, "no coalesced wait in three rounds");
}

/// A bearer token sent while token authentication is off is never checked; the log says so
/// instead of "no credential", and, with anonymous access on, why the caller is anonymous.
#[tokio::test]
async fn a_token_sent_while_token_authentication_is_off_is_named_in_the_log() {
    for (anonymous, status, words) in [
        (
            false,
            StatusCode::UNAUTHORIZED,
            "no credential: a bearer token was sent",
        ),
        (true, StatusCode::OK, "anonymous: a bearer token was sent"),
    ] {
        let site = ProcessSpec::new("ignored-token")
            .config(&format!("anonymousAuth: {anonymous}\n"))
            .prepare()
            .await;
        let proxy = site.start("proxy", &["-v=2".to_owned()]).await;
        let client = site.anonymous(proxy.addr());
        assert_eq!(
            client.get_with_token("/pods", "not-checked").await.status,
            status
        );
        crate::support::eventually("the log line", || {
            let logged = proxy.stderr().contains(words);
            async move { logged.then_some(()) }
        })
        .await;
        assert!(
            !proxy.stderr().contains("not-checked"),
            "the token itself was logged"
        );
    }
}

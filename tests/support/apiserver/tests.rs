//! The stand-in API server's own tests: its wire format against real clients (`kube`), its
//! callers' authentication, recorded reviews, faults, holds and restarts.

use std::io;

use bytes::Bytes;
use http::StatusCode;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http_body_util::BodyExt;
use serde_json::json;

use super::*;
use crate::support::client::{Client, Identity, Reply, request};
use crate::support::real_apiserver::client_of;
use http_body_util::Full;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

fn client(api: &ApiServer, identity: Identity) -> Client {
    Client::new(api.ca().cert(), api.addr(), identity)
}

fn proxy_client(api: &ApiServer) -> Client {
    client(
        api,
        Identity::of(&api.ca().issue(&CertSpec::client(PROXY_IDENTITY))),
    )
}

async fn post(client: &Client, path: &str, body: &Value, token: Option<&str>) -> Reply {
    let mut req = request("POST", path).header(CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        req = req.header(AUTHORIZATION, format!("Bearer {token}"));
    }
    let body = Full::new(Bytes::from(serde_json::to_vec(body).unwrap())).boxed();
    client.send(req.body(body).unwrap()).await
}

fn json_of(reply: &Reply) -> Value {
    serde_json::from_slice(&reply.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", reply.text()))
}

fn token_review(token: &str) -> Value {
    json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "metadata": {},
        "spec": {"token": token},
    })
}

fn access_review(user: &str, subresource: &str) -> Value {
    json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "metadata": {},
        "spec": {
            "resourceAttributes": {
                "verb": "get", "version": "v1", "resource": "nodes",
                "subresource": subresource, "name": "node-a",
            },
            "user": user,
            "groups": ["system:authenticated"],
        },
    })
}

#[tokio::test]
async fn token_review_wire_format_over_both_http_versions() {
    let api = ApiServer::start().await;
    api.add_token(
        "tok-bob",
        TokenUser::new("bob")
            .uid("u-1")
            .groups(&["g1", "system:authenticated"])
            .extra("scopes", &["a", "b"]),
    );
    let c = proxy_client(&api);
    for version in [http::Version::HTTP_2, http::Version::HTTP_11] {
        let c = if version == http::Version::HTTP_11 {
            Client::configured(
                api.ca().cert(),
                api.addr(),
                Identity::of(&api.ca().issue(&CertSpec::client(PROXY_IDENTITY))),
                crate::support::client::HTTP1_ONLY,
                crate::support::client::ANY_TLS,
            )
        } else {
            c.clone()
        };
        let reply = post(&c, TOKEN_REVIEWS_PATH, &token_review("tok-bob"), None).await;
        assert_eq!(reply.version, version);
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
        assert_eq!(reply.header("content-type"), Some("application/json"));
        assert_eq!(
            json_of(&reply),
            json!({
                "kind": "TokenReview",
                "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"creationTimestamp": null},
                "spec": {"token": "tok-bob"},
                "status": {
                    "authenticated": true,
                    "user": {
                        "username": "bob", "uid": "u-1",
                        "groups": ["g1", "system:authenticated"],
                        "extra": {"scopes": ["a", "b"]},
                    },
                    "audiences": API_AUDIENCES,
                },
            })
        );
    }
    assert_eq!(api.arrivals(Kind::TokenReview), 2);
    assert_eq!(
        api.calls()[0].caller,
        Some(Caller::Certificate(PROXY_IDENTITY.to_owned()))
    );
    assert_eq!(api.token_reviews(), vec![json!({"token": "tok-bob"}); 2]);
}

#[tokio::test]
async fn token_review_failures_as_the_real_server_reports_them() {
    let api = ApiServer::start().await;
    api.reject_token("tok-expired", "token expired");
    api.reject_token("tok-quiet", "");
    api.add_token("tok-aud", TokenUser::new("carol").audiences(&["kubelet"]));
    let c = proxy_client(&api);

    let unknown = json_of(&post(&c, TOKEN_REVIEWS_PATH, &token_review("nope"), None).await);
    assert_eq!(
        unknown["status"],
        json!({"user": {}, "error": UNKNOWN_TOKEN_ERROR})
    );
    let expired = json_of(&post(&c, TOKEN_REVIEWS_PATH, &token_review("tok-expired"), None).await);
    assert_eq!(
        expired["status"],
        json!({"user": {}, "error": "token expired"})
    );
    let quiet = json_of(&post(&c, TOKEN_REVIEWS_PATH, &token_review("tok-quiet"), None).await);
    assert_eq!(quiet["status"], json!({"user": {}}));

    // Audiences: the token is good for "kubelet" only.
    let implicit = json_of(&post(&c, TOKEN_REVIEWS_PATH, &token_review("tok-aud"), None).await);
    assert_eq!(implicit["status"]["authenticated"], Value::Null);
    assert!(
        implicit["status"]["error"]
            .as_str()
            .unwrap()
            .contains("is invalid for the target audiences"),
        "{implicit}"
    );
    let mut asked = token_review("tok-aud");
    asked["spec"]["audiences"] = json!(["other", "kubelet"]);
    let explicit = json_of(&post(&c, TOKEN_REVIEWS_PATH, &asked, None).await);
    assert_eq!(explicit["spec"]["audiences"], json!(["other", "kubelet"]));
    assert_eq!(explicit["status"]["authenticated"], json!(true));
    assert_eq!(explicit["status"]["audiences"], json!(["kubelet"]));

    let empty = post(&c, TOKEN_REVIEWS_PATH, &token_review(""), None).await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        json_of(&empty),
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "token is required for TokenReview in authentication",
            "reason": "BadRequest", "code": 400,
        })
    );
}

#[tokio::test]
async fn callers_authenticate_with_a_certificate_or_the_caller_token() {
    let api = ApiServer::start().await;
    let anonymous = client(&api, Identity::None);
    let refused = post(&anonymous, TOKEN_REVIEWS_PATH, &token_review("x"), None).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(json_of(&refused)["reason"], "Unauthorized");
    let wrong = post(
        &anonymous,
        TOKEN_REVIEWS_PATH,
        &token_review("x"),
        Some("x"),
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let token = api.caller_token().to_owned();
    let ok = post(
        &anonymous,
        TOKEN_REVIEWS_PATH,
        &token_review("x"),
        Some(&token),
    )
    .await;
    assert_eq!(ok.status, StatusCode::CREATED, "{}", ok.text());
    // A certificate from another CA fails the handshake.
    let stranger = Authority::root("stranger").issue(&CertSpec::client("mallory"));
    let rejected = client(&api, Identity::of(&stranger))
        .try_send(
            request("POST", TOKEN_REVIEWS_PATH)
                .body(crate::support::client::empty())
                .unwrap(),
        )
        .await;
    assert!(rejected.is_err(), "{rejected:?}");
    let callers: Vec<_> = api.calls().into_iter().map(|c| c.caller).collect();
    assert_eq!(callers, vec![None, None, Some(Caller::Token)]);
    assert_eq!(
        api.token_reviews().len(),
        1,
        "refused bodies are not reviewed"
    );
}

#[tokio::test]
async fn access_reviews_are_recorded_and_decided_by_the_rules() {
    let api = ApiServer::start().await;
    api.set_rules(|review| match review.subresource.as_str() {
        "pods" if review.user == "bob" => Verdict::allow(),
        "proxy" => Verdict::deny(),
        "log" => Verdict::allowed_and_denied(),
        _ => Verdict::no_opinion(),
    });
    let c = proxy_client(&api);
    let bob = post(&c, ACCESS_REVIEWS_PATH, &access_review("bob", "pods"), None).await;
    assert_eq!(bob.status, StatusCode::CREATED, "{}", bob.text());
    let bob = json_of(&bob);
    assert_eq!(bob["kind"], "SubjectAccessReview");
    assert_eq!(bob["spec"], access_review("bob", "pods")["spec"]);
    assert_eq!(bob["status"]["allowed"], json!(true));
    assert_eq!(bob["status"].get("denied"), None);
    let proxy = json_of(
        &post(
            &c,
            ACCESS_REVIEWS_PATH,
            &access_review("bob", "proxy"),
            None,
        )
        .await,
    );
    assert_eq!(
        proxy["status"],
        json!({"allowed": false, "denied": true, "reason": "denied by the stand-in's rules"})
    );
    let eve = json_of(&post(&c, ACCESS_REVIEWS_PATH, &access_review("eve", "pods"), None).await);
    assert_eq!(eve["status"], json!({"allowed": false}));
    let both = json_of(&post(&c, ACCESS_REVIEWS_PATH, &access_review("bob", "log"), None).await);
    assert_eq!(both["status"]["allowed"], json!(true));
    assert_eq!(both["status"]["denied"], json!(true));

    let mut nobody = access_review("", "pods");
    nobody["spec"]["groups"] = json!([]);
    let invalid = post(&c, ACCESS_REVIEWS_PATH, &nobody, None).await;
    assert_eq!(invalid.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(json_of(&invalid)["reason"], "Invalid");

    let specs = api.access_reviews();
    assert_eq!(specs.len(), 5);
    assert_eq!(specs[0], access_review("bob", "pods")["spec"]);
    assert_eq!(api.arrivals(Kind::SubjectAccessReview), 5);
    assert_eq!(api.arrivals(Kind::TokenReview), 0);
}

#[tokio::test]
async fn faults_are_served_in_order_then_normal_answers_resume() {
    let api = ApiServer::start().await;
    api.add_token("tok", TokenUser::new("bob"));
    api.inject(Kind::TokenReview, Fault::InternalError, 2);
    api.inject(
        Target::Both,
        Fault::TooManyRequests {
            retry_after_seconds: 1,
        },
        1,
    );
    api.inject(Kind::SubjectAccessReview, Fault::Forbidden, 1);
    api.inject(Kind::TokenReview, Fault::ServiceUnavailable, 1);
    let c = proxy_client(&api);

    let first = post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None).await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        json_of(&first),
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Internal error occurred: injected by the stand-in",
            "reason": "InternalError",
            "details": {"causes": [{"message": "injected by the stand-in"}]},
            "code": 500,
        })
    );
    // The SAR skips the TokenReview-only faults and takes the first one for both kinds.
    let sar = post(&c, ACCESS_REVIEWS_PATH, &access_review("bob", "pods"), None).await;
    assert_eq!(sar.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(sar.header("retry-after"), Some("1"));
    assert_eq!(json_of(&sar)["details"]["retryAfterSeconds"], json!(1));
    assert_eq!(json_of(&sar)["reason"], "TooManyRequests");
    let sar = post(&c, ACCESS_REVIEWS_PATH, &access_review("bob", "pods"), None).await;
    assert_eq!(sar.status, StatusCode::FORBIDDEN);
    assert_eq!(json_of(&sar)["reason"], "Forbidden");
    let sar = post(&c, ACCESS_REVIEWS_PATH, &access_review("bob", "pods"), None).await;
    assert_eq!(sar.status, StatusCode::CREATED);

    let second = post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None).await;
    assert_eq!(second.status, StatusCode::INTERNAL_SERVER_ERROR);
    let third = post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None).await;
    assert_eq!(third.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(third.header("retry-after"), None);
    let fourth = post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None).await;
    assert_eq!(fourth.status, StatusCode::CREATED);
    assert_eq!(api.statuses(Kind::TokenReview), vec![500, 500, 503, 201]);
    assert_eq!(api.statuses(Kind::SubjectAccessReview), vec![429, 403, 201]);
}

#[tokio::test]
async fn malformed_oversized_and_slow_answers() {
    let api = ApiServer::start().await;
    api.add_token("tok", TokenUser::new("bob"));
    api.inject(Kind::TokenReview, Fault::MalformedJson, 1);
    api.inject(
        Kind::TokenReview,
        Fault::Oversized {
            bytes: 64 * 1024 * 1024,
        },
        1,
    );
    api.inject(
        Kind::TokenReview,
        Fault::Slow(Duration::from_millis(300)),
        1,
    );
    let c = proxy_client(&api);

    let malformed = post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None).await;
    assert_eq!(malformed.status, StatusCode::CREATED);
    assert!(serde_json::from_slice::<Value>(&malformed.body).is_err());

    let oversized = post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None).await;
    assert_eq!(oversized.status, StatusCode::CREATED);
    assert!(oversized.body.len() >= 64 * 1024 * 1024);
    assert!(oversized.body.len() < 64 * 1024 * 1024 + 1024);
    let big = json_of(&oversized);
    assert_eq!(big["status"]["user"]["username"], "bob");
    assert!(
        big["metadata"]["annotations"]["padding"]
            .as_str()
            .unwrap()
            .len()
            > 60 << 20
    );

    // Slow: the answer comes, unchanged, after the delay (no timing asserted here).
    let body = token_review("tok");
    let (slow, _) = tokio::join!(
        post(&c, TOKEN_REVIEWS_PATH, &body, None),
        api.wait_for_arrivals(Kind::TokenReview, 3),
    );
    assert_eq!(json_of(&slow)["status"]["authenticated"], json!(true));
}

#[tokio::test]
async fn held_calls_wait_for_the_gate() {
    let api = ApiServer::start().await;
    api.add_token("tok", TokenUser::new("bob"));
    let gate = api.hold(Kind::TokenReview);
    let c = proxy_client(&api);
    let pending = tokio::spawn({
        let c = c.clone();
        async move { post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None).await }
    });
    api.wait_for_arrivals(Kind::TokenReview, 1).await;
    // Other kinds are not held.
    let sar = post(&c, ACCESS_REVIEWS_PATH, &access_review("bob", "pods"), None).await;
    assert_eq!(sar.status, StatusCode::CREATED);
    assert!(api.statuses(Kind::TokenReview).is_empty());
    gate.release();
    let reply = within("the held call", pending).await.unwrap();
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(api.statuses(Kind::TokenReview), vec![201]);
}

#[tokio::test]
async fn stops_refusing_connections_and_restarts_on_the_same_port() {
    let mut api = ApiServer::start().await;
    api.add_token("tok", TokenUser::new("bob"));
    let c = proxy_client(&api);
    assert_eq!(
        post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None)
            .await
            .status,
        StatusCode::CREATED
    );
    api.stop().await;
    let refused = c
        .try_send(
            request("POST", TOKEN_REVIEWS_PATH)
                .body(crate::support::client::empty())
                .unwrap(),
        )
        .await
        .unwrap_err();
    assert!(is_connection_refused(refused.as_ref()), "{refused}");
    api.restart().await;
    let again = post(&c, TOKEN_REVIEWS_PATH, &token_review("tok"), None).await;
    assert_eq!(json_of(&again)["status"]["user"]["username"], "bob");
    assert_eq!(api.statuses(Kind::TokenReview), vec![201, 201]);
}

/// The kubeconfigs work with the client library the proxy itself uses, in both flavours.
#[tokio::test]
async fn kube_client_reads_the_kubeconfigs_and_speaks_the_wire_format() {
    let api = ApiServer::start().await;
    api.add_token("tok", TokenUser::new("bob").groups(&["g1"]));
    api.set_rules(|review| {
        Verdict::allow_when(review.user == PROXY_IDENTITY && review.subresource == "proxy")
    });
    for flavour in [Flavour::ClientCertificate, Flavour::Token] {
        let client = client_of(&api.kubeconfig(flavour)).await;
        let reviews: Api<TokenReview> = Api::all(client.clone());
        // Creates a TokenReview of `token` through kube's typed API.
        let create = |token: &str| {
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: token.to_owned(),
                    audiences: None,
                },
                ..Default::default()
            };
            let reviews = reviews.clone();
            async move { reviews.create(&PostParams::default(), &review).await }
        };
        let answered = within("kube TokenReview", create("tok")).await.unwrap();
        let status = answered.status.unwrap();
        assert_eq!(status.authenticated, Some(true));
        assert_eq!(status.user.unwrap().groups, Some(vec!["g1".to_owned()]));

        let error = within("kube empty TokenReview", create(""))
            .await
            .unwrap_err();
        match error {
            kube::Error::Api(status) => {
                assert_eq!(status.code, 400);
                assert_eq!(status.reason, "BadRequest");
            }
            other => panic!("expected a Status, got {other:?}"),
        }

        let access: Api<SubjectAccessReview> = Api::all(client);
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some("get".to_owned()),
                    version: Some("v1".to_owned()),
                    resource: Some("nodes".to_owned()),
                    subresource: Some("proxy".to_owned()),
                    name: Some("node-a".to_owned()),
                    ..Default::default()
                }),
                user: Some(PROXY_IDENTITY.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        let answered = within("kube SAR", access.create(&PostParams::default(), &review))
            .await
            .unwrap();
        assert!(answered.status.unwrap().allowed);
    }
    let callers: Vec<_> = api.calls().into_iter().map(|c| c.caller).collect();
    let certificate = Some(Caller::Certificate(PROXY_IDENTITY.to_owned()));
    assert_eq!(
        callers,
        vec![
            certificate.clone(),
            certificate.clone(),
            certificate,
            Some(Caller::Token),
            Some(Caller::Token),
            Some(Caller::Token),
        ]
    );
}

/// Connection errors a test may want to tell apart.
fn is_connection_refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<io::Error>()
            && io.kind() == io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        source = e.source();
    }
    false
}

//! Secrets never leave the proxy: at every log level (`-v=0`, `-v=4`, `-v=10`, `RUST_LOG=trace`,
//! which also turns on the libraries' own logs: hyper, h2, rustls, kube) and in both log formats,
//! with the audit log on, the real binary handles every kind of credential (valid, rejected,
//! failing and malformed bearer tokens, WebSocket subprotocol tokens, Basic credentials, client
//! certificates) while it authenticates to the API server with a token of its own; then
//! everything it wrote (stderr, stdout, the audit file) and `/metrics` are searched for each
//! token, each `Authorization` value and the serving key's PEM body.
//!
//! A token in the query string is not a credential for the kubelet (its authenticators read the
//! `Authorization` header and the WebSocket subprotocol only), so the proxy treats
//! `?access_token=` as any other query: checked here to be no credential and absent from the
//! logs and metrics; the audit event's `requestURI` records the query as the API server's audit
//! log does (see docs/SECURITY.md).

use std::ffi::OsStr;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::StatusCode;

use crate::support::TempDir;
use crate::support::apiserver::{ApiServer, Fault, Flavour, Kind, TokenUser, Verdict};
use crate::support::client::{Identity, authorized};
use crate::support::pki::CertSpec;
use crate::support::standalone::Standalone;
use crate::support::streams::websocket_with_token;

const VALID: &str = "tok-valid-0a9f2c61b7e4d3";
const REJECTED: &str = "tok-rejected-3b8e1d55c2f9";
const QUIET: &str = "tok-quiet-6c0e9a2d4f71";
const FAILING: &str = "tok-failing-7a0d4c93e1b6";
const MALFORMED_ANSWER: &str = "tok-malformed-0c1d8e2f";
const WEBSOCKET: &str = "tok-websocket-5e2b8f0c4a17";
const DOUBLE_SPACE: &str = "tok-double-space-91c7";
const QUERY: &str = "tok-in-query-4d2e7b";
/// `Basic` of `bob:s3cr3t-basic-password`.
const BASIC: &str = "Ym9iOnMzY3IzdC1iYXNpYy1wYXNzd29yZA==";

/// One run of the binary: handles every credential, stops, and returns what it printed, wrote to
/// its audit log and exposed as metrics, with the secrets it was given.
async fn run(level: &str, rust_log: Option<&str>, format: &str) -> (String, Vec<String>) {
    let api = ApiServer::start().await;
    api.add_token(VALID, TokenUser::new("bob"));
    api.add_token(WEBSOCKET, TokenUser::new("bob"));
    api.reject_token(REJECTED, "token expired");
    api.reject_token(QUIET, "");
    api.set_rules(|r| {
        if r.user == "bob" || r.user == "alice" {
            Verdict::allow()
        } else {
            Verdict::deny()
        }
    });
    let audit = TempDir::new("secrets-audit");
    let audit_file = audit.path().join("audit.log");
    let kubeconfig = api.kubeconfig(Flavour::Token);
    let args = [
        "--authentication-token-webhook".to_owned(),
        "--authorization-mode=Webhook".to_owned(),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--audit-log-path={}", audit_file.display()),
        level.to_owned(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env: Vec<(&str, &OsStr)> = rust_log
        .map(|value| ("RUST_LOG", OsStr::new(value)))
        .into_iter()
        .collect();
    let mut proxy = Standalone::start(&args, &env, format).await;
    let what = format!("{level} {rust_log:?} {format}");

    let anonymous = proxy.client(Identity::None);
    let bearer = |token: &str| authorized("/pods", &format!("Bearer {token}"));
    let ok = anonymous.send(bearer(VALID)).await;
    assert_eq!(ok.status, StatusCode::OK, "{what}: {}", ok.text());
    for token in [REJECTED, QUIET] {
        let reply = anonymous.send(bearer(token)).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{what}: {token}");
    }
    api.inject(Kind::TokenReview, Fault::Forbidden, 1);
    assert_eq!(
        anonymous.send(bearer(FAILING)).await.status,
        StatusCode::UNAUTHORIZED
    );
    api.inject(Kind::TokenReview, Fault::MalformedJson, 1);
    assert_eq!(
        anonymous.send(bearer(MALFORMED_ANSWER)).await.status,
        StatusCode::UNAUTHORIZED
    );
    // Not bearer credentials (and anonymous is off): 401 without a review.
    for value in [format!("Bearer  {DOUBLE_SPACE}"), format!("Basic {BASIC}")] {
        let reply = anonymous.send(authorized("/pods", &value)).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{what}: {value}");
    }
    let query = anonymous.get(&format!("/pods?access_token={QUERY}")).await;
    assert_eq!(
        query.status,
        StatusCode::UNAUTHORIZED,
        "{what}: query token"
    );
    let ws = proxy
        .http1_client(Identity::None)
        .send(websocket_with_token("/echo", WEBSOCKET))
        .await;
    assert_eq!(ws.status, StatusCode::OK, "{what}: {}", ws.text());
    let alice = proxy.client(Identity::of(&proxy.ca.issue(&CertSpec::client("alice"))));
    assert_eq!(alice.get("/pods").await.status, StatusCode::OK);

    let metrics = proxy.admin_get("/metrics").await.text();
    let status = proxy.stop().await;
    assert!(status.success(), "{what}: exited with {status}");
    let written = format!(
        "--- stderr\n{}\n--- stdout\n{}\n--- audit\n{}\n--- metrics\n{metrics}",
        proxy.process().stderr(),
        proxy.process().stdout(),
        std::fs::read_to_string(&audit_file).unwrap_or_default(),
    );
    let key_body: Vec<String> = proxy
        .serving_key_pem()
        .lines()
        .filter(|line| !line.starts_with("-----") && line.len() >= 16)
        .map(str::to_owned)
        .collect();
    assert!(!key_body.is_empty());
    let mut secrets: Vec<String> = [
        VALID,
        REJECTED,
        QUIET,
        FAILING,
        MALFORMED_ANSWER,
        WEBSOCKET,
        DOUBLE_SPACE,
        BASIC,
        api.caller_token(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    secrets.push(URL_SAFE_NO_PAD.encode(WEBSOCKET));
    secrets.extend(key_body);
    (written, secrets)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_key_or_authorization_value_is_written_at_any_log_level() {
    let mut runs = tokio::task::JoinSet::new();
    for format in ["text", "json"] {
        for (level, rust_log) in [
            ("-v=0", None),
            ("-v=4", None),
            ("-v=10", None),
            ("-v=0", Some("trace")),
        ] {
            runs.spawn(async move {
                let (written, secrets) = run(level, rust_log, format).await;
                (
                    format!("{level} RUST_LOG={rust_log:?} {format}"),
                    written,
                    secrets,
                )
            });
        }
    }
    let mut seen = 0;
    while let Some(run) = runs.join_next().await {
        let (what, written, secrets) = run.unwrap();
        seen += 1;
        for secret in &secrets {
            assert!(
                !written.contains(secret.as_str()),
                "{what}: {secret:?} was written:\n{written}"
            );
        }
        // The query token is no credential and stays out of logs and metrics; the audit
        // event's requestURI carries the query as the API server's does.
        let (logs, audit_and_metrics) = written.split_once("--- audit").unwrap();
        if what.contains("trace") {
            assert!(
                logs.contains("rustls") && logs.contains("h2::") && logs.contains("hyper"),
                "{what}: RUST_LOG=trace turns the libraries' logs on"
            );
        }
        assert!(
            !logs.contains(QUERY),
            "{what}: the query token was logged:\n{logs}"
        );
        assert!(
            audit_and_metrics.contains(&format!("access_token={QUERY}")),
            "{what}: the audit log records the request URI"
        );
        assert!(
            !audit_and_metrics
                .split_once("--- metrics")
                .unwrap()
                .1
                .contains(QUERY),
            "{what}: the query token is in the metrics"
        );
        // The verbose runs logged about the very requests that carried the secrets: the output
        // was looked at where a careless implementation would print them.
        if !what.starts_with("-v=0 RUST_LOG=None") {
            assert!(
                logs.contains("authentication failed") && logs.contains("allowed"),
                "{what}: expected a verbose log of the decisions, got:\n{logs}"
            );
        }
    }
    assert_eq!(seen, 8);
}

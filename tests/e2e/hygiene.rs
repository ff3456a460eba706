//! What a caller says about identity, method or protocol never reaches the kubelet in any
//! spelling: identity headers written with `_` for `-`, method-override headers, and `Upgrade` on
//! any request but an exec, attach or portForward handshake (a tunnel there would carry raw
//! requests past the proxy's authorization). The stand-in kubelet's echo shows what arrived.

use http::StatusCode;

use crate::support::client::{Identity, empty, request};
use crate::support::harness::ProxySpec;
use crate::support::pki::CertSpec;

#[tokio::test]
async fn lookalike_identity_and_method_override_headers_are_removed() {
    let h = ProxySpec::always_allow(&["--forward-identity-headers"])
        .start()
        .await;
    let alice = h.ca.issue(&CertSpec::client("alice").org("devs"));
    let client = h.http1_client(Identity::of(&alice));
    let reply = client
        .send(
            request("GET", "/echo")
                .header("X_Remote_User", "system:admin")
                .header("X-Remote_Group", "system:masters")
                .header("Impersonate_User", "system:admin")
                .header("X-HTTP-Method-Override", "DELETE")
                .header("X-HTTP-Method", "DELETE")
                .header("X-Method-Override", "DELETE")
                .body(empty())
                .unwrap(),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let echo = reply.echo();
    for name in echo.header_names() {
        let normal = name.replace('_', "-");
        assert!(
            !normal.starts_with("impersonate-") && !normal.contains("method"),
            "{name} reached the kubelet"
        );
    }
    assert_eq!(echo.header("x-remote-user"), vec!["alice".to_owned()]);
    assert_eq!(
        echo.header("x-remote-group"),
        vec!["devs".to_owned(), "system:authenticated".to_owned()]
    );
    assert_eq!(echo.method(), "GET");
}

#[tokio::test]
async fn upgrade_is_removed_from_any_request_but_an_exec_attach_or_port_forward_handshake() {
    let h = ProxySpec::always_allow(&[]).start().await;
    let client = h.http1_user("bob");
    for protocol in ["websocket", "h2c", "SPDY/3.1"] {
        let reply = client
            .send(
                request("GET", "/echo")
                    .header("connection", "Upgrade")
                    .header("upgrade", protocol)
                    .body(empty())
                    .unwrap(),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{protocol}: {}", reply.text());
        let echo = reply.echo();
        assert_eq!(echo.header("upgrade"), Vec::<String>::new(), "{protocol}");
        assert_eq!(
            echo.header("connection"),
            Vec::<String>::new(),
            "{protocol}"
        );
    }
}

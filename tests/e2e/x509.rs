//! x509 client-certificate authentication, cases X1–X15 of `docs/COMPATIBILITY.md`, and
//! anonymous access, as the kubelet sees the result: with `--forward-identity-headers` the stand-in
//! kubelet's echo shows X-Remote-User, X-Remote-Uid, X-Remote-Group and X-Remote-Extra-*.

use std::collections::BTreeMap;

use crate::support::answers::assert_unauthorized;
use crate::support::client::{ForwardedIdentity, Identity, Reply, empty, request};
use crate::support::harness::{Harness, ProxySpec};
use crate::support::pki::{
    Authority, BMP_STRING, COMMON_NAME_OID, CertSpec, Issued, OCTET_STRING, ORGANIZATION_OID,
    T61_STRING, UTF8_STRING, Usage, Validity, sha256_hex,
};

const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// The setting of the x509 cases in `docs/COMPATIBILITY.md`: client CA = the test root, anonymous
/// on.
async fn proxy() -> Harness {
    ProxySpec::always_allow(&["--anonymous-auth", "--forward-identity-headers"])
        .start()
        .await
}

async fn call(h: &Harness, identity: Identity) -> Reply {
    h.client(identity).get("/echo").await
}

fn identity(name: &str, uid: &str, groups: &[&str], leaf: &[u8]) -> ForwardedIdentity {
    ForwardedIdentity {
        extra: BTreeMap::from([(
            CREDENTIAL_ID.to_owned(),
            vec![format!("X509SHA256={}", sha256_hex(leaf))],
        )]),
        ..ForwardedIdentity::new(name, uid, groups)
    }
}

/// Asserts that a request with `cert` reaches the kubelet as `name` with `uid` in `groups`, the
/// certificate's hash as its credential id.
async fn assert_seen_as(h: &Harness, cert: &Issued, name: &str, uid: &str, groups: &[&str]) {
    let seen = call(h, Identity::of(cert)).await.echo().identity();
    assert_eq!(seen, identity(name, uid, groups, cert.leaf()));
}

fn anonymous_identity() -> ForwardedIdentity {
    ForwardedIdentity {
        user: vec!["system:anonymous".to_owned()],
        uid: vec![],
        groups: vec!["system:unauthenticated".to_owned()],
        extra: BTreeMap::new(),
    }
}

#[tokio::test]
async fn x1_cn_and_organizations_become_user_and_groups() {
    let h = proxy().await;
    let cert = h.ca.issue(&CertSpec::client("alice").org("a").org("b"));
    assert_seen_as(&h, &cert, "alice", "", &["a", "b", "system:authenticated"]).await;
}

#[tokio::test]
async fn x2_no_extended_key_usage_is_accepted() {
    let h = proxy().await;
    let cert =
        h.ca.issue(&CertSpec::client("bob").usage(Usage::Unrestricted));
    assert_seen_as(&h, &cert, "bob", "", &["system:authenticated"]).await;
}

#[tokio::test]
async fn x3_server_auth_only_is_401_even_with_anonymous() {
    let h = proxy().await;
    let cert =
        h.ca.issue(&CertSpec::client("carol").usage(Usage::ServerAuth));
    assert_unauthorized(&call(&h, Identity::of(&cert)).await, "serverAuth-only leaf");
}

#[tokio::test]
async fn x4_leaf_from_intermediate_with_chain_is_accepted() {
    let h = proxy().await;
    let intermediate = h.ca.intermediate("e2e intermediate CA");
    let cert = intermediate.issue(&CertSpec::client("dave").org("ops"));
    assert_eq!(cert.chain.len(), 2, "leaf and intermediate are sent");
    assert_seen_as(&h, &cert, "dave", "", &["ops", "system:authenticated"]).await;
}

#[tokio::test]
async fn x5_leaf_from_intermediate_without_chain_is_401() {
    let h = proxy().await;
    let intermediate = h.ca.intermediate("e2e intermediate CA");
    let cert = intermediate.issue(&CertSpec::client("dave"));
    assert_unauthorized(
        &call(&h, Identity::leaf_only(&cert)).await,
        "leaf without its intermediate",
    );
}

#[tokio::test]
async fn x6_expired_and_not_yet_valid_are_401() {
    let h = proxy().await;
    for validity in [Validity::Expired, Validity::NotYetValid] {
        let cert = h.ca.issue(&CertSpec::client("erin").validity(validity));
        assert_unauthorized(
            &call(&h, Identity::of(&cert)).await,
            &format!("{validity:?}"),
        );
    }
}

#[tokio::test]
async fn x7_unknown_ca_is_401_even_with_anonymous() {
    let h = proxy().await;
    let stranger = Authority::root("someone else's CA");
    let cert = stranger.issue(&CertSpec::client("mallory").org("system:masters"));
    assert_unauthorized(&call(&h, Identity::of(&cert)).await, "unknown CA");
}

#[tokio::test]
async fn x8_empty_or_missing_common_name_is_anonymous() {
    let h = proxy().await;
    for spec in [
        CertSpec::client("").org("ops"),
        CertSpec::client("x").without_common_name().org("ops"),
    ] {
        let cert = h.ca.issue(&spec);
        let seen = call(&h, Identity::of(&cert)).await.echo().identity();
        assert_eq!(seen, anonymous_identity(), "{spec:?}");
    }
}

#[tokio::test]
async fn x9_two_uid_attributes_are_401() {
    let h = proxy().await;
    let cert = h.ca.issue(&CertSpec::client("frank").uid("u-1").uid("u-2"));
    assert_unauthorized(&call(&h, Identity::of(&cert)).await, "two UID attributes");
}

#[tokio::test]
async fn x10_one_uid_attribute_is_the_uid() {
    let h = proxy().await;
    let cert = h.ca.issue(&CertSpec::client("grace").uid("u-1"));
    assert_seen_as(&h, &cert, "grace", "u-1", &["system:authenticated"]).await;
}

#[tokio::test]
async fn x11_node_certificate_is_a_node_identity() {
    let h = proxy().await;
    let cert =
        h.ca.issue(&CertSpec::client("system:node:n1").org("system:nodes"));
    assert_seen_as(
        &h,
        &cert,
        "system:node:n1",
        "",
        &["system:nodes", "system:authenticated"],
    )
    .await;
}

#[tokio::test]
async fn x12_system_anonymous_cn_gets_no_authenticated_group() {
    let h = proxy().await;
    let cert = h.ca.issue(&CertSpec::client("system:anonymous"));
    assert_seen_as(&h, &cert, "system:anonymous", "", &[]).await;
}

/// BMPString "nobody", as a subject value.
const NOBODY_BMP: &[u8] = b"\x00n\x00o\x00b\x00o\x00d\x00y";

#[tokio::test]
async fn x13_the_last_common_name_wins_whatever_its_string_type() {
    let h = proxy().await;
    let cert =
        h.ca.issue(&CertSpec::client("reader").attribute(COMMON_NAME_OID, BMP_STRING, NOBODY_BMP));
    assert_seen_as(&h, &cert, "nobody", "", &["system:authenticated"]).await;
}

#[tokio::test]
async fn x14_t61_and_bmp_organizations_are_groups_decoded_as_go_does() {
    let h = proxy().await;
    let cert = h.ca.issue(
        &CertSpec::client("heidi")
            .attribute(ORGANIZATION_OID, T61_STRING, b"Jos\xe9")
            .attribute(ORGANIZATION_OID, BMP_STRING, NOBODY_BMP),
    );
    assert_seen_as(
        &h,
        &cert,
        "heidi",
        "",
        &["José", "nobody", "system:authenticated"],
    )
    .await;
}

#[tokio::test]
async fn x15_a_subject_value_go_cannot_read_is_401_even_with_anonymous() {
    let h = proxy().await;
    for (what, tag, value) in [
        ("an OCTET STRING", OCTET_STRING, &b"nobody"[..]),
        ("a BMPString of odd length", BMP_STRING, &b"\x00n\x00"[..]),
        ("invalid UTF-8", UTF8_STRING, &b"\xff"[..]),
    ] {
        let cert =
            h.ca.issue(&CertSpec::client("ivan").attribute(ORGANIZATION_OID, tag, value));
        assert_unauthorized(&call(&h, Identity::of(&cert)).await, what);
    }
}

#[tokio::test]
async fn x16_any_extended_key_usage_is_accepted() {
    let h = proxy().await;
    let cert = h.ca.issue(&CertSpec::client("bob").usage(Usage::Any));
    assert_seen_as(&h, &cert, "bob", "", &["system:authenticated"]).await;
}

#[tokio::test]
async fn x17_a_ca_certificate_used_as_a_leaf_is_401_where_go_accepts_it() {
    let h = proxy().await;
    let cert = h.ca.issue(&CertSpec::client("mallory").ca());
    assert_unauthorized(&call(&h, Identity::of(&cert)).await, "CA:TRUE leaf");
}

#[tokio::test]
async fn valid_certificate_with_wrong_private_key_never_authenticates() {
    let h = proxy().await;
    let cert = h.ca.issue(&CertSpec::client("alice").org("system:masters"));
    // Sanity: the same certificate with its own key is alice.
    let own = call(&h, Identity::of(&cert)).await.echo().identity();
    assert_eq!(own.user, ["alice"]);

    let thief = h.client(Identity::wrong_key(&cert));
    match thief
        .try_send(request("GET", "/echo").body(empty()).unwrap())
        .await
    {
        // The handshake signature does not verify: the server aborts the handshake (with TLS 1.3
        // the client may only notice on its first read).
        Err(_) => {}
        Ok(reply) => assert_unauthorized(&reply, "certificate presented with another key"),
    }
}

#[tokio::test]
async fn anonymous_off_is_401_without_certificate() {
    let h = ProxySpec::always_allow(&[]).start().await;
    let reply = h.anonymous().get("/echo").await;
    assert_unauthorized(&reply, "no certificate, anonymous off (default)");
}

#[tokio::test]
async fn anonymous_on_is_system_anonymous_never_authenticated() {
    let h = proxy().await;
    let seen = h.anonymous().get("/echo").await.echo().identity();
    assert_eq!(seen, anonymous_identity());
    assert!(!seen.groups.iter().any(|g| g == "system:authenticated"));
}

#[tokio::test]
async fn identity_headers_only_with_the_flag() {
    let h = ProxySpec::always_allow(&[]).start().await;
    let echo = h.user("alice", &["ops"]).get("/echo").await.echo();
    let names = echo.header_names();
    assert!(
        !names.iter().any(|n| n.starts_with("x-remote-")),
        "no identity header without --forward-identity-headers: {names:?}"
    );
}

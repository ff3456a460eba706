//! `--authentication-config` without a real API server: the stand-in OIDC provider
//! (`support::issuer`) and the stand-in API server, with the file of
//! `real_apiserver_authn_config.rs` (three issuers between them using every rule and mapping
//! form; anonymous access on `/healthz` and `/livez` only). The users expected here are written
//! from kube-apiserver v1.36's semantics (k8s.io/apiserver
//! `plugin/pkg/authenticator/token/oidc/oidc.go` over go-oidc: prefixes prepended, `email` only
//! while `email_verified` is absent or true, a missing username or uid claim refusing the token,
//! empty extras left out, `authentication.kubernetes.io/credential-id` `JTI=<jti>` for a string
//! `jti`, `system:authenticated` added; `exp` without leeway, `nbf` with a minute, `iat` not
//! checked), as `real_apiserver_authn_config.rs` observes them on the real one.
//!
//! A token of a configured issuer never becomes a TokenReview, whatever its fate (its issuer's
//! keys out of reach included); a token of another issuer still does. Keys rotate (a new key id is fetched and honoured; a withdrawn key
//! is refused once the set was fetched again; invented key ids cost the issuer no storm of
//! fetches), and the file is reloaded when it changes, a broken file keeping the last good one in
//! force.

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::json;

use kubelet_auth_proxy::authn::structured::keys::REFETCH_COOLDOWN;

use crate::real_apiserver_authn_config::{Keys, Mint, authentication_config};
use crate::support::apiserver::{ApiServer, Kind, TokenUser};
use crate::support::client::ForwardedIdentity;
use crate::support::harness::{Harness, ProxySpec};
use crate::support::issuer::{Key, StandInIssuer, sign_hs256, with_wrong_signature};
use crate::support::{TempDir, eventually, eventually_within};

/// The proxy's own count of calls to the API server, by kind.
const CALLS: &str = "kubelet_auth_proxy_apiserver_calls_total";
/// Reloads of each file the proxy watches, by target and result.
const RELOADS: &str = "kubelet_auth_proxy_config_reloads_total";
/// The reload target of `--authentication-config`.
const TARGET: &str = "authentication_config";
/// kube-apiserver's reload count of the file, by status, under the proxy's prefix.
const CONFIG_RELOADS: &str =
    "kubelet_auth_proxy_authentication_config_controller_automatic_reloads_total";
/// How long a key the issuer published may take to be honoured: a fetch for an unknown key id
/// waits out the cooldown since the last one.
const KEY_PICKUP: Duration = Duration::from_secs(60);

/// The stand-ins and a proxy with the file, TokenReviews going to the stand-in API server, the
/// identity it decided forwarded to the stand-in kubelet.
struct Setup {
    issuer: StandInIssuer,
    keys: Keys,
    api: ApiServer,
    files: TempDir,
    proxy: Harness,
}

impl Setup {
    /// With the file of `real_apiserver_authn_config.rs`.
    async fn start() -> Setup {
        Setup::start_with(authentication_config).await
    }

    /// With the file `config` writes for the stand-in issuer.
    async fn start_with(config: impl Fn(&StandInIssuer) -> String) -> Setup {
        let issuer = StandInIssuer::start(&["a", "b", "c", "d"]).await;
        let keys = Keys::publish(&issuer);
        let api = ApiServer::start_allowing().await;
        let files = TempDir::new("jwt-authenticators");
        let config = files.write("authentication-config.yaml", config(&issuer));
        let proxy = ProxySpec::always_allow(&[
            &format!("--authentication-config={}", config.display()),
            "--authentication-token-webhook",
            "--forward-identity-headers",
        ])
        .apiserver(&api)
        .start()
        .await;
        let setup = Setup {
            issuer,
            keys,
            api,
            files,
            proxy,
        };
        // The keys are fetched in the background; until then the issuers' tokens are refused.
        eventually_within(KEY_PICKUP, "the issuers' keys fetched", || async {
            let mint = setup.mint();
            for token in [mint.a(json!({})), mint.b(json!({})), mint.c(json!({}))] {
                if setup.status(&token).await != StatusCode::OK {
                    return None;
                }
            }
            Some(())
        })
        .await;
        setup
    }

    fn mint(&self) -> Mint<'_> {
        Mint::new(&self.issuer, &self.keys)
    }

    /// The status of `GET /echo` with `token`.
    async fn status(&self, token: &str) -> StatusCode {
        self.proxy.bearer_get("/echo", token).await.status
    }

    /// The identity the proxy forwarded for `token`, which it must serve.
    async fn identity(&self, token: &str) -> ForwardedIdentity {
        self.proxy
            .bearer_get("/echo", token)
            .await
            .echo()
            .identity()
    }

    /// TokenReviews that reached the stand-in API server.
    fn reviews(&self) -> usize {
        self.api.arrivals(Kind::TokenReview)
    }
}

/// What the proxy forwards for `name` with `uid` in `groups` and `extra`.
fn user(name: &str, uid: &str, groups: &[&str], extra: &[(&str, &[&str])]) -> ForwardedIdentity {
    ForwardedIdentity {
        extra: extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.iter().map(|v| (*v).to_owned()).collect()))
            .collect(),
        ..ForwardedIdentity::new(name, uid, groups)
    }
}

const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

#[tokio::test]
async fn tokens_of_configured_issuers_are_mapped_on_the_node_and_never_reviewed() {
    let s = Setup::start().await;
    let m = s.mint();
    let alice = |groups: &[&str], jti: bool| {
        let mut extra: Vec<(&str, &[&str])> = vec![("example.com/tenant", &["kap"])];
        if jti {
            extra.push((CREDENTIAL_ID, &["JTI=jti-alice"]));
        }
        user("a:alice", "uid-alice", groups, &extra)
    };
    let bob = || {
        user(
            "bob@example.com",
            "",
            &["viewer", "editor", "system:authenticated"],
            &[],
        )
    };
    let served = [
        (
            "a: claims with prefixes, uid claim, extra, jti",
            m.a(json!({})),
            alice(&["a:dev", "a:ops", "system:authenticated"], true),
        ),
        (
            "a: PS256",
            m.a_signed("PS256"),
            alice(&["a:dev", "a:ops", "system:authenticated"], true),
        ),
        (
            "a: ES256 with the second key",
            s.keys.a_ec.token(&m.a_claims(json!({}))),
            alice(&["a:dev", "a:ops", "system:authenticated"], true),
        ),
        (
            "a: groups a string",
            m.a(json!({"groups": "dev"})),
            alice(&["a:dev", "system:authenticated"], true),
        ),
        (
            "a: no groups",
            m.a(json!({"groups": null})),
            alice(&["system:authenticated"], true),
        ),
        (
            "a: jti a number: no credential id",
            m.a(json!({"jti": 7})),
            alice(&["a:dev", "a:ops", "system:authenticated"], false),
        ),
        (
            "a: nbf within the minute of leeway",
            m.a(json!({"nbf": m.now + 45})),
            alice(&["a:dev", "a:ops", "system:authenticated"], true),
        ),
        (
            "a: iat in the future",
            m.a(json!({"iat": m.now + 600})),
            alice(&["a:dev", "a:ops", "system:authenticated"], true),
        ),
        ("b: email, verified", m.b(json!({})), bob()),
        (
            "b: email, email_verified absent",
            m.b(json!({"email_verified": null})),
            bob(),
        ),
        (
            "b: second audience (MatchAny), roles a string",
            m.b(json!({"aud": ["kap-b2"], "roles": "viewer"})),
            user(
                "bob@example.com",
                "",
                &["viewer", "system:authenticated"],
                &[],
            ),
        ),
        (
            "c: CEL over nested claims",
            m.c(json!({})),
            user(
                "c:carol",
                "carol-uid",
                &["team:red", "team:blue", "system:authenticated"],
                &[
                    ("example.com/level", &["3"]),
                    ("example.com/teams", &["red", "blue"]),
                ],
            ),
        ),
        (
            "c: empty extras left out",
            m.c(json!({"profile": {"handle": "carol"}})),
            user("c:carol", "carol-uid", &["system:authenticated"], &[]),
        ),
    ];
    for (case, token, expected) in &served {
        assert_eq!(&s.identity(token).await, expected, "{case}");
    }

    let refused = [
        ("a: sub missing", m.a(json!({"sub": null}))),
        ("a: sub a number", m.a(json!({"sub": 42}))),
        ("a: uid claim missing", m.a(json!({"sid": null}))),
        ("a: requiredValue not met", m.a(json!({"tenant": "other"}))),
        ("a: groups a number", m.a(json!({"groups": 5}))),
        ("a: wrong audience", m.a(json!({"aud": "other"}))),
        (
            "a: expired five seconds ago",
            m.a(json!({"exp": m.now - 5})),
        ),
        ("a: no exp", m.a(json!({"exp": null}))),
        ("a: nbf two minutes ahead", m.a(json!({"nbf": m.now + 120}))),
        ("a: wrong signature", with_wrong_signature(&m.a(json!({})))),
        (
            "a: HS256",
            sign_hs256(
                &json!({"alg": "HS256", "kid": "a-rsa"}),
                &m.a_claims(json!({})),
                b"not a secret",
            ),
        ),
        (
            "a: signed by b's key",
            s.keys.b.token(&m.a_claims(json!({}))),
        ),
        (
            "b: email_verified false",
            m.b(json!({"email_verified": false})),
        ),
        (
            "b: email_verified a string",
            m.b(json!({"email_verified": "true"})),
        ),
        ("b: claim rule fails", m.b(json!({"org": "blocked"}))),
        ("b: no audience of the two", m.b(json!({"aud": ["x"]}))),
        (
            "c: username expression fails",
            m.c(json!({"profile": {"teams": ["red"]}})),
        ),
        (
            "c: user rule fails",
            m.c(json!({"profile": {"handle": "system-x"}})),
        ),
        (
            "c: second user rule fails",
            m.c(json!({"profile": {"handle": "carol", "teams": ["banned"]}})),
        ),
    ];
    for (case, token) in &refused {
        assert_eq!(s.status(token).await, StatusCode::UNAUTHORIZED, "{case}");
    }
    assert_eq!(
        s.reviews(),
        0,
        "TokenReviews for {} tokens of configured issuers",
        served.len() + refused.len()
    );
    assert_eq!(s.proxy.metric(CALLS, &[("kind", "TokenReview")]).await, 0.0);

    // A token of an issuer the file does not name is the API server's to decide.
    let dave = m.d();
    s.api
        .add_token(&dave, TokenUser::new("dave").groups(&["d-team"]));
    assert_eq!(
        s.identity(&dave).await,
        user("dave", "", &["d-team", "system:authenticated"], &[])
    );
    assert_eq!(s.reviews(), 1, "the unconfigured issuer's token reviewed");
    s.proxy.shutdown().await;
}

#[tokio::test]
async fn anonymous_requests_are_served_only_on_the_listed_paths() {
    let s = Setup::start().await;
    let anonymous = s.proxy.anonymous();
    // `/healthz` is the kubelet's own answer; `/livez` reaches the echo, which shows the user.
    assert_eq!(anonymous.get("/healthz").await.status, StatusCode::OK);
    assert_eq!(
        anonymous.get("/livez").await.echo().identity(),
        user("system:anonymous", "", &["system:unauthenticated"], &[])
    );
    assert_eq!(anonymous.get("/livez?verbose").await.status, StatusCode::OK);
    // Exact paths only.
    for path in ["/readyz", "/pods", "/livez/ping", "/healthz/"] {
        assert_eq!(
            anonymous.get(path).await.status,
            StatusCode::UNAUTHORIZED,
            "{path}"
        );
    }
    assert_eq!(s.reviews(), 0);
    s.proxy.shutdown().await;
}

#[tokio::test]
async fn a_new_key_is_picked_up_and_invented_key_ids_cost_no_storm_of_fetches() {
    let s = Setup::start().await;
    let claims = s.mint().a_claims(json!({}));

    // The issuer rotates its EC key: the new one published, the old one withdrawn.
    let next = Key::p256("a-ec-next");
    s.issuer.publish("a", &next);
    s.issuer.withdraw("a", s.keys.a_ec.kid());
    eventually_within(KEY_PICKUP, "a token of the new key served", || async {
        (s.status(&next.token(&claims)).await == StatusCode::OK).then_some(())
    })
    .await;
    // The set fetched since holds the old key no more.
    assert_eq!(
        s.status(&s.keys.a_ec.token(&claims)).await,
        StatusCode::UNAUTHORIZED,
        "a token of the withdrawn key"
    );

    // Key ids nobody published, each new.
    let fetched = s.issuer.jwks_fetches("a");
    let started = Instant::now();
    let invented = 50;
    for i in 0..invented {
        let header = json!({"alg": "ES256", "kid": format!("invented-{i}")});
        let token = s.keys.stranger.sign(&header, &claims);
        assert_eq!(s.status(&token).await, StatusCode::UNAUTHORIZED, "kid {i}");
    }
    let fetches = s.issuer.jwks_fetches("a") - fetched;
    eprintln!(
        "{invented} invented key ids in {:?}: {fetches} fetches of the keys",
        started.elapsed()
    );
    // One fetch per cooldown at most, and one more for a cooldown that started before.
    let bound =
        1 + (started.elapsed().as_secs_f64() / REFETCH_COOLDOWN.as_secs_f64()).ceil() as usize;
    assert!(
        fetches <= bound,
        "{invented} invented key ids: {fetches} fetches of the keys, bound {bound}"
    );
    assert_eq!(s.reviews(), 0);
    s.proxy.shutdown().await;
}

#[tokio::test]
async fn a_token_of_an_issuer_whose_keys_cannot_be_fetched_is_refused_not_reviewed() {
    // A fourth issuer, `e`, which the stand-in does not serve: its discovery document is 404.
    let s = Setup::start_with(|issuer| {
        let config = authentication_config(issuer);
        let e = format!(
            "- issuer:\n    url: {}\n    certificateAuthority: |\n{}    audiences: [kap-e]\n  \
             claimMappings:\n    username:\n      claim: sub\n      prefix: \"e:\"\n",
            issuer.url("e"),
            issuer
                .ca_pem()
                .lines()
                .map(|line| format!("      {line}\n"))
                .collect::<String>()
        );
        config.replacen("anonymous:\n", &format!("{e}anonymous:\n"), 1)
    })
    .await;
    eventually("the proxy to ask for e's discovery document", || async {
        (s.issuer.requests("/e/.well-known/openid-configuration") > 0).then_some(())
    })
    .await;
    let m = s.mint();
    let claims = json!({
        "iss": s.issuer.url("e"), "aud": "kap-e", "sub": "erin",
        "iat": m.now, "nbf": m.now, "exp": m.now + 600,
    });
    for token in [s.keys.stranger.token(&claims), s.keys.a_rsa.token(&claims)] {
        assert_eq!(s.status(&token).await, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(s.reviews(), 0, "TokenReviews for an issuer of the file");
    s.proxy.shutdown().await;
}

/// Issuer `a`'s username prefix in `config` set to `prefix`.
fn with_username_prefix(config: &str, prefix: &str) -> String {
    let from = "      claim: sub\n      prefix: \"a:\"";
    assert!(config.contains(from));
    config.replace(
        from,
        &format!("      claim: sub\n      prefix: \"{prefix}\""),
    )
}

#[tokio::test]
async fn the_file_is_reloaded_and_a_broken_one_keeps_the_last_good_in_force() {
    let s = Setup::start().await;
    let path = s.files.path().join("authentication-config.yaml");
    let original = authentication_config(&s.issuer);
    // One token throughout: the user remembered for it (10 s) is of one configuration only, so
    // a reload changes what it maps to at once.
    let token = s.mint().a(json!({}));
    let username = || async { s.identity(&token).await.user };
    let reloads = |target: &'static str, result: &'static str| {
        let proxy = &s.proxy;
        async move {
            proxy
                .metric(RELOADS, &[("target", target), ("result", result)])
                .await
        }
    };
    let config_reloads = |status: &'static str| {
        let proxy = &s.proxy;
        async move { proxy.metric(CONFIG_RELOADS, &[("status", status)]).await }
    };
    assert_eq!(username().await, ["a:alice"]);

    // Changed: applied.
    let applied = config_reloads("success").await;
    std::fs::write(&path, with_username_prefix(&original, "a2:")).unwrap();
    eventually("the changed file applied", || async {
        (config_reloads("success").await > applied).then_some(())
    })
    .await;
    // At once, though the token's user was remembered a moment ago.
    assert_eq!(username().await, ["a2:alice"]);

    // Broken, twice (not YAML; then a rule kube-apiserver enforces: a groups claim needs a
    // prefix, even an empty one): each reload fails and is counted, the last good file stays.
    let broken = [
        "jwt: [ this is not YAML".to_owned(),
        with_username_prefix(&original, "a3:").replace(
            "      claim: roles\n      prefix: \"\"\n",
            "      claim: roles\n",
        ),
    ];
    for file in broken {
        let (failed, refused) = (
            reloads(TARGET, "failed").await,
            config_reloads("failure").await,
        );
        std::fs::write(&path, &file).unwrap();
        eventually("the failed reload counted", || async {
            (reloads(TARGET, "failed").await > failed && config_reloads("failure").await > refused)
                .then_some(())
        })
        .await;
        assert_eq!(username().await, ["a2:alice"], "{file}");
    }

    // Fixed: applied.
    std::fs::write(&path, with_username_prefix(&original, "a3:")).unwrap();
    eventually("the fixed file applied", || async {
        (username().await == ["a3:alice"]).then_some(())
    })
    .await;
    assert_eq!(s.reviews(), 0);
    s.proxy.shutdown().await;
}

/// `check-config --probe` fetches each issuer's discovery document and keys through the file's
/// CA, as the proxy will, and names an issuer it cannot reach with the cause and a hint;
/// `check-config` alone says what the file does, warns about an unprefixed user name claim, and
/// fetches nothing.
#[tokio::test]
async fn check_config_probe_fetches_each_issuers_keys_and_names_the_ones_it_cannot() {
    use crate::support::pki::{Authority, CertSpec};
    use crate::support::process::{run, serving_flags};

    let issuer = StandInIssuer::start(&["a", "b", "c", "d"]).await;
    let _keys = Keys::publish(&issuer);
    let kubelet = kubelet_auth_proxy::tools::demo::kubelet::StandInKubelet::start(None)
        .await
        .unwrap();
    let dir = TempDir::new("jwt-authenticators-probe");
    let [cert, key] = serving_flags(
        &dir,
        &Authority::root("probe serving CA").issue(&CertSpec::server()),
    );
    let check = |config: &std::path::Path, probe: bool| {
        let mut args = vec!["check-config".to_owned()];
        if probe {
            args.push("--probe".to_owned());
        }
        args.extend([
            format!("--upstream=http://{}", kubelet.addr().unwrap()),
            cert.clone(),
            key.clone(),
            format!("--authentication-config={}", config.display()),
            "--authorization-mode=AlwaysAllow".to_owned(),
            "--node-name=node-a".to_owned(),
        ]);
        args
    };
    let good = dir.write("good.yaml", authentication_config(&issuer));
    let fetches = issuer.jwks_fetches("a");
    let done = run(&dir, "check", &check(&good, false)).await;
    done.assert_code(0);
    assert!(
        done.stdout
            .contains("--authentication-config: tokens of https://"),
        "{}",
        done.stdout
    );
    assert!(
        !done.stderr.contains("warning: --authentication-config"),
        "{}",
        done.stderr
    );
    assert_eq!(
        issuer.jwks_fetches("a"),
        fetches,
        "check-config alone fetches nothing"
    );

    // A user name claim other than email, with no prefix and no user rule: whoever sets `sub`
    // at the issuer could be named system:node:…; said at start and by check-config.
    let bare = authentication_config(&issuer).replacen(
        "      claim: sub\n      prefix: \"a:\"\n",
        "      claim: sub\n      prefix: \"\"\n",
        1,
    );
    let bare = dir.write("bare.yaml", bare);
    let done = run(&dir, "check-bare", &check(&bare, false)).await;
    done.assert_code(0);
    assert!(
        done.stderr
            .contains("warning: --authentication-config: jwt[0].claimMappings.username")
            && done.stderr.contains("system:node:"),
        "{}",
        done.stderr
    );

    let done = run(&dir, "probe", &check(&good, true)).await;
    done.assert_code(0);
    assert!(
        done.stdout.contains(&issuer.url("a")) && done.stdout.contains("verify tokens on the node"),
        "{}",
        done.stdout
    );
    assert!(
        issuer.jwks_fetches("a") > fetches,
        "the probe fetched the keys"
    );

    // The same issuers behind a CA the file does not name: each one's failure, with its cause
    // and what to do.
    let other = Authority::root("not the issuer's CA");
    let indented = |pem: &str| -> String { pem.lines().map(|l| format!("      {l}\n")).collect() };
    let wrong_ca = authentication_config(&issuer)
        .replace(&indented(&issuer.ca_pem()), &indented(&other.pem()));
    assert_ne!(wrong_ca, authentication_config(&issuer));
    let wrong = dir.write("wrong-ca.yaml", wrong_ca);
    let done = run(&dir, "probe-wrong-ca", &check(&wrong, true)).await;
    done.assert_code(2);
    assert!(
        done.stderr.contains(&issuer.url("a"))
            && done.stderr.contains("set issuer.certificateAuthority"),
        "{}",
        done.stderr
    );
}

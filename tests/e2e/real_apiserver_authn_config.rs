//! `--authentication-config` against the real kube-apiserver (v1.36): one
//! `apiserver.config.k8s.io/v1` AuthenticationConfiguration, with three JWT issuers of the
//! stand-in OIDC provider (`support::issuer`) between them using every rule and mapping form, and
//! anonymous access on listed paths, is given to a kube-apiserver started for this scenario and
//! to the proxy. Every case is asked of both: of kube-apiserver by a TokenReview (as admin; the
//! anonymous cases by requesting its own paths without a credential), of the proxy by a request
//! whose user is read back from its audit log. The proxy must authenticate exactly the user
//! kube-apiserver's TokenReview returns, and answer 401 exactly where kube-apiserver refuses; the
//! table of both answers is printed (`cargo test -- --nocapture` shows it).
//!
//! A token whose `iss` names a configured issuer is decided on the node: from the proxy's start to
//! its last answer to them, neither its own count of TokenReviews nor the API server's moves. A
//! token no authenticator of the file claims (another issuer, an `iss` one slash off, parts
//! kube-apiserver cannot decode) still goes to TokenReview, by design, once each.
//!
//! Skipped (saying so) unless `.ci/run` named the start script (see `support::real_apiserver`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::StatusCode;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};

use crate::audit_bounds::events;
use crate::support::apiserver::UNKNOWN_TOKEN_ERROR;
use crate::support::client::{Client, Identity};
use crate::support::harness::{Harness, ProxySpec};
use crate::support::issuer::{
    DISCOVERY_SUFFIX, Key, StandInIssuer, sign_hs256, unsigned, with_padding, with_unused_bits,
    with_wrong_signature,
};
use crate::support::real_apiserver::{DedicatedApiServer, apiserver_metric, start_script};
use crate::support::{TempDir, eventually, eventually_within};

const SCENARIO: &str = "authentication config";
/// The proxy's own count of calls to the API server, by kind.
const CALLS: &str = "kubelet_auth_proxy_apiserver_calls_total";

/// The issuers the stand-in serves; the first three are in the file, `d` is not.
const ISSUERS: &[&str] = &["a", "b", "c", "d"];

/// The paths anonymous requests may reach (the file's `anonymous.conditions`).
const ANONYMOUS_PATHS: &[&str] = &["/healthz", "/livez"];

/// The AuthenticationConfiguration: issuer `a` with claim mappings and prefixes, a
/// `requiredValue` rule, a uid claim and an extra from a claim; issuer `b` (found through a
/// `discoveryURL`, two audiences with `MatchAny`) with the `email` username claim and groups from a
/// claim, both with an empty prefix, and an expression rule; issuer `c` with CEL for every
/// mapping (nested claims, lists) and user validation rules. Anonymous only on
/// [`ANONYMOUS_PATHS`].
pub fn authentication_config(issuer: &StandInIssuer) -> String {
    let ca: String = issuer
        .ca_pem()
        .lines()
        .map(|line| format!("      {line}\n"))
        .collect();
    let conditions: String = ANONYMOUS_PATHS
        .iter()
        .map(|path| format!("  - path: {path}\n"))
        .collect();
    format!(
        r#"apiVersion: apiserver.config.k8s.io/v1
kind: AuthenticationConfiguration
jwt:
- issuer:
    url: {a}
    certificateAuthority: |
{ca}    audiences: [kap-a]
  claimValidationRules:
  - claim: tenant
    requiredValue: kap
  claimMappings:
    username:
      claim: sub
      prefix: "a:"
    groups:
      claim: groups
      prefix: "a:"
    uid:
      claim: sid
    extra:
    - key: example.com/tenant
      valueExpression: claims.tenant
- issuer:
    url: {b}
    discoveryURL: {b_discovery}
    certificateAuthority: |
{ca}    audiences: [kap-b, kap-b2]
    audienceMatchPolicy: MatchAny
  claimValidationRules:
  - expression: "!has(claims.org) || claims.org != 'blocked'"
    message: the organization is blocked
  claimMappings:
    username:
      claim: email
      prefix: ""
    groups:
      claim: roles
      prefix: ""
- issuer:
    url: {c}
    certificateAuthority: |
{ca}    audiences: [kap-c]
  claimValidationRules:
  - expression: has(claims.profile)
    message: a profile is required
  claimMappings:
    username:
      expression: "'c:' + claims.profile.handle"
    groups:
      expression: "has(claims.profile.teams) ? claims.profile.teams.map(t, 'team:' + t) : []"
    uid:
      expression: claims.sub
    extra:
    - key: example.com/level
      valueExpression: "has(claims.profile.level) ? string(claims.profile.level) : ''"
    - key: example.com/teams
      valueExpression: "has(claims.profile.teams) ? claims.profile.teams : []"
  userValidationRules:
  - expression: "!user.username.startsWith('c:system')"
    message: the username is reserved
  - expression: "!('team:banned' in user.groups)"
    message: the team is banned
anonymous:
  enabled: true
  conditions:
{conditions}"#,
        a = issuer.url("a"),
        b = issuer.url("b"),
        b_discovery = issuer.discovery_url("b"),
        c = issuer.url("c"),
    )
}

/// The keys the stand-in publishes (and one it never does).
pub struct Keys {
    /// Issuer `a`'s RSA key (RS256, PS256).
    pub a_rsa: Key,
    /// Issuer `a`'s P-256 key (ES256).
    pub a_ec: Key,
    /// Issuer `b`'s P-384 key (ES384).
    pub b: Key,
    /// Issuer `c`'s P-256 key.
    pub c: Key,
    /// The unconfigured issuer `d`'s key.
    pub d: Key,
    /// Published by nobody.
    pub stranger: Key,
}

impl Keys {
    /// Fresh EC keys, the RSA fixture, all published where they belong.
    pub fn publish(issuer: &StandInIssuer) -> Keys {
        let keys = Keys {
            a_rsa: Key::rsa("a-rsa"),
            a_ec: Key::p256("a-ec"),
            b: Key::p384("b-p384"),
            c: Key::p256("c-p256"),
            d: Key::p256("d-p256"),
            stranger: Key::p256("stranger"),
        };
        issuer.publish("a", &keys.a_rsa);
        issuer.publish("a", &keys.a_ec);
        issuer.publish("b", &keys.b);
        issuer.publish("c", &keys.c);
        issuer.publish("d", &keys.d);
        keys
    }
}

/// Mints the scenario's tokens at one moment.
pub struct Mint<'a> {
    pub issuer: &'a StandInIssuer,
    pub keys: &'a Keys,
    /// Seconds since the epoch.
    pub now: i64,
}

/// `base` with the members of `changes` set, and those set to `null` removed.
fn merged(mut base: Value, changes: Value) -> Value {
    let object = base.as_object_mut().unwrap();
    for (name, value) in changes.as_object().unwrap() {
        if value.is_null() {
            object.remove(name);
        } else {
            object.insert(name.clone(), value.clone());
        }
    }
    base
}

impl Mint<'_> {
    /// Now, for the tokens minted from here on.
    pub fn new<'a>(issuer: &'a StandInIssuer, keys: &'a Keys) -> Mint<'a> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        Mint {
            issuer,
            keys,
            now: i64::try_from(now).unwrap(),
        }
    }

    /// Issued now, valid ten minutes, by `issuer`, with `claims`.
    fn claims(&self, issuer: &str, claims: Value) -> Value {
        let times = json!({
            "iss": self.issuer.url(issuer),
            "iat": self.now, "nbf": self.now, "exp": self.now + 600,
        });
        merged(times, claims)
    }

    /// Issuer `a`'s claims for alice, changed by `changes`.
    pub fn a_claims(&self, changes: Value) -> Value {
        let base = self.claims(
            "a",
            json!({
                "aud": "kap-a", "sub": "alice", "sid": "uid-alice", "tenant": "kap",
                "groups": ["dev", "ops"], "jti": "jti-alice",
            }),
        );
        merged(base, changes)
    }

    /// Alice's token of issuer `a` (RS256), changed by `changes`.
    pub fn a(&self, changes: Value) -> String {
        self.keys.a_rsa.token(&self.a_claims(changes))
    }

    /// Alice's token of issuer `a` signed with the RSA key under `alg`.
    pub fn a_signed(&self, alg: &str) -> String {
        let header = json!({"alg": alg, "kid": self.keys.a_rsa.kid(), "typ": "JWT"});
        self.keys.a_rsa.sign(&header, &self.a_claims(json!({})))
    }

    /// Issuer `b`'s claims for bob, changed by `changes`.
    pub fn b_claims(&self, changes: Value) -> Value {
        let base = self.claims(
            "b",
            json!({
                "aud": ["kap-b"], "sub": "bob", "email": "bob@example.com",
                "email_verified": true, "roles": ["viewer", "editor"],
            }),
        );
        merged(base, changes)
    }

    /// Bob's token of issuer `b` (ES384), changed by `changes`.
    pub fn b(&self, changes: Value) -> String {
        self.keys.b.token(&self.b_claims(changes))
    }

    /// Issuer `c`'s claims for carol, changed by `changes`.
    pub fn c_claims(&self, changes: Value) -> Value {
        let base = self.claims(
            "c",
            json!({
                "aud": "kap-c", "sub": "carol-uid",
                "profile": {"handle": "carol", "teams": ["red", "blue"], "level": 3},
            }),
        );
        merged(base, changes)
    }

    /// Carol's token of issuer `c` (ES256), changed by `changes`.
    pub fn c(&self, changes: Value) -> String {
        self.keys.c.token(&self.c_claims(changes))
    }

    /// A token of the issuer `d`, which the file does not name.
    pub fn d(&self) -> String {
        let claims = self.claims("d", json!({"aud": "kap-d", "sub": "dave"}));
        self.keys.d.token(&claims)
    }
}

/// How a case is presented.
pub enum Probe {
    /// This bearer token.
    Token(fn(&Mint<'_>) -> String),
    /// No credential, on this path.
    Anonymous(&'static str),
}

/// One row of the table.
pub struct Case {
    pub name: &'static str,
    pub probe: Probe,
    /// Whether an authenticator of the file claims it (its `iss`, once decoded, is one of the
    /// file's issuers): then no TokenReview may be sent for it. Anonymous requests send none
    /// either.
    pub configured: bool,
}

fn token(name: &'static str, mint: fn(&Mint<'_>) -> String) -> Case {
    Case {
        name,
        probe: Probe::Token(mint),
        configured: true,
    }
}

/// Every case, in the table's order.
pub fn cases() -> Vec<Case> {
    let mut cases = vec![
        // Issuer a: claims with prefixes, the requiredValue rule, uid claim, extra, credential id.
        token("a: RS256, groups array, jti", |m| m.a(json!({}))),
        token("a: PS256", |m| m.a_signed("PS256")),
        token("a: RS384", |m| m.a_signed("RS384")),
        token("a: RS512", |m| m.a_signed("RS512")),
        token("a: PS384", |m| m.a_signed("PS384")),
        token("a: PS512", |m| m.a_signed("PS512")),
        token("a: ES256 (second key)", |m| {
            m.keys.a_ec.token(&m.a_claims(json!({})))
        }),
        token("a: no kid header", |m| {
            m.keys
                .a_rsa
                .sign(&json!({"alg": "RS256"}), &m.a_claims(json!({})))
        }),
        token("a: groups a string", |m| m.a(json!({"groups": "dev"}))),
        token("a: groups empty", |m| m.a(json!({"groups": []}))),
        token("a: groups missing", |m| m.a(json!({"groups": null}))),
        token("a: groups with a duplicate", |m| {
            m.a(json!({"groups": ["dev", "dev"]}))
        }),
        token("a: groups a number", |m| m.a(json!({"groups": 5}))),
        token("a: groups mixed", |m| m.a(json!({"groups": ["x", 5]}))),
        token("a: no jti", |m| m.a(json!({"jti": null}))),
        token("a: jti a number", |m| m.a(json!({"jti": 7}))),
        token("a: jti empty", |m| m.a(json!({"jti": ""}))),
        token("a: sub missing", |m| m.a(json!({"sub": null}))),
        token("a: sub a number", |m| m.a(json!({"sub": 42}))),
        token("a: sub empty", |m| m.a(json!({"sub": ""}))),
        token("a: sub twice, alice last", |m| {
            let claims = m.a_claims(json!({"sub": null})).to_string();
            let claims = format!(
                r#"{{"sub":"mallory",{},"sub":"alice"}}"#,
                &claims[1..claims.len() - 1]
            );
            m.keys
                .a_rsa
                .sign_text(&m.keys.a_rsa.header().to_string(), &claims)
        }),
        token("a: sid (uid claim) missing", |m| m.a(json!({"sid": null}))),
        token("a: tenant wrong (requiredValue)", |m| {
            m.a(json!({"tenant": "other"}))
        }),
        token("a: tenant missing", |m| m.a(json!({"tenant": null}))),
        token("a: tenant a number (extra)", |m| m.a(json!({"tenant": 5}))),
        token("a: tenant an array", |m| m.a(json!({"tenant": ["kap"]}))),
        token("a: aud array with kap-a", |m| {
            m.a(json!({"aud": ["kap-a"]}))
        }),
        token("a: aud other and kap-a", |m| {
            m.a(json!({"aud": ["other", "kap-a"]}))
        }),
        token("a: aud wrong", |m| m.a(json!({"aud": "other"}))),
        token("a: aud missing", |m| m.a(json!({"aud": null}))),
        token("a: aud a number", |m| m.a(json!({"aud": 5}))),
        // Times.
        // Times: each token is minted just before it is presented, so a case refused for its
        // nbf has a minute or more to reach the verifier before its answer could change, and the
        // other cases' answers cannot change as time passes.
        token("a: exp now-5s", |m| m.a(json!({"exp": m.now - 5}))),
        token("a: exp now-2min", |m| m.a(json!({"exp": m.now - 120}))),
        token("a: exp missing", |m| m.a(json!({"exp": null}))),
        token("a: exp a numeric string", |m| {
            m.a(json!({"exp": (m.now + 600).to_string()}))
        }),
        token("a: exp fractional", |m| {
            m.a(json!({"exp": m.now as f64 + 600.5}))
        }),
        token("a: nbf now+45s", |m| m.a(json!({"nbf": m.now + 45}))),
        token("a: nbf now+2min", |m| m.a(json!({"nbf": m.now + 120}))),
        token("a: nbf now+6min", |m| m.a(json!({"nbf": m.now + 360}))),
        token("a: iat now+10min", |m| m.a(json!({"iat": m.now + 600}))),
        token("a: iat missing", |m| m.a(json!({"iat": null}))),
        token("a: iat a string", |m| m.a(json!({"iat": "x"}))),
        // Signatures and algorithms.
        token("a: unknown kid", |m| {
            let header = json!({"alg": "ES256", "kid": "stranger"});
            m.keys.stranger.sign(&header, &m.a_claims(json!({})))
        }),
        token("a: kid of the EC key, signed RS256", |m| {
            let header = json!({"alg": "RS256", "kid": "a-ec"});
            m.keys.a_rsa.sign(&header, &m.a_claims(json!({})))
        }),
        token("a: wrong signature", |m| {
            with_wrong_signature(&m.a(json!({})))
        }),
        token("a: signature spelled with unused bits set", |m| {
            with_unused_bits(&m.a(json!({})))
        }),
        token("a: alg rs256 (lowercase)", |m| {
            let header = json!({"alg": "rs256", "kid": "a-rsa"});
            let token = m.keys.a_rsa.token(&m.a_claims(json!({})));
            let (_, rest) = token.split_once('.').unwrap();
            format!("{}.{rest}", URL_SAFE_NO_PAD.encode(header.to_string()))
        }),
        token("a: crit header", |m| {
            let header = json!({"alg": "RS256", "kid": "a-rsa", "crit": ["exp"], "exp": 1});
            m.keys.a_rsa.sign(&header, &m.a_claims(json!({})))
        }),
        token("a: an embedded jwk of the signing key", |m| {
            let header = json!({"alg": "ES256", "kid": "stranger", "jwk": m.keys.stranger.jwk()});
            m.keys.stranger.sign(&header, &m.a_claims(json!({})))
        }),
        token("a: HS256", |m| {
            let header = json!({"alg": "HS256", "kid": "a-rsa"});
            sign_hs256(&header, &m.a_claims(json!({})), b"not a secret")
        }),
        token("a: alg none", |m| {
            unsigned(&json!({"alg": "none"}), &m.a_claims(json!({})))
        }),
        token("a: iss a, signed by b's key", |m| {
            m.keys.b.token(&m.a_claims(json!({})))
        }),
        token("a: iss a, typ not JWT", |m| {
            let header = json!({"alg": "RS256", "kid": "a-rsa", "typ": "at+jwt"});
            m.keys.a_rsa.sign(&header, &m.a_claims(json!({})))
        }),
        // Issuer b: email, discoveryURL, MatchAny, an expression rule.
        token("b: ES384, email_verified true", |m| m.b(json!({}))),
        token("b: email_verified false", |m| {
            m.b(json!({"email_verified": false}))
        }),
        token("b: email_verified missing", |m| {
            m.b(json!({"email_verified": null}))
        }),
        token("b: email_verified \"true\" (a string)", |m| {
            m.b(json!({"email_verified": "true"}))
        }),
        token("b: email missing", |m| m.b(json!({"email": null}))),
        token("b: email empty", |m| m.b(json!({"email": ""}))),
        token("b: roles a string", |m| m.b(json!({"roles": "viewer"}))),
        token("b: aud kap-b2 (MatchAny)", |m| {
            m.b(json!({"aud": ["kap-b2"]}))
        }),
        token("b: aud x and kap-b", |m| {
            m.b(json!({"aud": ["x", "kap-b"]}))
        }),
        token("b: aud x", |m| m.b(json!({"aud": ["x"]}))),
        token("b: org other (rule passes)", |m| {
            m.b(json!({"org": "other"}))
        }),
        token("b: org blocked (rule fails)", |m| {
            m.b(json!({"org": "blocked"}))
        }),
        // Issuer c: CEL over nested claims, user validation.
        token("c: CEL mappings, nested claims", |m| m.c(json!({}))),
        token("c: no teams, no level", |m| {
            m.c(json!({"profile": {"handle": "carol"}}))
        }),
        token("c: profile missing (rule)", |m| {
            m.c(json!({"profile": null}))
        }),
        token("c: profile null", |m| {
            let claims = m.c_claims(json!({"profile": null})).to_string();
            let claims = format!(r#"{{"profile":null,{}"#, &claims[1..]);
            m.keys.c.sign_text(&m.keys.c.header().to_string(), &claims)
        }),
        token("c: teams with an empty string", |m| {
            m.c(json!({"profile": {"handle": "carol", "teams": ["", "red"]}}))
        }),
        token("c: level a boolean", |m| {
            m.c(json!({"profile": {"handle": "carol", "level": true}}))
        }),
        token("c: handle missing (CEL error)", |m| {
            m.c(json!({"profile": {"teams": ["red"]}}))
        }),
        token("c: sub missing (uid expression)", |m| {
            m.c(json!({"sub": null}))
        }),
        token("c: sub a number", |m| m.c(json!({"sub": 7}))),
        token("c: username reserved (user rule)", |m| {
            m.c(json!({"profile": {"handle": "system-x"}}))
        }),
        token("c: banned team (user rule)", |m| {
            m.c(json!({"profile": {"handle": "carol", "teams": ["banned"]}}))
        }),
    ];
    // Tokens no authenticator of the file claims: TokenReview decides them, through the proxy too.
    cases.push(Case {
        name: "d: issuer not in the file",
        probe: Probe::Token(|m| m.d()),
        configured: false,
    });
    cases.push(Case {
        name: "a's token, its parts padded with =",
        probe: Probe::Token(|m| with_padding(&m.a(json!({})))),
        configured: false,
    });
    cases.push(Case {
        name: "a's iss with a trailing slash",
        probe: Probe::Token(|m| {
            let iss = format!("{}/", m.issuer.url("a"));
            m.a(json!({"iss": iss}))
        }),
        configured: false,
    });
    for (name, path) in [
        ("anonymous /healthz (listed)", "/healthz"),
        ("anonymous /healthz?verbose (listed)", "/healthz?verbose"),
        ("anonymous /livez (listed)", "/livez"),
        ("anonymous /readyz (not listed)", "/readyz"),
        ("anonymous /healthz/ping (not listed)", "/healthz/ping"),
        ("anonymous /healthz/ (not listed)", "/healthz/"),
    ] {
        cases.push(Case {
            name,
            probe: Probe::Anonymous(path),
            configured: true,
        });
    }
    cases
}

/// Who was authenticated: TokenReview's `status.user`, or the user of the proxy's audit event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Seen {
    /// From a JSON `user` (`username`, `uid`, `groups`, `extra`; absent ones empty).
    pub fn from_json(user: &Value) -> Seen {
        let strings = |value: &Value| -> Vec<String> {
            value
                .as_array()
                .map(|items| {
                    items
                        .iter()
                        .map(|item| item.as_str().unwrap().to_owned())
                        .collect()
                })
                .unwrap_or_default()
        };
        Seen {
            username: user["username"].as_str().unwrap_or_default().to_owned(),
            uid: user["uid"].as_str().unwrap_or_default().to_owned(),
            groups: strings(&user["groups"]),
            extra: user["extra"]
                .as_object()
                .map(|extra| {
                    extra
                        .iter()
                        .map(|(key, values)| (key.clone(), strings(values)))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

impl std::fmt::Display for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.username)?;
        if !self.uid.is_empty() {
            write!(f, " uid={}", self.uid)?;
        }
        write!(f, " groups=[{}]", self.groups.join(","))?;
        for (key, values) in &self.extra {
            write!(f, " {key}=[{}]", values.join(","))?;
        }
        Ok(())
    }
}

/// What one side answered.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Authenticated as this user.
    User(Seen),
    /// Not authenticated: TokenReview's `status.error` (or the response status).
    Refused(String),
    /// An anonymous request answered with this status (401: not authenticated).
    Status(u16),
}

impl Answer {
    /// Whether the caller was authenticated.
    fn authenticated(&self) -> bool {
        match self {
            Answer::User(_) => true,
            Answer::Refused(_) => false,
            Answer::Status(status) => *status != 401,
        }
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::User(user) => write!(f, "{user}"),
            Answer::Refused(error) => write!(f, "refused: {error}"),
            Answer::Status(status) => write!(f, "{status}"),
        }
    }
}

/// kube-apiserver's answer to a TokenReview of `token`, asked as admin.
async fn token_review(admin: &kube::Client, token: &str) -> Answer {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_owned(),
            ..TokenReviewSpec::default()
        },
        ..TokenReview::default()
    };
    let reviews: Api<TokenReview> = Api::all(admin.clone());
    let status = reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap_or_else(|e| panic!("a TokenReview: {e}"))
        .status
        .unwrap_or_default();
    if status.authenticated == Some(true) {
        let user = serde_json::to_value(status.user.unwrap_or_default()).unwrap();
        Answer::User(Seen::from_json(&user))
    } else {
        Answer::Refused(status.error.unwrap_or_default())
    }
}

/// A client of the API server without a credential.
fn anonymous_client(api: &DedicatedApiServer) -> Client {
    let ca = CertificateDer::from_pem_file(&api.ca_file)
        .unwrap_or_else(|e| panic!("{}: {e}", api.ca_file.display()));
    Client::new(&ca, api.addr(), Identity::None)
}

/// kube-apiserver's answers, case by case.
async fn ask_kube_apiserver(
    api: &DedicatedApiServer,
    admin: &kube::Client,
    cases: &[Case],
    issuer: &StandInIssuer,
    keys: &Keys,
) -> Vec<Answer> {
    let anonymous = anonymous_client(api);
    let mut answers = Vec::new();
    for case in cases {
        answers.push(match &case.probe {
            Probe::Token(make) => token_review(admin, &make(&Mint::new(issuer, keys))).await,
            Probe::Anonymous(path) => Answer::Status(anonymous.get(path).await.status.as_u16()),
        });
    }
    answers
}

/// The table: case | kube-apiserver | proxy.
fn table(cases: &[Case], kube: &[Answer], proxy: &[Option<Answer>]) -> String {
    let width = cases.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut out = format!("{:width$} | kube-apiserver | proxy\n", "case");
    for ((case, kube), proxy) in cases.iter().zip(kube).zip(proxy) {
        let proxy = proxy
            .as_ref()
            .map_or_else(|| "-".to_owned(), ToString::to_string);
        writeln!(out, "{:width$} | {kube} | {proxy}", case.name).unwrap();
    }
    out
}

/// The proxy's answer to `case`: the user its audit event names when it served the request, or
/// the refusal's status.
async fn ask_proxy(proxy: &Harness, audit: &Path, case: &Case, mint: &Mint<'_>) -> Answer {
    let reply = match &case.probe {
        Probe::Token(make) => proxy.bearer_get("/pods", &make(mint)).await,
        Probe::Anonymous(path) => {
            return Answer::Status(proxy.anonymous().get(path).await.status.as_u16());
        }
    };
    match reply.status {
        StatusCode::UNAUTHORIZED => Answer::Refused(reply.status.to_string()),
        StatusCode::OK => {
            let id = reply
                .header("audit-id")
                .unwrap_or_else(|| panic!("{}: no Audit-Id", case.name))
                .to_owned();
            let event = eventually(&format!("{}: the audit event {id}", case.name), || {
                let id = id.clone();
                async move {
                    events(audit)
                        .into_iter()
                        .find(|e| e["auditID"] == id.as_str() && e["stage"] == "ResponseComplete")
                }
            })
            .await;
            Answer::User(Seen::from_json(&event["user"]))
        }
        other => panic!(
            "{}: the proxy answered {other}: {}",
            case.name,
            reply.text()
        ),
    }
}

/// TokenReviews as the API server counts them (every caller's).
async fn apiserver_token_reviews(admin: &kube::Client) -> f64 {
    apiserver_metric(
        admin,
        "apiserver_request_total",
        &[("resource", "tokenreviews")],
    )
    .await
}

/// TokenReviews the proxy sent.
async fn proxy_token_reviews(proxy: &Harness) -> f64 {
    proxy.metric(CALLS, &[("kind", "TokenReview")]).await
}

#[tokio::test]
async fn configured_issuers_and_anonymous_paths_are_decided_as_kube_apiserver_decides_them() {
    let Some(script) = start_script(SCENARIO) else {
        return;
    };
    let issuer = StandInIssuer::start(ISSUERS).await;
    let keys = Keys::publish(&issuer);
    let files = TempDir::new("authn-config");
    let config = files.write("authentication-config.yaml", authentication_config(&issuer));
    let api = DedicatedApiServer::start(
        &script,
        &[format!("--authentication-config={}", config.display())],
    )
    .await;
    eprintln!("{SCENARIO}: against the real API server at {}", api.api.url);
    let admin = api.api.admin().await;
    let cases = cases();

    // kube-apiserver's answers. Its authenticators fetch their discovery documents in the
    // background: until then every token of theirs is refused.
    eventually_within(
        Duration::from_secs(60),
        "kube-apiserver to authenticate each issuer's everyday token",
        || async {
            let mint = Mint::new(&issuer, &keys);
            for token in [mint.a(json!({})), mint.b(json!({})), mint.c(json!({}))] {
                if !token_review(&admin, &token).await.authenticated() {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    let kube = ask_kube_apiserver(&api, &admin, &cases, &issuer, &keys).await;
    assert!(
        kube.iter().any(Answer::authenticated) && kube.iter().any(|a| !a.authenticated()),
        "kube-apiserver authenticated all or nothing: the cases prove nothing"
    );
    // Which tokens an authenticator of the file claims, as kube-apiserver tells: the refusal of
    // one no authenticator claimed is the bearer-token authenticators' alone.
    for (case, answer) in cases.iter().zip(&kube) {
        if let (Probe::Token(_), Answer::Refused(error)) = (&case.probe, answer) {
            assert_eq!(
                error == UNKNOWN_TOKEN_ERROR,
                !case.configured,
                "{}: {error}",
                case.name
            );
        }
    }

    // The proxy's, with the same file, TokenReviews going to the same API server. From here on
    // the test sends no TokenReview itself: whatever the API server counts is the proxy's, from
    // its start (while its authenticators fetch their keys too).
    let apiserver_before = apiserver_token_reviews(&admin).await;
    let audit = TempDir::new("authn-config-audit");
    let proxy = ProxySpec::always_allow(&[
        &format!("--authentication-config={}", config.display()),
        "--authentication-token-webhook",
        &format!(
            "--audit-log-path={}",
            audit.path().join("audit.log").display()
        ),
    ])
    .kubeconfig(&api.api.proxy_kubeconfig)
    .start()
    .await;
    let proxy_before = proxy_token_reviews(&proxy).await;
    eventually_within(
        Duration::from_secs(60),
        "the proxy to authenticate each issuer's everyday token",
        || async {
            let mint = Mint::new(&issuer, &keys);
            for token in [mint.a(json!({})), mint.b(json!({})), mint.c(json!({}))] {
                if proxy.bearer_get("/pods", &token).await.status != StatusCode::OK {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    let reviewed = (apiserver_before, proxy_before);
    let mut answers: Vec<Option<Answer>> = Vec::new();
    for case in cases.iter().filter(|case| case.configured) {
        let answer = ask_proxy(&proxy, audit.path(), case, &Mint::new(&issuer, &keys)).await;
        answers.push(Some(answer));
    }
    let configured_reviews = (
        apiserver_token_reviews(&admin).await,
        proxy_token_reviews(&proxy).await,
    );
    // The tokens no authenticator of the file claims, each reviewed once.
    let unconfigured = cases.iter().filter(|case| !case.configured).count();
    for case in cases.iter().filter(|case| !case.configured) {
        let answer = ask_proxy(&proxy, audit.path(), case, &Mint::new(&issuer, &keys)).await;
        answers.push(Some(answer));
    }
    let all_reviews = eventually(
        "the API server to count the proxy's TokenReviews",
        || async {
            let counted = apiserver_token_reviews(&admin).await;
            (counted >= reviewed.0 + unconfigured as f64).then_some(counted)
        },
    )
    .await;
    let proxy_reviews = proxy_token_reviews(&proxy).await;
    // Back in the cases' order.
    let mut by_name: BTreeMap<&str, Option<Answer>> = cases
        .iter()
        .filter(|case| case.configured)
        .chain(cases.iter().filter(|case| !case.configured))
        .map(|case| case.name)
        .zip(answers)
        .collect();
    let proxy_answers: Vec<Option<Answer>> = cases
        .iter()
        .map(|case| by_name.remove(case.name).flatten())
        .collect();

    println!(
        "{SCENARIO}: the same file, case by case\n{}",
        table(&cases, &kube, &proxy_answers)
    );
    let configured_tokens = cases
        .iter()
        .filter(|case| case.configured && matches!(case.probe, Probe::Token(_)))
        .count();
    println!(
        "{SCENARIO}: TokenReviews from the proxy's start to its last answer to the \
         {configured_tokens} tokens of configured issuers (and {} anonymous requests): \
         kube-apiserver counted {}, the proxy sent {}; then for the {unconfigured} tokens no \
         configured issuer claims: kube-apiserver counted {}, the proxy sent {}",
        cases.iter().filter(|case| case.configured).count() - configured_tokens,
        configured_reviews.0 - reviewed.0,
        configured_reviews.1 - reviewed.1,
        all_reviews - configured_reviews.0,
        proxy_reviews - configured_reviews.1,
    );
    let differences: Vec<String> = cases
        .iter()
        .zip(&kube)
        .zip(&proxy_answers)
        .filter_map(|((case, kube), proxy)| {
            let proxy = proxy.as_ref().unwrap();
            let same = match (kube, proxy) {
                (Answer::User(k), Answer::User(p)) => k == p,
                _ => kube.authenticated() == proxy.authenticated(),
            };
            (!same).then(|| format!("{}: kube-apiserver {kube}, proxy {proxy}", case.name))
        })
        .collect();
    assert!(
        differences.is_empty(),
        "the proxy differs from kube-apiserver:\n{}",
        differences.join("\n")
    );
    assert_eq!(
        (
            configured_reviews.0 - reviewed.0,
            configured_reviews.1 - reviewed.1
        ),
        (0.0, 0.0),
        "TokenReviews (counted by kube-apiserver, sent by the proxy) for tokens of configured issuers"
    );
    assert_eq!(
        (
            all_reviews - configured_reviews.0,
            proxy_reviews - configured_reviews.1
        ),
        (unconfigured as f64, unconfigured as f64),
        "TokenReviews (counted by kube-apiserver, sent by the proxy) for tokens of no configured issuer"
    );
    assert_discovered_as_configured(&issuer);
    proxy.shutdown().await;
}

/// Each configured issuer's discovery document and keys were fetched from the stand-in, `b`'s
/// document only where its `discoveryURL` says.
fn assert_discovered_as_configured(issuer: &StandInIssuer) {
    let counts = issuer.request_counts();
    eprintln!("{SCENARIO}: requests to the stand-in issuer: {counts:?}");
    for name in ["a", "b", "c"] {
        assert!(issuer.discovery_fetches(name) > 0, "{name}: {counts:?}");
        assert!(issuer.jwks_fetches(name) > 0, "{name}: {counts:?}");
    }
    assert_eq!(
        issuer.requests(&format!("/b{DISCOVERY_SUFFIX}")),
        0,
        "b's discovery document below its URL, though its discoveryURL is elsewhere: {counts:?}"
    );
}

//! Who is calling: the authenticated [`User`] and the kubelet's authenticator chain.
//!
//! The chain mirrors the kubelet's `DelegatingAuthenticatorConfig`
//! (k8s.io/apiserver v0.33 `pkg/authentication/authenticatorfactory/delegating.go` `New`, and
//! `pkg/authentication/request/union/union.go`): x509 first,
//! then (later) bearer tokens; errors do not stop later authenticators, but any error prevents the
//! anonymous fallback, so a bad credential is a 401 even when anonymous access is on.

pub mod failure_budget;
pub mod jwt;
pub mod metrics;
pub mod service_account_keys;
pub mod structured;
mod subject_string;
pub mod token;
pub mod x509;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderMap, Version};
use rustls::pki_types::{CertificateDer, UnixTime};

use structured::{JwtOutcome, StructuredAuthentication};
use token::{Presented, TokenOutcome, TokenReviewAuthenticator, bearer_token, websocket_token};
use x509::{ClientCa, X509Authenticator, X509Outcome};

/// The group every authenticated (non-anonymous) user is put in, as the kubelet's
/// `AuthenticatedGroupAdder` does.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// The group of the anonymous user.
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
/// The anonymous user's name.
pub const ANONYMOUS_USER: &str = "system:anonymous";

/// An authenticated caller, with the same fields as Kubernetes' `user.Info`.
///
/// Built once per connection (x509) or per request (token) and shared as `Arc<User>`; every
/// authorizer sees it read-only.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    /// The user name (certificate CN, or TokenReview `username`), case preserved.
    pub name: String,
    /// A unique identifier, empty when the credential carries none.
    pub uid: String,
    /// Groups in credential order (certificate O values), duplicates kept.
    pub groups: Vec<String>,
    /// Extra attributes, e.g. `authentication.kubernetes.io/credential-id`.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    /// The identity given to requests that carry no credential when `--anonymous-auth` is on.
    pub fn anonymous() -> User {
        User {
            name: ANONYMOUS_USER.to_owned(),
            groups: vec![UNAUTHENTICATED_GROUP.to_owned()],
            ..User::default()
        }
    }

    /// Whether `group` is among the user's groups (exact, case-sensitive).
    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }

    /// Appends `system:authenticated` exactly as the kubelet's `AuthenticatedGroupAdder`: not for
    /// `system:anonymous`, and not when the user already has `system:authenticated` or
    /// `system:unauthenticated`.
    pub fn add_authenticated_group(&mut self) {
        if self.name == ANONYMOUS_USER
            || self.in_group(AUTHENTICATED_GROUP)
            || self.in_group(UNAUTHENTICATED_GROUP)
        {
            return;
        }
        self.groups.push(AUTHENTICATED_GROUP.to_owned());
    }
}

/// The result of authenticating one request.
#[derive(Debug, Clone)]
pub enum Authentication {
    /// The caller is this user.
    User(Arc<User>),
    /// No credential was presented and anonymous access is off: 401.
    Unauthenticated,
    /// A credential was presented and rejected: 401, and never anonymous. The text is for logs
    /// only.
    Failed(String),
}

/// What the client certificate of a connection established, computed once after the handshake and
/// shared by every request (HTTP/2 stream) on the connection.
#[derive(Debug, Clone)]
pub struct ConnectionIdentity {
    outcome: X509Outcome,
    /// The CA bundle `outcome` was verified against, and the chain to verify again should the
    /// bundle be replaced while the connection is open (as the kubelet verifies every request
    /// against the bundle in force).
    verified: Option<(Arc<ClientCa>, Vec<CertificateDer<'static>>)>,
}

impl ConnectionIdentity {
    fn none() -> ConnectionIdentity {
        ConnectionIdentity {
            outcome: X509Outcome::NoCertificate,
            verified: None,
        }
    }
}

/// The authenticator chain: x509 (when `--client-ca-file` is set), then bearer tokens from the
/// `Authorization` header and from WebSocket subprotocols (those of the JWT issuers of
/// `--authentication-config` decided on the node, the others with
/// `--authentication-token-webhook`), then anonymous when allowed (on the paths the
/// configuration file lists, when it governs anonymous access).
///
/// Kubelet semantics (k8s.io/apiserver v0.33 `pkg/authentication/request/union/union.go`
/// `AuthenticateRequest`, wrapped by `authenticatorfactory/delegating.go`): the first success wins;
/// an error (a bad certificate, a rejected or malformed token, a failed TokenReview) does not stop
/// later authenticators but rules out the anonymous fallback; with no authenticator configured and
/// anonymous on, every request is anonymous, whatever it presents.
#[derive(Debug, Clone)]
pub struct Authenticator {
    x509: Option<X509Authenticator>,
    tokens: Option<Arc<TokenReviewAuthenticator>>,
    structured: Option<Arc<StructuredAuthentication>>,
    anonymous: bool,
}

/// The kubelet's start-up error when nothing could authenticate a request.
#[derive(Debug, thiserror::Error)]
#[error(
    "no authentication method configured: set --client-ca-file, --authentication-token-webhook, --authentication-config or --anonymous-auth"
)]
pub struct NoAuthenticationMethod;

impl NoAuthenticationMethod {
    /// The kubelet's start-up rule: at least one of x509, tokens (reviewed, or decided by
    /// `--authentication-config`) and anonymous must be on.
    pub fn check(x509: bool, tokens: bool, anonymous: bool) -> Result<(), NoAuthenticationMethod> {
        if x509 || tokens || anonymous {
            Ok(())
        } else {
            Err(NoAuthenticationMethod)
        }
    }
}

impl Authenticator {
    /// Builds the chain; refuses a configuration in which every request would be a 401.
    /// `anonymous` is `--anonymous-auth`, which applies unless the configuration file of
    /// `structured` governs anonymous access.
    pub fn new(
        x509: Option<X509Authenticator>,
        tokens: Option<Arc<TokenReviewAuthenticator>>,
        structured: Option<Arc<StructuredAuthentication>>,
        anonymous: bool,
    ) -> Result<Authenticator, NoAuthenticationMethod> {
        NoAuthenticationMethod::check(
            x509.is_some(),
            tokens.is_some() || structured.is_some(),
            anonymous,
        )?;
        Ok(Authenticator {
            x509,
            tokens,
            structured,
            anonymous,
        })
    }

    /// Verifies the connection's client certificate chain, if x509 authentication is configured.
    pub fn authenticate_connection(
        &self,
        peer_chain: Option<&[CertificateDer<'_>]>,
        now: UnixTime,
    ) -> ConnectionIdentity {
        match (&self.x509, peer_chain) {
            (Some(x509), Some(chain)) if !chain.is_empty() => {
                let ca = x509.current_ca();
                ConnectionIdentity {
                    outcome: x509.authenticate_with(&ca, chain, now),
                    verified: Some((ca, chain.iter().map(|c| c.clone().into_owned()).collect())),
                }
            }
            _ => ConnectionIdentity::none(),
        }
    }

    /// The budget of failed token reviews, when tokens are reviewed.
    pub fn failure_budget(&self) -> Option<&Arc<failure_budget::FailureBudget>> {
        self.tokens.as_ref().map(|tokens| tokens.failure_budget())
    }

    /// Whether the request carries a bearer token (in `Authorization` or a WebSocket
    /// subprotocol) that nothing here checks because token authentication is off: such a
    /// request is unauthenticated (or anonymous), which logs should say rather than "no
    /// credential".
    pub fn ignores_token(&self, version: Version, headers: &HeaderMap) -> bool {
        self.tokens.is_none()
            && self.structured.is_none()
            && (headers.contains_key(http::header::AUTHORIZATION)
                || (crate::base::wire::is_websocket_upgrade(version, headers)
                    && crate::base::wire::websocket_protocols(headers)
                        .any(|p| crate::base::wire::bearer_protocol_token(p).is_some())))
    }

    /// Authenticates one request for `path` (decoded, as Go's `URL.Path`) of a connection from
    /// `source` at `now_secs` (Unix seconds).
    pub async fn authenticate(
        &self,
        connection: &ConnectionIdentity,
        source: IpAddr,
        version: Version,
        headers: &HeaderMap,
        path: &str,
        now_secs: i64,
    ) -> Authentication {
        let mut error = None;
        let reverified;
        let outcome = match (&self.x509, &connection.verified) {
            (Some(x509), Some((ca, chain))) if !x509.is_current(ca) => {
                reverified = x509.authenticate(chain, UnixTime::now());
                &reverified
            }
            _ => &connection.outcome,
        };
        match outcome {
            X509Outcome::Authenticated { user, valid_until } => {
                if now_secs <= *valid_until {
                    return Authentication::User(Arc::clone(user));
                }
                error = Some("client certificate chain has expired".to_owned());
            }
            X509Outcome::Invalid(reason) => error = Some(reason.clone()),
            X509Outcome::NoCertificate => {}
        }
        if self.tokens.is_some() || self.structured.is_some() {
            // The header first, as Kubernetes; the WebSocket subprotocol is parsed only when the
            // header gave no user.
            for websocket in [false, true] {
                let presented = if websocket {
                    websocket_token(version, headers)
                } else {
                    bearer_token(headers)
                };
                match presented {
                    Presented::Nothing => {}
                    Presented::Invalid(reason) => error = Some(reason.to_owned()),
                    Presented::Token(token) => {
                        match self.authenticate_token(&token, source).await {
                            Ok(user) => return Authentication::User(user),
                            Err(reason) => error = Some(reason),
                        }
                    }
                }
            }
        }
        let anonymous = self
            .structured
            .as_ref()
            .and_then(|structured| structured.anonymous_allows(path))
            .unwrap_or(self.anonymous);
        match error {
            Some(reason) => Authentication::Failed(reason),
            None if anonymous => Authentication::User(anonymous_user()),
            None => Authentication::Unauthenticated,
        }
    }

    /// A bearer token: decided on the node when its issuer is in `--authentication-config`,
    /// else reviewed; a token nothing can check is an error (kube-apiserver's "invalid bearer
    /// token"), never anonymous.
    async fn authenticate_token(&self, token: &str, source: IpAddr) -> Result<Arc<User>, String> {
        if let Some(structured) = &self.structured {
            match structured.authenticate(token).await {
                JwtOutcome::User(user) => return Ok(user),
                JwtOutcome::Refused(reason) => return Err(reason),
                JwtOutcome::NotOurs => {}
            }
        }
        match &self.tokens {
            Some(tokens) => match tokens.authenticate(token, source).await {
                TokenOutcome::User(user) => Ok(user),
                TokenOutcome::Failed(reason) => Err(reason),
            },
            None => Err("invalid bearer token".to_owned()),
        }
    }
}

/// One shared anonymous identity: it never changes, so requests need not allocate one each.
fn anonymous_user() -> Arc<User> {
    static ANONYMOUS: std::sync::OnceLock<Arc<User>> = std::sync::OnceLock::new();
    Arc::clone(ANONYMOUS.get_or_init(|| Arc::new(User::anonymous())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authenticated_group_added_once_and_never_to_anonymous() {
        let mut u = User {
            name: "alice".into(),
            groups: vec!["a".into()],
            ..User::default()
        };
        u.add_authenticated_group();
        u.add_authenticated_group();
        assert_eq!(u.groups, ["a", AUTHENTICATED_GROUP]);

        let mut anon_name = User {
            name: ANONYMOUS_USER.into(),
            ..User::default()
        };
        anon_name.add_authenticated_group();
        assert!(anon_name.groups.is_empty());

        let mut unauth = User {
            name: "x".into(),
            groups: vec![UNAUTHENTICATED_GROUP.into()],
            ..User::default()
        };
        unauth.add_authenticated_group();
        assert_eq!(unauth.groups, [UNAUTHENTICATED_GROUP]);
    }
}

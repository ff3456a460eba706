//! Bearer-token authentication with TokenReview, as the kubelet's `--authentication-token-webhook`
//! (k8s.io/apiserver v0.33 `pkg/authentication/request/bearertoken/bearertoken.go`,
//! `request/websocket/protocol.go`, `plugin/pkg/authenticator/token/webhook/webhook.go` and
//! `pkg/authentication/token/cache/cached_token_authenticator.go`): the token comes from
//! `Authorization: Bearer …` or, on WebSocket handshakes, from a
//! `base64url.bearer.authorization.k8s.io.` subprotocol; the answer is cached for the configured
//! TTL under an HMAC of token and audiences (never the token itself), and concurrent reviews of the
//! same token are coalesced into one call. Unlike the kubelet, a refusal with a reason is cached
//! too (for [`REFUSAL_TTL`]), so that replaying a refused token costs no review; and every review
//! passes the budget of failures ([`super::failure_budget`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::header::AUTHORIZATION;
use http::{HeaderMap, Version};
use k8s_openapi::api::authentication::v1::{TokenReviewSpec, TokenReviewStatus};

use super::User;
use super::failure_budget::{Checked, FailureBudget, Spent};
use super::jwt::Rejection;
use super::metrics::AuthnMetrics;
use super::service_account_keys::{LocalCheck, ServiceAccountKeys};
use crate::apiserver::cache::{CacheKey, KeyHasher, ReviewCache, random_hmac_key};
use crate::apiserver::{ApiCallError, ApiServerClient, ReviewKind};
use crate::base::wire;

/// Most tokens kept in the cache; the least recently used go first.
const MAX_CACHED_TOKENS: u64 = 16_384;
/// Longest a token the API server refused with a reason is remembered as refused: the
/// authorization webhook's default unauthorized TTL. The kubelet never caches such answers, so
/// a replayed refused token (one of a deleted pod verifies until it expires) cost a review
/// every time; the reason may also be the API server's own passing trouble, so it is kept for
/// less than a user is.
pub const REFUSAL_TTL: Duration = Duration::from_secs(30);

/// A token found in a request, or why the request's token is unusable.
#[derive(Debug, PartialEq, Eq)]
pub enum Presented<'a> {
    /// No token in this place; the next authenticator is tried.
    Nothing,
    /// A token to review.
    Token(std::borrow::Cow<'a, str>),
    /// A malformed token: an error, so never anonymous.
    Invalid(&'static str),
}

/// The `Authorization` header's bearer token, parsed as Kubernetes' `bearertoken` authenticator:
/// trimmed, split on single spaces into at most three parts, scheme compared case-insensitively,
/// token = second part; an empty second part (`Bearer  x`) or another scheme is no token.
pub fn bearer_token(headers: &HeaderMap) -> Presented<'_> {
    let Some(value) = headers.get(AUTHORIZATION) else {
        return Presented::Nothing;
    };
    let Ok(value) = value.to_str() else {
        return Presented::Invalid("invalid bearer token");
    };
    // `to_str` admitted only tab and visible ASCII, on which `trim_ascii` is Go's
    // `strings.TrimSpace`; the token is what lies between the first space and the next.
    let Some((scheme, rest)) = value.trim_ascii().split_once(' ') else {
        return Presented::Nothing;
    };
    let token = rest.split_once(' ').map_or(rest, |(token, _)| token);
    if scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() {
        Presented::Token(token.into())
    } else {
        Presented::Nothing
    }
}

/// The token of a WebSocket handshake's `Sec-WebSocket-Protocol`, parsed as Kubernetes'
/// `websocket` authenticator: only on WebSocket upgrade requests; the entry after the prefix is
/// unpadded base64url of a UTF-8 token; two token entries, or a token with no other subprotocol
/// to answer with, are errors.
pub fn websocket_token(version: Version, headers: &HeaderMap) -> Presented<'static> {
    if !wire::is_websocket_upgrade(version, headers) {
        return Presented::Nothing;
    }
    let mut token = None;
    let mut others = 0;
    for entry in wire::websocket_protocols(headers) {
        let Some(encoded) = wire::bearer_protocol_token(entry) else {
            others += 1;
            continue;
        };
        if token.is_some() {
            return Presented::Invalid("multiple base64.bearer.authorization tokens specified");
        }
        let Ok(decoded) = URL_SAFE_NO_PAD.decode(encoded) else {
            return Presented::Invalid("invalid bearer token");
        };
        let Ok(decoded) = String::from_utf8(decoded) else {
            return Presented::Invalid("invalid bearer token");
        };
        token = Some(decoded);
    }
    match token {
        Some(token) if token.is_empty() => Presented::Nothing,
        Some(_) if others == 0 => Presented::Invalid("missing additional subprotocol"),
        Some(token) => Presented::Token(token.into()),
        None => Presented::Nothing,
    }
}

/// The cache key of a token reviewed for `audiences`: an HMAC with the process's secret `key`, so
/// the cache never holds the token nor anything that could be checked against a guess of it
/// outside this process.
pub fn token_cache_key(key: &ring::hmac::Key, token: &str, audiences: &[String]) -> CacheKey {
    let mut hasher = KeyHasher::hmac(key);
    hasher.field(token.as_bytes()).count(audiences.len());
    for audience in audiences {
        hasher.field(audience.as_bytes());
    }
    hasher.finish()
}

/// A TokenReview answer as cached.
#[derive(Debug, Clone)]
enum Reviewed {
    /// The token is this user's.
    User(Arc<User>),
    /// Not authenticated, and no reason given.
    Unauthenticated,
    /// Refused, with the API server's reason.
    Refused(Arc<str>),
}

/// The outcome of checking one token.
#[derive(Debug, Clone)]
pub enum TokenOutcome {
    /// The token belongs to this user.
    User(Arc<User>),
    /// The token was reviewed and rejected, or could not be reviewed: an error, so a 401 even
    /// with anonymous access on. The text is for logs and never contains the token.
    Failed(String),
}

/// Reviews bearer tokens with the API server, through a bounded, coalescing cache.
pub struct TokenReviewAuthenticator {
    client: ApiServerClient,
    audiences: Vec<String>,
    cache: ReviewCache<Reviewed>,
    key: ring::hmac::Key,
    /// Service-account tokens checked on the node before their review.
    local: Option<Arc<ServiceAccountKeys>>,
    /// Reviews of tokens the node could not check, budgeted per source.
    failures: Arc<FailureBudget>,
}

impl std::fmt::Debug for TokenReviewAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewAuthenticator")
            .field("audiences", &self.audiences)
            .finish_non_exhaustive()
    }
}

/// The system's randomness failed when the cache key was made.
#[derive(Debug, thiserror::Error)]
#[error("no system randomness for the token cache key")]
pub struct NoRandomness;

impl TokenReviewAuthenticator {
    /// `ttl` applies to users and to plain rejections alike
    /// (`--authentication-token-webhook-cache-ttl`), and up to [`REFUSAL_TTL`] of it to
    /// refusals with a reason;
    /// `audiences` are sent in every review and must intersect the answer's.
    pub fn new(
        client: ApiServerClient,
        audiences: Vec<String>,
        ttl: Duration,
        metrics: &AuthnMetrics,
    ) -> Result<TokenReviewAuthenticator, NoRandomness> {
        Ok(TokenReviewAuthenticator {
            failures: Arc::new(FailureBudget::new(metrics.token_reviews_skipped())),
            cache: ReviewCache::new(
                ReviewKind::TokenReview,
                MAX_CACHED_TOKENS,
                move |answer| match answer {
                    Reviewed::Refused(_) => ttl.min(REFUSAL_TTL),
                    Reviewed::User(_) | Reviewed::Unauthenticated => ttl,
                },
                Arc::clone(client.metrics()),
            ),
            client,
            audiences,
            key: random_hmac_key().map_err(|_| NoRandomness)?,
            local: None,
        })
    }

    /// Checks service-account tokens against `keys` on the node before reviewing them: a forged
    /// one is refused without a TokenReview (and not cached).
    pub fn with_local_checks(mut self, keys: Arc<ServiceAccountKeys>) -> TokenReviewAuthenticator {
        self.local = Some(keys);
        self
    }

    /// The budget of failed reviews, for [`FailureBudget::report`].
    pub fn failure_budget(&self) -> &Arc<FailureBudget> {
        &self.failures
    }

    /// Checks `token`, presented from `source`: from the cache, or with one TokenReview shared by
    /// every concurrent check of the same token.
    pub async fn authenticate(&self, token: &str, source: IpAddr) -> TokenOutcome {
        let key = token_cache_key(&self.key, token, &self.audiences);
        let reviewed = self
            .cache
            .get_or_review(key, || self.review(token, source))
            .await;
        match reviewed {
            Ok(Reviewed::User(user)) => TokenOutcome::User(user),
            Ok(Reviewed::Unauthenticated) => TokenOutcome::Failed("invalid bearer token".into()),
            Ok(Reviewed::Refused(reason)) => {
                TokenOutcome::Failed(format!("token rejected: {reason}"))
            }
            Err(e) => TokenOutcome::Failed(e.to_string()),
        }
    }

    /// One TokenReview, turned into a cacheable answer (a user, a plain rejection, or a refusal
    /// with the API server's reason) or an error (never cached): the call failed, the node
    /// refused a forged service-account token, or the review's budget is spent. Every review
    /// passes the failure budget, the one gate of the API server's authentication cost; a
    /// service-account token the node verified passes it as such ([`Checked::Verified`]). The
    /// future owns its spec, so a refresh ahead can run it in the background.
    fn review(
        &self,
        token: &str,
        source: IpAddr,
    ) -> impl Future<Output = Result<Reviewed, ReviewError>> + Send + 'static {
        let spec = TokenReviewSpec {
            token: token.to_owned(),
            audiences: (!self.audiences.is_empty()).then(|| self.audiences.clone()),
        };
        let (client, audiences) = (self.client.clone(), self.audiences.clone());
        let (local, failures) = (self.local.clone(), Arc::clone(&self.failures));
        async move {
            let check = match local {
                Some(local) => local.check(&spec.token).await,
                None => LocalCheck::Undecided,
            };
            let checked = match check {
                LocalCheck::Refused(rejection) => return Err(ReviewError::Refused(rejection)),
                LocalCheck::Verified => Checked::Verified,
                LocalCheck::Undecided => Checked::Unverified,
            };
            let reservation = failures
                .reserve(source, checked)
                .await
                .map_err(ReviewError::OverBudget)?;
            let reviewed = match client.token_review(spec).await {
                Ok(status) => Ok(match user_from_token_review(status, &audiences) {
                    Ok(Some(user)) => Reviewed::User(Arc::new(user)),
                    Ok(None) => Reviewed::Unauthenticated,
                    Err(reason) => Reviewed::Refused(reason.into()),
                }),
                Err(e) => Err(ReviewError::Call(e)),
            };
            if matches!(reviewed, Ok(Reviewed::User(_)) | Err(_)) {
                reservation.refund();
            } else {
                reservation.charge();
            }
            reviewed
        }
    }
}

/// Interprets a TokenReview status as the kubelet does: the user (with `system:authenticated`
/// added), `Ok(None)` for a plain rejection or an answer for none of `audiences` (when any were
/// asked for), or `Err` with the API server's reason when it rejected the token with an error or
/// authenticated it without a user name. Public so the handling of whatever the API server
/// answers can be exercised on its own, as the fuzzer does.
pub fn user_from_token_review(
    status: TokenReviewStatus,
    audiences: &[String],
) -> Result<Option<User>, String> {
    if status.authenticated != Some(true) {
        return match status.error.filter(|e| !e.is_empty()) {
            Some(error) => Err(error),
            None => Ok(None),
        };
    }
    if !audiences.is_empty() {
        let answered = status.audiences.unwrap_or_default();
        if !answered.iter().any(|a| audiences.contains(a)) {
            return Ok(None);
        }
    }
    let info = status.user.unwrap_or_default();
    let mut user = User {
        name: info.username.unwrap_or_default(),
        uid: info.uid.unwrap_or_default(),
        groups: info.groups.unwrap_or_default(),
        extra: info
            .extra
            .unwrap_or_default()
            .into_iter()
            .collect::<BTreeMap<_, _>>(),
    };
    if user.name.is_empty() {
        return Err("TokenReview returned no user name".into());
    }
    user.add_authenticated_group();
    Ok(Some(user))
}

/// Why a review gave no cacheable answer.
#[derive(Debug, thiserror::Error)]
enum ReviewError {
    /// The call failed.
    #[error(transparent)]
    Call(#[from] ApiCallError),
    /// Refused on the node, never sent: a forged or stale service-account token.
    #[error("{}", .0.reason())]
    Refused(Rejection),
    /// Not sent: the source's failed authentications are over budget.
    #[error("{}", .0.reason())]
    OverBudget(Spent),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::wire::WEBSOCKET_BEARER_PREFIX;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn bearer_header_forms() {
        let token = |v: &str| match bearer_token(&headers(&[("authorization", v)])) {
            Presented::Token(t) => Presented::Token(t.into_owned().into()),
            Presented::Nothing => Presented::Nothing,
            Presented::Invalid(r) => Presented::Invalid(r),
        };
        assert_eq!(token("Bearer abc"), Presented::Token("abc".into()));
        assert_eq!(token("bearer abc"), Presented::Token("abc".into()));
        assert_eq!(token("  BEARER abc  "), Presented::Token("abc".into()));
        assert_eq!(token("Bearer abc extra"), Presented::Token("abc".into()));
        assert_eq!(
            token("Bearer  abc"),
            Presented::Nothing,
            "double space: empty token"
        );
        assert_eq!(token("Bearer"), Presented::Nothing);
        assert_eq!(token("\tBearer abc\t"), Presented::Token("abc".into()));
        assert_eq!(
            token("Bearer\tabc"),
            Presented::Nothing,
            "only a space separates"
        );
        assert_eq!(
            token("Bearer abc\tdef"),
            Presented::Token("abc\tdef".into())
        );
        assert_eq!(token("Basic dXNlcjpwYXNz"), Presented::Nothing);
        assert_eq!(bearer_token(&HeaderMap::new()), Presented::Nothing);
    }

    fn ws(protocols: &str) -> Presented<'static> {
        websocket_token(
            Version::HTTP_11,
            &headers(&[
                ("connection", "Upgrade"),
                ("upgrade", "websocket"),
                ("sec-websocket-protocol", protocols),
            ]),
        )
    }

    #[test]
    fn websocket_protocol_forms() {
        let encoded = URL_SAFE_NO_PAD.encode("tok-en");
        assert_eq!(
            ws(&format!(
                "{WEBSOCKET_BEARER_PREFIX}{encoded}, v4.channel.k8s.io"
            )),
            Presented::Token("tok-en".into())
        );
        assert_eq!(
            ws(&format!("{WEBSOCKET_BEARER_PREFIX}{encoded}")),
            Presented::Invalid("missing additional subprotocol")
        );
        assert_eq!(
            ws(&format!(
                "{WEBSOCKET_BEARER_PREFIX}{encoded},{WEBSOCKET_BEARER_PREFIX}{encoded},v4.channel.k8s.io"
            )),
            Presented::Invalid("multiple base64.bearer.authorization tokens specified")
        );
        assert_eq!(
            ws(&format!(
                "{WEBSOCKET_BEARER_PREFIX}not*base64, v4.channel.k8s.io"
            )),
            Presented::Invalid("invalid bearer token")
        );
        let not_utf8 = URL_SAFE_NO_PAD.encode([0xff, 0xfe]);
        assert_eq!(
            ws(&format!(
                "{WEBSOCKET_BEARER_PREFIX}{not_utf8}, v4.channel.k8s.io"
            )),
            Presented::Invalid("invalid bearer token")
        );
        assert_eq!(ws("v4.channel.k8s.io"), Presented::Nothing);
        // Not a WebSocket handshake: the header is ignored.
        let plain = headers(&[(
            "sec-websocket-protocol",
            &format!("{WEBSOCKET_BEARER_PREFIX}{encoded}, v4.channel.k8s.io"),
        )]);
        assert_eq!(
            websocket_token(Version::HTTP_11, &plain),
            Presented::Nothing
        );
    }
}

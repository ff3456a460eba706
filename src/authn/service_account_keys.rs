//! The cluster's service-account issuer and its public keys, as the API server publishes them
//! (`/.well-known/openid-configuration`, `/openid/v1/jwks`; readable with the ClusterRole
//! `system:service-account-issuer-discovery`), for checking service-account tokens on the node
//! ([`super::jwt`]).
//!
//! The keys are fetched at start, again every 10 minutes (±10%, so nodes started together do not
//! fetch together), and when a token names a key id the set does not hold and was issued after
//! the set was fetched (a rotation): such fetches are coalesced and at most one per
//! [`REFRESH_COOLDOWN`]; within that time of a fetch, an unknown key id is refused (the API server
//! publishes a key before it signs with it). Until keys are held, or when a token cannot be decided with the keys
//! held, the token goes to TokenReview as before: keys that cannot be fetched never make the
//! proxy accept, nor refuse, anything it would not have otherwise.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;
use serde::Deserialize;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::{info, warn};

use super::jwt::{self, KeyCheck, LEEWAY, PublicKey, Rejection, Shape};
use super::metrics::AuthnMetrics;
use crate::apiserver::{ApiCallError, ApiServerClient};

/// How often the keys are fetched again, before jitter.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(600);
/// The least time between two fetches a token's unknown key id asks for, and how long after a
/// fetch an unknown key id is refused outright. kube-apiserver publishes a key as soon as it can
/// sign with it, so a token with a key new within this time of a fetch is refused for at most
/// this long; a flood of invented key ids costs the API server one fetch per node this often.
pub const REFRESH_COOLDOWN: Duration = Duration::from_secs(10);
/// Where kube-apiserver publishes the issuer.
const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";
/// Where kube-apiserver publishes the keys (its own address, whatever `jwks_uri` says: that
/// names the issuer's public address, which a node may not reach).
const JWKS_PATH: &str = "/openid/v1/jwks";
/// The only representation kube-apiserver serves the keys as (406 for `application/json`).
const JWKS_MEDIA_TYPE: &str = "application/jwk-set+json";

/// What checking a token on the node concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalCheck {
    /// Not decidable here (not a service-account JWT of the issuer, or no keys): TokenReview.
    Undecided,
    /// Signed by the issuer and within its claims: TokenReview still decides (bound objects).
    Verified,
    /// Refused without a TokenReview.
    Refused(Rejection),
}

/// The keys held, and when they were fetched.
#[derive(Debug)]
struct KeySet {
    keys: Vec<PublicKey>,
    /// Every published key is among `keys` ([`jwt::Jwks::complete`]).
    complete: bool,
    fetched: SystemTime,
}

/// The issuer's keys, kept current, and the check of a token against them.
pub struct ServiceAccountKeys {
    client: ApiServerClient,
    /// `--service-account-issuer`; empty: the discovery document's `issuer`.
    configured_issuers: Vec<String>,
    /// The issuers tokens are checked for: the configured ones, or the discovered one.
    issuers: ArcSwapOption<Vec<String>>,
    /// The audiences a token must name one of (`--authentication-token-audiences`, else
    /// `--api-audiences`); empty: not checked here (TokenReview checks the API server's own).
    audiences: Vec<String>,
    keys: ArcSwapOption<KeySet>,
    /// The last fetch's start, held while a fetch runs: fetches are one at a time.
    last_fetch: Mutex<Option<Instant>>,
    metrics: Arc<AuthnMetrics>,
}

impl std::fmt::Debug for ServiceAccountKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountKeys")
            .field("configured_issuers", &self.configured_issuers)
            .field("audiences", &self.audiences)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
}

/// A fetch of the issuer or its keys that failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The API server could not be asked, or refused.
    #[error("GET {path}: {source}")]
    Call {
        /// The path asked for.
        path: &'static str,
        /// Why.
        #[source]
        source: ApiCallError,
    },
    /// The discovery document is not one.
    #[error("{DISCOVERY_PATH}: not an OpenID discovery document: {0}")]
    Discovery(#[source] serde_json::Error),
    /// The key set is not usable.
    #[error("{JWKS_PATH}: {0}")]
    Jwks(#[source] jwt::JwksError),
}

impl FetchError {
    /// What to look at, for logs and `check-config --probe`.
    pub fn hint(&self) -> &'static str {
        match self {
            FetchError::Call {
                source: ApiCallError::Status { code: 403, .. },
                ..
            } => {
                "the proxy's identity may not read the issuer's discovery documents: bind it to \
                 the ClusterRole system:service-account-issuer-discovery (config/rbac.yaml)"
            }
            FetchError::Call {
                source: ApiCallError::Status { code: 404, .. },
                ..
            } => "the API server does not publish service-account issuer discovery",
            _ => "service-account tokens go to TokenReview until the keys can be fetched",
        }
    }
}

impl ServiceAccountKeys {
    /// Keys fetched through `client`, for `issuers` (empty: discovered) and `audiences` (empty:
    /// not checked on the node). Nothing is fetched until [`ServiceAccountKeys::run`] or a check.
    pub fn new(
        client: ApiServerClient,
        issuers: Vec<String>,
        audiences: Vec<String>,
        metrics: Arc<AuthnMetrics>,
    ) -> ServiceAccountKeys {
        metrics.service_account_keys_watched();
        ServiceAccountKeys {
            client,
            issuers: ArcSwapOption::new((!issuers.is_empty()).then(|| Arc::new(issuers.clone()))),
            configured_issuers: issuers,
            audiences,
            keys: ArcSwapOption::empty(),
            last_fetch: Mutex::new(None),
            metrics,
        }
    }

    /// The issuers tokens are checked for: configured, or discovered by a fetch (none before).
    pub fn issuers(&self) -> Vec<String> {
        self.issuers
            .load_full()
            .map(|issuers| issuers.as_ref().clone())
            .unwrap_or_default()
    }

    /// Fetches the issuer (unless configured) and the keys once: how many keys are held.
    pub async fn fetch(&self) -> Result<usize, FetchError> {
        if self.configured_issuers.is_empty() {
            let body = self
                .client
                .get(DISCOVERY_PATH, "application/json")
                .await
                .map_err(|source| FetchError::Call {
                    path: DISCOVERY_PATH,
                    source,
                })?;
            let discovery: Discovery =
                serde_json::from_slice(&body).map_err(FetchError::Discovery)?;
            self.issuers.store(Some(Arc::new(vec![discovery.issuer])));
        }
        let body = self
            .client
            .get(JWKS_PATH, JWKS_MEDIA_TYPE)
            .await
            .map_err(|source| FetchError::Call {
                path: JWKS_PATH,
                source,
            })?;
        let jwks = jwt::parse_jwks(&body).map_err(FetchError::Jwks)?;
        let count = jwks.keys.len();
        self.keys.store(Some(Arc::new(KeySet {
            keys: jwks.keys,
            complete: jwks.complete,
            fetched: SystemTime::now(),
        })));
        Ok(count)
    }

    /// One fetch, logged and counted; a failure keeps the keys held.
    async fn fetch_logged(&self) -> bool {
        match self.fetch().await {
            Ok(count) => {
                self.metrics.service_account_keys_fetched(true, count);
                true
            }
            Err(e) => {
                self.metrics.service_account_keys_fetched(false, 0);
                warn!(
                    error = %e,
                    hint = e.hint(),
                    "cannot fetch the service-account issuer's keys"
                );
                false
            }
        }
    }

    /// Fetches now unless a fetch started within `cooldown` (then waits for a running one).
    async fn refresh(&self, cooldown: Duration) {
        let mut last = self.last_fetch.lock().await;
        if last.is_some_and(|at| at.elapsed() < cooldown) {
            return;
        }
        *last = Some(Instant::now());
        self.fetch_logged().await;
    }

    /// Keeps the keys current until the task is dropped: a fetch now, then every
    /// [`REFRESH_INTERVAL`] ±10%.
    pub async fn run(self: Arc<Self>) {
        let mut said = false;
        loop {
            self.refresh(Duration::ZERO).await;
            if !said && self.keys.load().is_some() {
                said = true;
                info!(
                    issuers = ?self.issuers(),
                    "service-account tokens are checked on the node before TokenReview"
                );
            }
            let jitter = 0.9 + 0.2 * crate::apiserver::cache::random_fraction();
            tokio::time::sleep(REFRESH_INTERVAL.mul_f64(jitter)).await;
        }
    }

    /// Checks `token` on the node.
    pub async fn check(&self, token: &str) -> LocalCheck {
        let Some(issuers) = self.issuers.load_full() else {
            return LocalCheck::Undecided;
        };
        let now = SystemTime::now();
        let parsed = match jwt::classify(token, &issuers, &self.audiences, now) {
            Shape::Other => return LocalCheck::Undecided,
            Shape::Refused(rejection) => return self.refused(rejection),
            Shape::OtherAlgorithm => {
                return match self.keys.load_full() {
                    Some(set) if set.complete => self.refused(Rejection::Algorithm),
                    _ => LocalCheck::Undecided,
                };
            }
            Shape::ServiceAccount(parsed) => parsed,
        };
        for attempt in 0..2 {
            let Some(set) = self.keys.load_full() else {
                return LocalCheck::Undecided;
            };
            match jwt::check_signature(&parsed, &set.keys) {
                KeyCheck::Verified => return LocalCheck::Verified,
                KeyCheck::Refused(rejection) => return self.refused(rejection),
                KeyCheck::UnknownKey => {
                    // A key is published before the API server signs with it: a set fetched
                    // after the token was issued, or fetched just now, that lacks the key proves
                    // the token forged (or its key withdrawn). An older set is fetched again,
                    // once per cooldown for all tokens alike.
                    let issued = parsed.issued_at().unwrap_or(now);
                    // Read the clock again: this check may have waited for the fetch that made
                    // `set` (fetched after `now` counts as fresh).
                    let fresh = set
                        .fetched
                        .elapsed()
                        .map_or(true, |age| age < REFRESH_COOLDOWN);
                    if set.fetched > issued + LEEWAY || fresh {
                        return self.refused(Rejection::UnknownKey);
                    }
                    if attempt == 0 {
                        self.refresh(REFRESH_COOLDOWN).await;
                    }
                }
            }
        }
        // The keys could not be fetched again: TokenReview decides.
        LocalCheck::Undecided
    }

    fn refused(&self, rejection: Rejection) -> LocalCheck {
        self.metrics.token_refused_locally(rejection);
        LocalCheck::Refused(rejection)
    }
}

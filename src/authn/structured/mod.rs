//! kube-apiserver's `--authentication-config` (an `AuthenticationConfiguration`, KEP-3331 and
//! KEP-4633), read from the same file the control plane uses and decided on the node: a bearer
//! token whose `iss` names one of its JWT authenticators is verified against that issuer's keys
//! ([`keys`]), its claims checked ([`token`]) and mapped to a user ([`mapping`], with CEL:
//! [`expressions`]) exactly as kube-apiserver v1.36 does, and never becomes a TokenReview;
//! requests with no credential are anonymous only on the paths the file lists.
//!
//! A token decided once is remembered for [`SUCCESS_CACHE_TTL`] (kube-apiserver caches its
//! token authenticators' successes as long), under an HMAC of the token, never past its `exp`
//! nor across a reload: a token seen again costs a lookup, not a signature.
//!
//! The file is validated as kube-apiserver validates it ([`validation`]) and read again when it
//! changes and at least once a minute; a file that no longer validates keeps the last good
//! configuration in force, logged and counted ([`metrics`]). The keys of an issuer that stays in
//! the file are kept across reloads.

pub mod expressions;
pub mod file;
pub mod keys;
pub mod mapping;
pub mod metrics;
pub mod token;
pub mod validation;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use tracing::info;

use crate::apiserver::cache::{CacheKey, random_hmac_key};
use crate::authn::User;
use crate::authn::token::{NoRandomness, token_cache_key};
use crate::base::reload::{Reload, ReloadError, ReloadTarget, Reloadable};
use keys::{IssuerKeys, IssuerSource, KeyRefusal, KeysError, KeysMetrics, Verdict};
use mapping::{MappingError, PrefixedMapping};
use metrics::{IssuerMetrics, StructuredMetrics, sha256_label};
use token::ClaimsRefusal;
use validation::{AnonymousRule, Context, FieldErrors, JwtSpec, Validated};

/// The reload target's name, in logs and in `kubelet_auth_proxy_config_reloads_total`.
pub const TARGET: &str = "authentication_config";
/// How long a token's user is remembered: kube-apiserver's cache of successful token
/// authentications (`TokenSuccessCacheTTL`).
pub const SUCCESS_CACHE_TTL: Duration = Duration::from_secs(10);
/// Most tokens remembered; the least recently used go first.
const MAX_CACHED_TOKENS: u64 = 16_384;

/// A validated file and the hash of its contents.
#[derive(Debug)]
pub struct Loaded {
    /// What it says, compiled.
    pub validated: Validated,
    /// `sha256:` and the hex SHA-256 of the file, as kube-apiserver labels its configuration.
    pub hash: String,
}

/// Why the file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// It could not be read.
    #[error("cannot read: {0}")]
    Read(#[source] std::io::Error),
    /// It is larger than [`file::MAX_FILE_BYTES`].
    #[error("larger than {} bytes", file::MAX_FILE_BYTES)]
    TooLarge,
    /// It is not an `AuthenticationConfiguration`.
    #[error(transparent)]
    Decode(#[from] file::DecodeError),
    /// It breaks kube-apiserver's rules, each named by its field path.
    #[error(transparent)]
    Invalid(#[from] FieldErrors),
}

/// Reads, decodes and validates the file at `path`.
pub fn load(path: &Path, context: &Context) -> Result<Loaded, LoadError> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(file::MAX_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(LoadError::Read)?;
    if bytes.len() as u64 > file::MAX_FILE_BYTES {
        return Err(LoadError::TooLarge);
    }
    let text = String::from_utf8_lossy(&bytes);
    let config = file::decode(&text)?;
    let validated = validation::validate(&config, context)?;
    Ok(Loaded {
        validated,
        hash: sha256_label(&bytes),
    })
}

/// The file, loaded and watched for changes, before anything is fetched: what the settings carry
/// and `check-config` stops at.
pub struct StructuredSettings {
    file: Reloadable<Loaded>,
}

impl StructuredSettings {
    /// Loads the file at `path`, validated with `context` now and at every reload.
    pub fn load(path: PathBuf, context: Context) -> Result<StructuredSettings, ReloadError> {
        // The one path given here is the one the reloads are handed.
        let file = Reloadable::load(TARGET, vec![path], move |paths: &[PathBuf]| {
            load(&paths[0], &context)
        })?;
        Ok(StructuredSettings { file })
    }

    /// The configuration in force.
    pub fn current(&self) -> Arc<Loaded> {
        self.file.current_arc()
    }
}

/// One JWT authenticator in force.
struct Issuer {
    spec: JwtSpec,
    keys: Arc<IssuerKeys>,
    metrics: IssuerMetrics,
}

/// The configuration in force, with its issuers' keys.
struct Live {
    /// Which configuration this is: remembered users are of one configuration only.
    generation: u64,
    issuers: Vec<Issuer>,
    /// Index in `issuers` by issuer URL.
    by_url: HashMap<String, usize>,
    anonymous: Option<AnonymousRule>,
}

/// What the JWT authenticators say about a bearer token.
#[derive(Debug, Clone)]
pub enum JwtOutcome {
    /// Its `iss` names no configured issuer: another authenticator decides.
    NotOurs,
    /// The token is this user's (`system:authenticated` added).
    User(Arc<User>),
    /// Refused on the node: 401, never a TokenReview. The text is for logs.
    Refused(String),
}

/// Why a token of a configured issuer was refused.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("oidc: verify token: {0}")]
    Claims(ClaimsRefusal),
    #[error("oidc: verify token: {}", .0.reason())]
    Key(KeyRefusal),
    #[error("oidc: authenticator not initialized (the issuer's keys have not been fetched yet)")]
    NotInitialized,
    #[error("oidc: {0}")]
    Mapping(MappingError),
    #[error(
        "oidc: the groups claim is distributed (_claim_names), which is not resolved on the node"
    )]
    DistributedClaims,
}

impl Refusal {
    fn label(&self) -> &'static str {
        match self {
            Refusal::Claims(ClaimsRefusal::Malformed) => "malformed",
            Refusal::Claims(ClaimsRefusal::Issuer) => "issuer",
            Refusal::Claims(ClaimsRefusal::Audience) => "audience",
            Refusal::Claims(ClaimsRefusal::Expired) => "expired",
            Refusal::Claims(ClaimsRefusal::NotYetValid) => "not_yet_valid",
            Refusal::Key(refusal) => refusal.as_str(),
            Refusal::NotInitialized => "not_initialized",
            Refusal::Mapping(_) => "mapping",
            Refusal::DistributedClaims => "distributed_claims",
        }
    }
}

/// A remembered user, of the configuration `generation`, until `until`.
#[derive(Clone)]
struct Remembered {
    user: Arc<User>,
    generation: u64,
    until: Instant,
}

/// Why the authenticators could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// An issuer's client could not be built.
    #[error(transparent)]
    Keys(#[from] KeysError),
    /// No key for the cache of users.
    #[error(transparent)]
    Randomness(#[from] NoRandomness),
}

/// The JWT authenticators and anonymous rule of `--authentication-config`, kept current.
pub struct StructuredAuthentication {
    settings: StructuredSettings,
    live: ArcSwap<Live>,
    generations: AtomicU64,
    /// Users of tokens decided lately, by HMAC of the token.
    remembered: moka::future::Cache<CacheKey, Remembered>,
    hmac: ring::hmac::Key,
    /// Every issuer's keys by source, so that a reload keeps the keys of issuers it keeps; only
    /// loads and reloads take this lock.
    keys: Mutex<HashMap<IssuerSource, Weak<IssuerKeys>>>,
    keys_metrics: KeysMetrics,
    metrics: StructuredMetrics,
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for StructuredAuthentication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StructuredAuthentication")
            .field("path", &self.settings.file.paths())
            .finish_non_exhaustive()
    }
}

impl StructuredAuthentication {
    /// Puts `settings` in force and starts fetching every issuer's keys. Must run inside a
    /// Tokio runtime, whose tasks fetch the keys.
    pub fn start(
        settings: StructuredSettings,
        keys_metrics: KeysMetrics,
        metrics: StructuredMetrics,
    ) -> Result<Arc<StructuredAuthentication>, StartError> {
        let loaded = settings.current();
        let structured = StructuredAuthentication {
            settings,
            live: ArcSwap::from_pointee(Live {
                generation: 0,
                issuers: Vec::new(),
                by_url: HashMap::new(),
                anonymous: None,
            }),
            generations: AtomicU64::new(0),
            remembered: moka::future::Cache::builder()
                .max_capacity(MAX_CACHED_TOKENS)
                .time_to_live(SUCCESS_CACHE_TTL)
                .build(),
            hmac: random_hmac_key().map_err(|_| NoRandomness)?,
            keys: Mutex::new(HashMap::new()),
            keys_metrics,
            metrics,
            runtime: tokio::runtime::Handle::current(),
        };
        structured.live.store(Arc::new(structured.build(&loaded)?));
        structured.metrics.applied(&loaded.hash, false);
        info!(
            issuers = loaded.validated.jwt.len(),
            "tokens of the issuers in --authentication-config are decided on the node"
        );
        Ok(Arc::new(structured))
    }

    /// The authenticators of `loaded`, reusing the keys of issuers already held.
    fn build(&self, loaded: &Loaded) -> Result<Live, KeysError> {
        let _runtime = self.runtime.enter();
        // A panic elsewhere while holding the lock cannot leave the map inconsistent: take it.
        let mut held = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        held.retain(|_, keys| keys.strong_count() > 0);
        let mut issuers = Vec::with_capacity(loaded.validated.jwt.len());
        let mut by_url = HashMap::new();
        for spec in &loaded.validated.jwt {
            let keys = match held.get(&spec.source).and_then(Weak::upgrade) {
                Some(keys) => keys,
                None => {
                    let keys = IssuerKeys::new(spec.source.clone(), self.keys_metrics.clone())?;
                    keys.spawn();
                    held.insert(spec.source.clone(), Arc::downgrade(&keys));
                    keys
                }
            };
            by_url.insert(spec.source.url.clone(), issuers.len());
            issuers.push(Issuer {
                metrics: self
                    .metrics
                    .issuer(&sha256_label(spec.source.url.as_bytes())),
                spec: spec.clone(),
                keys,
            });
        }
        Ok(Live {
            generation: self.generations.fetch_add(1, Ordering::Relaxed) + 1,
            issuers,
            by_url,
            anonymous: loaded.validated.anonymous.clone(),
        })
    }

    /// Whether the file lets a request with no credential for `path` through as anonymous:
    /// `None` when the file says nothing of anonymous access (`--anonymous-auth` decides).
    pub fn anonymous_allows(&self, path: &str) -> Option<bool> {
        match &self.live.load().anonymous {
            None => None,
            Some(AnonymousRule::Disabled) => Some(false),
            Some(AnonymousRule::Everywhere) => Some(true),
            Some(AnonymousRule::Paths(paths)) => Some(paths.contains(path)),
        }
    }

    /// Decides `token` if its issuer is configured: from the users remembered, else as
    /// [`StructuredAuthentication::decide`] does, remembering the user.
    pub async fn authenticate(&self, token: &str) -> JwtOutcome {
        let live = self.live.load_full();
        if live.issuers.is_empty() {
            return JwtOutcome::NotOurs;
        }
        let key = token_cache_key(&self.hmac, token, &[]);
        if let Some(hit) = self.remembered.get(&key).await
            && hit.generation == live.generation
            && hit.until > Instant::now()
        {
            return JwtOutcome::User(hit.user);
        }
        let started = Instant::now();
        match Self::decide_in(&live, token).await {
            Decided::NotOurs => JwtOutcome::NotOurs,
            Decided::Refused(reason) => JwtOutcome::Refused(reason),
            Decided::User(user, expiry) => {
                // Never past the token's own expiry.
                let left = expiry
                    .duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO);
                let remembered = Remembered {
                    user: Arc::clone(&user),
                    generation: live.generation,
                    until: started + left.min(SUCCESS_CACHE_TTL),
                };
                self.remembered.insert(key, remembered).await;
                JwtOutcome::User(user)
            }
        }
    }

    /// Decides `token` if its issuer is configured, whatever was decided before: what
    /// [`StructuredAuthentication::authenticate`] costs for a token it has not seen lately.
    pub async fn decide(&self, token: &str) -> JwtOutcome {
        match Self::decide_in(&self.live.load_full(), token).await {
            Decided::NotOurs => JwtOutcome::NotOurs,
            Decided::Refused(reason) => JwtOutcome::Refused(reason),
            Decided::User(user, _) => JwtOutcome::User(user),
        }
    }

    async fn decide_in(live: &Live, token: &str) -> Decided {
        let Some(issuer) = token::untrusted_issuer(token)
            .and_then(|url| live.by_url.get(&url))
            .map(|&index| &live.issuers[index])
        else {
            return Decided::NotOurs;
        };
        let started = Instant::now();
        let decided = issuer.decide(token).await;
        issuer.metrics.decided(
            started.elapsed().as_secs_f64(),
            decided.as_ref().err().map(Refusal::label),
        );
        match decided {
            Ok((user, expiry)) => Decided::User(Arc::new(user), expiry),
            Err(refusal) => Decided::Refused(refusal.to_string()),
        }
    }
}

/// A decision, with the token's expiry when it is a user.
enum Decided {
    NotOurs,
    User(Arc<User>, SystemTime),
    Refused(String),
}

impl Issuer {
    /// kube-apiserver's `AuthenticateToken`, for a token naming this issuer: the user, and
    /// when the token expires.
    async fn decide(&self, token: &str) -> Result<(User, SystemTime), Refusal> {
        let parsed = token::parse(
            token,
            &self.spec.source.url,
            &self.spec.audiences,
            SystemTime::now(),
        )
        .map_err(Refusal::Claims)?;
        match self
            .keys
            .verify(
                &parsed.algorithm,
                &parsed.kid,
                &parsed.signing_input,
                &parsed.signature,
            )
            .await
        {
            Verdict::Verified => {}
            Verdict::Refused(refusal) => return Err(Refusal::Key(refusal)),
            Verdict::NotReady => return Err(Refusal::NotInitialized),
        }
        if let PrefixedMapping::Claim { claim, .. } = &self.spec.mapper.groups
            && !parsed.claims.contains_key(claim)
            && parsed
                .claims
                .get("_claim_names")
                .and_then(|names| names.get(claim))
                .is_some()
        {
            return Err(Refusal::DistributedClaims);
        }
        let mut user = self
            .spec
            .mapper
            .user(&parsed.claims)
            .map_err(Refusal::Mapping)?;
        user.add_authenticated_group();
        let expiry = UNIX_EPOCH + Duration::from_secs(u64::try_from(parsed.expiry).unwrap_or(0));
        Ok((user, expiry))
    }
}

impl ReloadTarget for StructuredAuthentication {
    fn target(&self) -> &'static str {
        TARGET
    }

    fn paths(&self) -> &[PathBuf] {
        self.settings.file.paths()
    }

    fn reload_if_changed(&self) -> Reload {
        match self.settings.file.reload_if_changed() {
            Reload::Applied => {
                let loaded = self.settings.current();
                match self.build(&loaded) {
                    Ok(live) => {
                        self.live.store(Arc::new(live));
                        self.metrics.applied(&loaded.hash, true);
                        Reload::Applied
                    }
                    Err(e) => {
                        self.metrics.reload_failed();
                        Reload::Failed(ReloadError::Build(Box::new(e)))
                    }
                }
            }
            Reload::Failed(e) => {
                // The file watcher logs it, with its cause; the previous configuration stays.
                self.metrics.reload_failed();
                Reload::Failed(e)
            }
            Reload::Unchanged => Reload::Unchanged,
        }
    }
}

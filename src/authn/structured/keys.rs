//! The keys of one `jwt[].issuer` of an authentication configuration, kept current, and the
//! check of a token's signature against them, as kube-apiserver v1.36 makes it
//! (k8s.io/apiserver `plugin/pkg/authenticator/token/oidc/oidc.go` over go-oidc v2.5.0's remote
//! key set and go-jose v2.6.3).
//!
//! Where the keys come from: the issuer's discovery document
//! (`{url}/.well-known/openid-configuration`, or `discoveryURL`), whose `issuer` must be the
//! configured URL exactly, then its `jwks_uri`. Every fetch reads both, so an issuer
//! that moves its key set is followed.
//!
//! When: once [`IssuerKeys::spawn`]ed, at once, then every [`RETRY_INTERVAL`] until a key set is
//! held (kube-apiserver polls its discovery every 10 s until it succeeds), then every
//! [`REFRESH_INTERVAL`]; each wait is spread ±10% so that nodes started together do not fetch
//! together. A token naming a key id the set does not hold asks for a fetch too: such fetches are
//! coalesced (a token that waited for a fetch does not start another) and at most one per
//! [`REFETCH_COOLDOWN`]; a key id still unknown after that fetch is refused. A failed fetch keeps
//! the keys held.
//!
//! What it costs a request: one atomic load of the key set ([`arc_swap`]), no lock, unless the
//! token names a key id the set lacks.
//!
//! Where this differs from kube-apiserver, on purpose or by necessity:
//! - kube-apiserver reads the discovery document once, and the key set only when a token needs
//!   it: again whenever a signature does not verify and the set's `Cache-Control` lifetime (none:
//!   at once) is within 30 s of its end, with no bound but the sharing of a fetch under way.
//!   Here the set is fetched ahead of tokens and refreshed on a schedule, and a token's fetch is
//!   bounded by [`REFETCH_COOLDOWN`]: a token signed with a key published within that time of
//!   the last fetch is refused here for that long.
//! - ES512 tokens (and P-521 keys) are not verified: `ring` has no P-521. RSA keys are used from
//!   2048 to 8192 bits (Go: from 1024), and PSS signatures only with a salt as long as the hash
//!   (RFC 7518; Go accepts any salt length).
//! - Only https is followed: not a `jwks_uri` or a redirect to plain HTTP, which Go follows.
//! - Every request ends within [`REQUEST_TIMEOUT`] (kube-apiserver: 30 s) and reads at most
//!   [`MAX_DOCUMENT_BYTES`] (kube-apiserver: no bound).

mod fetch;
mod jwks;
mod metrics;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use fetch::{FetchError, MAX_DOCUMENT_BYTES, REQUEST_TIMEOUT, RequestError};
pub use jwks::{BadKey, JwksError, SkippedKey, Unusable};
pub use metrics::KeysMetrics;

use crate::authn::jwt::Algorithm;
use crate::base::reports::Reports;
use fetch::IssuerClient;
use jwks::{Choice, KeySet};
use metrics::IssuerMetrics;

/// How often the keys are fetched again once held, before jitter.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(600);
/// How often a fetch is tried again until keys are held, before jitter: kube-apiserver's poll
/// of an issuer it could not initialize.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(10);
/// The least time between two fetches that tokens' unknown key ids ask for. An issuer publishes
/// a key before it signs with it, so a token whose key is newer than the last fetch is refused
/// for at most this long; a flood of invented key ids costs the issuer one fetch per node this
/// often.
pub const REFETCH_COOLDOWN: Duration = Duration::from_secs(10);

/// Where an issuer's keys come from: a `jwt[].issuer` of the authentication configuration.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IssuerSource {
    /// `issuer.url`: what the discovery document's `issuer` (and tokens' `iss`) must be, exactly.
    pub url: String,
    /// `issuer.discoveryURL`: where the discovery document is read instead of
    /// `{url}/.well-known/openid-configuration`.
    pub discovery_url: Option<String>,
    /// `issuer.certificateAuthority`: PEM text, inline as in the file; the only roots trusted
    /// for the issuer when set, the host's otherwise (as kube-apiserver).
    pub certificate_authority: Option<String>,
}

/// Why an issuer's keys could not be set up at all (nothing was fetched yet).
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// `certificateAuthority` holds no usable PEM certificate.
    #[error("certificateAuthority: {0}")]
    CertificateAuthority(#[source] crate::tls::PemError),
    /// A certificate of `certificateAuthority` cannot be a root.
    #[error("certificateAuthority: certificate {index} cannot be a trust root: {source}")]
    Root {
        /// Its place in the PEM text, from 1.
        index: usize,
        /// Why.
        #[source]
        source: rustls::Error,
    },
    /// No `certificateAuthority`, and the host has no CA certificate to trust instead.
    #[error(
        "no certificateAuthority and no usable CA certificate on the host (the first error: {first:?})"
    )]
    NoHostRoots {
        /// The first error met reading the host's certificates, if any.
        #[source]
        first: Option<rustls_native_certs::Error>,
    },
    /// The TLS client cannot be built.
    #[error("TLS client: {0}")]
    Tls(#[source] rustls::Error),
    /// The issuer URL or `discoveryURL` is not an https URL the client can ask.
    #[error("{field}: {source}")]
    Url {
        /// `url` or `discoveryURL`.
        field: &'static str,
        /// Why.
        #[source]
        source: RequestError,
    },
}

/// Why a token was refused by the issuer's keys: a metrics label and a log reason, never the
/// token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRefusal {
    /// Signed with an algorithm outside kube-apiserver's allowlist (`none`, `HS256`...), with
    /// ES512 (allowed there, but `ring` cannot verify P-521: a documented difference), or with
    /// one the key it names is not for.
    Algorithm,
    /// No key of the set has the token's key id, even after a fetch made since the token came
    /// (or within [`REFETCH_COOLDOWN`] of it).
    UnknownKey,
    /// The signature does not verify with the key (or any key) it may have been made with.
    Signature,
}

impl KeyRefusal {
    /// Every refusal, so each one's counter can exist at 0 from the start.
    pub const ALL: [KeyRefusal; 3] = [
        KeyRefusal::Algorithm,
        KeyRefusal::UnknownKey,
        KeyRefusal::Signature,
    ];

    /// The metrics label value.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyRefusal::Algorithm => "algorithm",
            KeyRefusal::UnknownKey => "unknown_key",
            KeyRefusal::Signature => "signature",
        }
    }

    /// What the log says.
    pub fn reason(self) -> &'static str {
        match self {
            KeyRefusal::Algorithm => {
                "JWT signed with an algorithm not accepted here, or not the named key's"
            }
            KeyRefusal::UnknownKey => "JWT signed with a key the issuer does not publish",
            KeyRefusal::Signature => "JWT signature invalid",
        }
    }
}

/// What the issuer's keys say of a token's signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Made with one of the issuer's keys.
    Verified,
    /// Refused.
    Refused(KeyRefusal),
    /// No key set fetched yet (kube-apiserver: "oidc: authenticator not initialized"): refused
    /// too, but because the issuer could not be reached, not because of the token.
    NotReady,
}

/// What one fetch found, for `check-config --probe`.
#[derive(Debug, Clone)]
pub struct ProbeReport {
    /// Where the discovery document was read.
    pub discovery_url: String,
    /// Where the key set was read (the document's `jwks_uri`).
    pub jwks_uri: String,
    /// The key set's hash as kube-apiserver's `jwks_fetch_last_key_set_info` labels it
    /// (`sha256:` and the hex SHA-256 of the document), to compare with the API server's.
    pub key_set_hash: String,
    /// The keys tokens are verified with here: key id and kind (`RSA 2048-bit`, `EC P-256`).
    pub usable: Vec<(String, String)>,
    /// The keys of the set tokens are never verified with here, and why.
    pub skipped: Vec<SkippedKey>,
}

/// One line for `check-config --probe`: where the documents were read and which keys are used.
impl std::fmt::Display for ProbeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "discovery {}, keys {} ({}): {} key(s) verify tokens on the node",
            self.discovery_url,
            self.jwks_uri,
            self.key_set_hash,
            self.usable.len()
        )?;
        for (kid, kind) in &self.usable {
            write!(f, "; {kid:?} {kind}")?;
        }
        for skipped in &self.skipped {
            write!(f, "; {:?} skipped: {}", skipped.kid, skipped.why)?;
        }
        Ok(())
    }
}

/// What the fetches of one issuer share, behind [`IssuerKeys::fetching`].
#[derive(Debug, Default)]
struct FetchState {
    /// When the last fetch started.
    started: Option<Instant>,
    /// The hash of the key set last fetched, to say when it changes.
    key_set_hash: Option<String>,
}

/// How long the waits are; only tests shorten them.
#[derive(Debug, Clone, Copy)]
struct Timing {
    retry: Duration,
    refresh: Duration,
    cooldown: Duration,
}

impl Timing {
    const PRODUCTION: Timing = Timing {
        retry: RETRY_INTERVAL,
        refresh: REFRESH_INTERVAL,
        cooldown: REFETCH_COOLDOWN,
    };
}

/// One issuer's keys, kept current by the task [`IssuerKeys::spawn`] starts, and the check of
/// tokens' signatures against them.
///
/// Shared as `Arc<IssuerKeys>` by the authenticator of the configuration naming the issuer; a
/// reloaded configuration builds its own, and the old one's task ends when its last `Arc` goes.
pub struct IssuerKeys {
    source: IssuerSource,
    client: IssuerClient,
    /// The key set last fetched; `None` until a fetch succeeds. Swapped whole, read without a
    /// lock by every token.
    keys: ArcSwapOption<KeySet>,
    /// Held while a fetch runs, so fetches run one at a time.
    fetching: Mutex<FetchState>,
    /// Fetches finished: a token that waited for `fetching` sees whether one ended meanwhile,
    /// and then uses its keys rather than starting another.
    fetches_done: AtomicU64,
    timing: Timing,
    metrics: IssuerMetrics,
    /// A failed fetch is logged once a minute per cause.
    reports: Reports<&'static str>,
    /// Whether the refresh task was started (it is started once).
    spawned: AtomicBool,
    /// Cancelled when this is dropped: the refresh task, sleeping, ends at once.
    stop: CancellationToken,
}

impl std::fmt::Debug for IssuerKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuerKeys")
            .field("issuer", &self.source.url)
            .field("discovery_url", &self.source.discovery_url)
            .finish_non_exhaustive()
    }
}

impl Drop for IssuerKeys {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl IssuerKeys {
    /// Builds the HTTPS client (the CA when given, else the host's roots); fetches nothing yet.
    /// Refuses an issuer URL or `discoveryURL` that is not https, and a CA that holds no usable
    /// certificate.
    pub fn new(source: IssuerSource, metrics: KeysMetrics) -> Result<Arc<IssuerKeys>, KeysError> {
        IssuerKeys::with_timing(source, metrics, Timing::PRODUCTION)
    }

    fn with_timing(
        source: IssuerSource,
        metrics: KeysMetrics,
        timing: Timing,
    ) -> Result<Arc<IssuerKeys>, KeysError> {
        fetch::https_uri(&source.url).map_err(|source| KeysError::Url {
            field: "url",
            source,
        })?;
        if let Some(discovery) = &source.discovery_url {
            fetch::https_uri(discovery).map_err(|source| KeysError::Url {
                field: "discoveryURL",
                source,
            })?;
        }
        let client = IssuerClient::new(source.certificate_authority.as_deref())?;
        let metrics = metrics.issuer(&source.url);
        Ok(Arc::new(IssuerKeys {
            source,
            client,
            keys: ArcSwapOption::empty(),
            fetching: Mutex::new(FetchState::default()),
            fetches_done: AtomicU64::new(0),
            timing,
            metrics,
            reports: Reports::default(),
            spawned: AtomicBool::new(false),
            stop: CancellationToken::new(),
        }))
    }

    /// The issuer these keys are for.
    pub fn source(&self) -> &IssuerSource {
        &self.source
    }

    /// Starts the refresh task on the current Tokio runtime (it panics outside one); a second
    /// call does nothing. The task holds only a `Weak` between fetches and ends once the last
    /// `Arc` is dropped (a reloaded configuration no longer names the issuer); a fetch under way
    /// then finishes first, within its timeouts.
    pub fn spawn(self: &Arc<Self>) {
        if self.spawned.swap(true, Ordering::Relaxed) {
            return;
        }
        let keys = Arc::downgrade(self);
        let stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                let Some(strong) = keys.upgrade() else {
                    return;
                };
                strong.refresh(Duration::ZERO).await;
                let pause = if strong.keys.load().is_some() {
                    strong.timing.refresh
                } else {
                    strong.timing.retry
                };
                drop(strong);
                let jitter = 0.9 + 0.2 * crate::apiserver::cache::random_fraction();
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(pause.mul_f64(jitter)) => {}
                }
            }
        });
    }

    /// Verifies a token's signature with the issuer's keys. `algorithm` and `kid` are the JWS
    /// header's `alg` and `kid` (`kid` may be empty); `signing_input` is what the signature
    /// covers (the header and payload as encoded, joined by a dot) and `signature` the decoded
    /// signature.
    ///
    /// As go-oidc: with no key set yet, [`Verdict::NotReady`] whatever the token; the key with
    /// the token's `kid` (every one of them, should several share it), or every key when it
    /// names none, is tried. Only keys that fit the algorithm are (an RSA key for RS and PS, an
    /// EC key for its curve's ES). A `kid` the set lacks, or a token without `kid` that no key
    /// fits, asks for a fetch (see the module's rules) before it is refused.
    pub async fn verify(
        &self,
        algorithm: &str,
        kid: &str,
        signing_input: &[u8],
        signature: &[u8],
    ) -> Verdict {
        let Some(set) = self.keys.load_full() else {
            return Verdict::NotReady;
        };
        // kube-apiserver's allowlist, less ES512 (refused here: a documented difference).
        let Some(algorithm) = Algorithm::from_jws_name(algorithm) else {
            return Verdict::Refused(KeyRefusal::Algorithm);
        };
        match set.choose(algorithm, kid, signing_input, signature) {
            Choice::Verified => return Verdict::Verified,
            Choice::Refused(refusal) => return Verdict::Refused(refusal),
            Choice::Unknown => {}
        }
        self.refresh(self.timing.cooldown).await;
        // The set only ever gets replaced, never emptied.
        let set = self.keys.load_full().unwrap_or(set);
        match set.choose(algorithm, kid, signing_input, signature) {
            Choice::Verified => Verdict::Verified,
            Choice::Refused(refusal) => Verdict::Refused(refusal),
            Choice::Unknown => Verdict::Refused(KeyRefusal::UnknownKey),
        }
    }

    /// One fetch of discovery and keys now, for `check-config --probe`: what was found, or why
    /// not. It neither replaces the keys held nor counts in the metrics.
    pub async fn probe(&self) -> Result<ProbeReport, FetchError> {
        let fetched = fetch::fetch(&self.client, &self.source).await?;
        Ok(ProbeReport {
            discovery_url: fetched.discovery_url,
            jwks_uri: fetched.jwks_uri,
            key_set_hash: fetched.key_set_hash,
            usable: fetched
                .set
                .keys
                .iter()
                .map(|key| (key.kid.clone(), key.kind()))
                .collect(),
            skipped: fetched.set.skipped,
        })
    }

    /// Fetches now, unless a fetch ended while this waited for the one under way, or one started
    /// within `cooldown`.
    async fn refresh(&self, cooldown: Duration) {
        let seen = self.fetches_done.load(Ordering::Acquire);
        let mut state = self.fetching.lock().await;
        if self.fetches_done.load(Ordering::Acquire) != seen
            || state.started.is_some_and(|at| at.elapsed() < cooldown)
        {
            return;
        }
        state.started = Some(Instant::now());
        self.fetch_and_keep(&mut state).await;
        self.fetches_done.fetch_add(1, Ordering::Release);
    }

    /// One fetch, counted and logged; a success replaces the keys, a failure keeps them.
    async fn fetch_and_keep(&self, state: &mut FetchState) {
        let started = Instant::now();
        match fetch::fetch(&self.client, &self.source).await {
            Ok(fetched) => {
                self.metrics
                    .fetched(Some(&fetched.key_set_hash), started.elapsed());
                if state.key_set_hash.as_deref() != Some(&fetched.key_set_hash) {
                    let skipped: Vec<String> = fetched
                        .set
                        .skipped
                        .iter()
                        .map(|key| format!("{:?}: {}", key.kid, key.why))
                        .collect();
                    info!(
                        issuer = %self.source.url,
                        jwks_uri = %fetched.jwks_uri,
                        hash = %fetched.key_set_hash,
                        keys = fetched.set.keys.len(),
                        skipped = %skipped.join("; "),
                        "a new key set of the JWT issuer is held (tokens signed with a skipped key are refused)"
                    );
                    state.key_set_hash = Some(fetched.key_set_hash);
                }
                self.keys.store(Some(Arc::new(fetched.set)));
            }
            Err(e) => {
                self.metrics.fetched(None, started.elapsed());
                if self.reports.admit(e.cause()) {
                    warn!(
                        issuer = %self.source.url,
                        url = e.url(),
                        error = %e,
                        hint = e.hint(),
                        "cannot fetch the JWT issuer's keys"
                    );
                }
            }
        }
    }
}

//! The key fetches' metrics, named and labelled after kube-apiserver's
//! (k8s.io/apiserver v0.36 `plugin/pkg/authenticator/token/oidc/metrics.go`:
//! `apiserver_authentication_jwt_authenticator_jwks_fetch_last_timestamp_seconds` and
//! `..._jwks_fetch_last_key_set_info`), so that a dashboard of the API server's issuers reads the
//! proxy's too: the issuer as `jwt_issuer_hash` (`sha256:` and the hex SHA-256 of its URL), the
//! key set as `hash` (the same of the document as fetched, byte for byte, so the proxy's and the
//! API server's are equal when they hold the same set), the outcome as `result` (`success`,
//! `failure`). No URL, no token, no key id is ever a label. kube-apiserver's
//! `apiserver_id_hash` has no counterpart: the proxy has no API server identity.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::base::metrics::{latency_histogram, register};

/// kube-apiserver's `getHash`: `sha256:` and the lowercase hex SHA-256 of `data`, or nothing
/// for nothing.
pub(crate) fn hash_label(data: &[u8]) -> String {
    if data.is_empty() {
        return String::new();
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, data);
    let mut label = String::with_capacity(7 + 64);
    label.push_str("sha256:");
    for byte in digest.as_ref() {
        // Writing into a String cannot fail.
        let _ = write!(label, "{byte:02x}");
    }
    label
}

/// An issuer and a fetch's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FetchLabels {
    jwt_issuer_hash: String,
    /// `success` or `failure`, kube-apiserver's values.
    result: &'static str,
}

/// An issuer and the key set it serves.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KeySetLabels {
    jwt_issuer_hash: String,
    hash: String,
}

/// An issuer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct IssuerLabels {
    jwt_issuer_hash: String,
}

/// What the families keep of one issuer: how many [`IssuerMetrics`] count for it (a reloaded
/// configuration's and the old one's, for a moment), and the hash of the key set last fetched.
#[derive(Debug, Default)]
struct IssuerState {
    holders: usize,
    key_set: Option<String>,
}

/// The key fetches' families, registered once and shared (cheaply cloned) by every issuer's
/// keys, of every configuration loaded.
#[derive(Debug, Clone)]
pub struct KeysMetrics {
    last_fetch: Family<FetchLabels, Gauge<f64, AtomicU64>>,
    key_set: Family<KeySetLabels, Gauge>,
    fetches: Family<FetchLabels, Counter>,
    fetch_duration: Family<IssuerLabels, Histogram, fn() -> Histogram>,
    /// Taken only when an issuer's keys are built, dropped, or fetched; never by a token.
    issuers: Arc<Mutex<HashMap<String, IssuerState>>>,
}

impl KeysMetrics {
    /// Registers the families in `registry` (under its `kubelet_auth_proxy_` prefix).
    pub fn register(registry: &mut Registry) -> KeysMetrics {
        let metrics = KeysMetrics {
            last_fetch: Family::default(),
            key_set: Family::default(),
            fetches: Family::default(),
            fetch_duration: Family::new_with_constructor(latency_histogram),
            issuers: Arc::default(),
        };
        register! { registry, metrics;
            last_fetch => "jwt_authenticator_jwks_fetch_last_timestamp_seconds", "Timestamp of the last successful or failed fetch of a JWT issuer's discovery document and key set, by result (success, failure) and jwt_issuer_hash (sha256: and the hex SHA-256 of the issuer URL), as kube-apiserver's apiserver_authentication_jwt_authenticator_jwks_fetch_last_timestamp_seconds";
            key_set => "jwt_authenticator_jwks_fetch_last_key_set_info", "1 for the key set last fetched from each JWT issuer, by jwt_issuer_hash and hash (sha256: and the hex SHA-256 of the key set document), as kube-apiserver's apiserver_authentication_jwt_authenticator_jwks_fetch_last_key_set_info: equal hashes, equal key sets";
            fetches => "jwt_authenticator_jwks_fetches", "Fetches of a JWT issuer's discovery document and key set, by jwt_issuer_hash and result (success, failure)";
            fetch_duration => "jwt_authenticator_jwks_fetch_duration_seconds", "How long fetches of a JWT issuer's discovery document and key set took, redirects included, by jwt_issuer_hash";
        }
        metrics
    }

    /// The metrics of the issuer at `url`; its fetch counters exist at 0 from now on.
    pub(crate) fn issuer(&self, url: &str) -> IssuerMetrics {
        let issuer_hash = hash_label(url.as_bytes());
        if let Ok(mut issuers) = self.issuers.lock() {
            issuers.entry(issuer_hash.clone()).or_default().holders += 1;
        }
        for result in ["success", "failure"] {
            drop(self.fetches.get_or_create(&FetchLabels {
                jwt_issuer_hash: issuer_hash.clone(),
                result,
            }));
        }
        IssuerMetrics {
            metrics: self.clone(),
            issuer_hash,
        }
    }
}

/// One issuer's view of [`KeysMetrics`]. When the last one of an issuer is dropped (no
/// configuration names it any longer), its series go, as kube-apiserver deletes them.
#[derive(Debug)]
pub(crate) struct IssuerMetrics {
    metrics: KeysMetrics,
    issuer_hash: String,
}

impl IssuerMetrics {
    /// Counts a fetch that took `took`: successful with the key set hashed `key_set` (which
    /// becomes the one `key_set_info` shows), or failed.
    pub(crate) fn fetched(&self, key_set: Option<&str>, took: Duration) {
        let result = if key_set.is_some() {
            "success"
        } else {
            "failure"
        };
        let labels = FetchLabels {
            jwt_issuer_hash: self.issuer_hash.clone(),
            result,
        };
        self.metrics.fetches.get_or_create(&labels).inc();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.metrics
            .last_fetch
            .get_or_create(&labels)
            .set(now.as_secs_f64());
        self.metrics
            .fetch_duration
            .get_or_create(&IssuerLabels {
                jwt_issuer_hash: self.issuer_hash.clone(),
            })
            .observe(took.as_secs_f64());
        if let Some(hash) = key_set
            && let Ok(mut issuers) = self.metrics.issuers.lock()
        {
            let state = issuers.entry(self.issuer_hash.clone()).or_default();
            if let Some(old) = state.key_set.replace(hash.to_owned())
                && old != hash
            {
                self.metrics.key_set.remove(&self.key_set_labels(old));
            }
            self.metrics
                .key_set
                .get_or_create(&self.key_set_labels(hash.to_owned()))
                .set(1);
        }
    }

    fn key_set_labels(&self, hash: String) -> KeySetLabels {
        KeySetLabels {
            jwt_issuer_hash: self.issuer_hash.clone(),
            hash,
        }
    }
}

impl Drop for IssuerMetrics {
    fn drop(&mut self) {
        let Ok(mut issuers) = self.metrics.issuers.lock() else {
            return;
        };
        let Some(state) = issuers.get_mut(&self.issuer_hash) else {
            return;
        };
        state.holders = state.holders.saturating_sub(1);
        if state.holders > 0 {
            return;
        }
        if let Some(hash) = state.key_set.take() {
            self.metrics.key_set.remove(&self.key_set_labels(hash));
        }
        issuers.remove(&self.issuer_hash);
        for result in ["success", "failure"] {
            let labels = FetchLabels {
                jwt_issuer_hash: self.issuer_hash.clone(),
                result,
            };
            self.metrics.fetches.remove(&labels);
            self.metrics.last_fetch.remove(&labels);
        }
        self.metrics.fetch_duration.remove(&IssuerLabels {
            jwt_issuer_hash: self.issuer_hash.clone(),
        });
    }
}

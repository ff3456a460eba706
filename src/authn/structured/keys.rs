//! STUB (not to be committed): replaced by the real keys module.
#![allow(missing_docs, dead_code, unused)]
use std::sync::Arc;
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IssuerSource {
    pub url: String,
    pub discovery_url: Option<String>,
    pub certificate_authority: Option<String>,
}
pub struct IssuerKeys {
    source: IssuerSource,
}
#[derive(Debug, thiserror::Error)]
#[error("stub")]
pub struct KeysError;
#[derive(Debug, thiserror::Error)]
#[error("stub")]
pub struct FetchError;
pub struct ProbeReport;
impl std::fmt::Display for ProbeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stub")
    }
}
pub enum Verdict {
    Verified,
    Refused(KeyRefusal),
    NotReady,
}
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRefusal {
    Algorithm,
    UnknownKey,
    Signature,
}
impl KeyRefusal {
    pub fn as_str(self) -> &'static str {
        "x"
    }
    pub fn reason(self) -> &'static str {
        "x"
    }
}
#[derive(Debug, Clone, Default)]
pub struct KeysMetrics;
impl KeysMetrics {
    pub fn register(_r: &mut prometheus_client::registry::Registry) -> KeysMetrics {
        KeysMetrics
    }
}
impl IssuerKeys {
    pub fn new(source: IssuerSource, _metrics: KeysMetrics) -> Result<Arc<IssuerKeys>, KeysError> {
        Ok(Arc::new(IssuerKeys { source }))
    }
    pub fn spawn(self: &Arc<Self>) {}
    pub async fn verify(&self, _a: &str, _k: &str, _s: &[u8], _sig: &[u8]) -> Verdict {
        Verdict::NotReady
    }
    pub async fn probe(&self) -> Result<ProbeReport, FetchError> {
        Err(FetchError)
    }
    pub fn source(&self) -> &IssuerSource {
        &self.source
    }
}

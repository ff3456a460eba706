//! May they do it: authorizer attributes, decisions, and the authorizer chain.
//!
//! The chain has the union semantics of `k8s.io/apiserver` (reference §6.1): authorizers are asked
//! in order, the first `Allow` or `Deny` wins, `NoOpinion` moves on. The kubelet's own loop over the
//! attribute list (reference §1.1: only `Allow` stops, an error is a 500 at once) lives in
//! [`authorize_request`].

pub mod attributes;
pub mod node;
pub mod policy;
pub mod rbac;

use std::fmt;
use std::sync::Arc;

use crate::authn::User;

/// The resource every kubelet attribute names.
pub const RESOURCE: &str = "nodes";
/// The API version every kubelet attribute carries.
pub const API_VERSION: &str = "v1";

/// The authorizer attributes of one kubelet request for one subresource, borrowed from the request.
///
/// The remaining Kubernetes fields are constant for the kubelet: namespace `""`, apiGroup `""`,
/// apiVersion [`API_VERSION`], resource [`RESOURCE`], resourceRequest `true`.
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'a> {
    /// The authenticated caller.
    pub user: &'a User,
    /// `get`, `create`, …; empty for methods the kubelet does not map (HEAD, OPTIONS, …).
    pub verb: &'a str,
    /// `proxy`, `stats`, `pods`, …
    pub subresource: &'a str,
    /// The Node name of the kubelet behind the proxy (`--node-name`).
    pub name: &'a str,
    /// The percent-decoded request path.
    pub path: &'a str,
}

/// Why an authorizer decided as it did. Never shown to clients (the kubelet discards it); it goes
/// to logs, audit and `explain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// A fixed message.
    Static(&'static str),
    /// A message built once and shared, e.g. a policy binding's description.
    Shared(Arc<str>),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Static(s) => f.write_str(s),
            Reason::Shared(s) => f.write_str(s),
        }
    }
}

/// An authorizer's answer. Errors are not a decision: they are `Err` and become HTTP 500.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The request may proceed.
    Allow(Reason),
    /// The request is refused by this authorizer; later authorizers are not asked.
    Deny(Reason),
    /// This authorizer does not decide; the next one is asked.
    NoOpinion(Reason),
}

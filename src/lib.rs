//! kubelet-auth-proxy: an authenticating, authorizing reverse proxy for the kubelet API.
#![forbid(unsafe_code)]

pub mod authn;
pub mod authz;
pub mod canonical_path;
pub mod demo;
pub mod proxy;

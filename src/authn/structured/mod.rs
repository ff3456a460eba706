//! `--authentication-config` (kube-apiserver's `AuthenticationConfiguration`): JWT issuers' tokens decided on the node.
pub mod keys;

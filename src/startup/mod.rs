//! From validated settings to running services, and keeping them current: [`assemble`] builds
//! the clients, metrics and audit log; [`reload`] swaps certificates and policies in when their
//! files change; [`probe`] (`check-config --probe`) reaches every dependency before the proxy
//! relies on it.

pub mod assemble;
pub mod probe;
pub mod reload;

//! Demo support: a stand-in kubelet to put the proxy in front of, on a laptop or in tests.
pub mod kubelet;

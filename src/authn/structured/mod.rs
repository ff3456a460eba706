//! kube-apiserver's AuthenticationConfiguration, read and decided on the node.

pub mod expressions;

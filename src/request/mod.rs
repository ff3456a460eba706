//! What happens to each request: the [`pipeline`] it goes through, and the one [`decision`] about
//! it, shared with `explain` (the path gate, authentication and authorization in the kubelet's
//! order, the kubelet's refusal bodies); its [`outcome`] and [`metrics`].

pub mod canonical_path;
pub mod decision;
pub mod metrics;
pub mod outcome;
pub mod pipeline;
pub mod responses;

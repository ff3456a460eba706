//! What happens to each request: the [`pipeline`] it goes through, and the one [`decision`] about
//! it, shared with `explain` (the path gate, authentication and authorization in the kubelet's
//! order, the kubelet's refusal bodies).

pub mod canonical_path;
pub mod decision;
pub mod held_body;
pub mod pipeline;
pub mod responses;
pub mod wire;

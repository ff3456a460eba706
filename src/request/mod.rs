//! The request's way through the proxy: the pipeline each request of a connection goes through
//! ([`pipeline`]), and the one decision about it, shared with `explain`: the path gate
//! ([`canonical_path`]), authentication and authorization in the kubelet's order ([`decision`]),
//! and the kubelet's refusal bodies ([`responses`]). Beside them, the response body that holds a
//! request's places until it ends ([`held_body`]), and the HTTP and WebSocket protocol knowledge
//! authentication and forwarding share ([`wire`]).

pub mod canonical_path;
pub mod decision;
pub mod held_body;
pub mod pipeline;
pub mod responses;
pub mod wire;

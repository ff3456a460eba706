//! The ground floor: what every layer above may use and nothing here knows of them. Token buckets
//! and their bounded table ([`budget`]), values rebuilt when their files change and the watcher
//! that rebuilds them ([`reload`], with the certificates' expiry in [`certificates`]), the
//! two-step shutdown every long-lived task watches ([`shutdown`]), a recurring failure said once
//! a minute per cause ([`reports`]), the HTTP and WebSocket knowledge authentication and
//! forwarding share ([`wire`]), the response body that holds a place until it ends
//! ([`held_body`]), the metric conventions every layer's metrics follow ([`metrics`]), Kubernetes'
//! name rules ([`names`]), and CEL as kube-apiserver evaluates it, for the layers that take
//! expressions from their configuration ([`cel`]: the environment, the load check and the cost
//! model; each caller declares its variables).

pub mod budget;
pub mod cel;
pub mod certificates;
pub mod held_body;
pub mod metrics;
pub mod names;
pub mod reload;
pub mod reports;
pub mod shutdown;
pub mod wire;

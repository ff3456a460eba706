//! The ground floor: what every layer above may use and nothing here knows of them. Token buckets
//! and their bounded table ([`budget`]), values rebuilt when their files change and the watcher
//! that rebuilds them ([`reload`], with the certificates' expiry in [`certificates`]), the
//! two-step shutdown every long-lived task watches ([`shutdown`]), a recurring failure said once
//! a minute per cause ([`reports`]), the HTTP and WebSocket knowledge authentication and
//! forwarding share ([`wire`]), the response body that holds a place until it ends
//! ([`held_body`]), the metric conventions every layer's metrics follow ([`metrics`]), and Kubernetes' name
//! rules ([`names`]).

pub mod budget;
pub mod certificates;
pub mod held_body;
pub mod metrics;
pub mod names;
pub mod reload;
pub mod reports;
pub mod shutdown;
pub mod wire;

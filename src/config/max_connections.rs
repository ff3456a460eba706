//! `--max-connections` fitted to the open-file limit, beside the descriptors the kubelet pools
//! and the API server clients may hold.

use std::path::Path;
use std::time::Duration;

use super::ConfigError;
use super::authorizers::{AuthorizationSettings, AuthorizerSettings};
use super::error::flag_error;
use super::flags::ProxyFlags;
use super::token_review::TokenReviewSettings;
use super::warnings::Warning;
use crate::server::descriptors;

/// How many API server clients serving will build: TokenReview and the webhooks that share a
/// kubeconfig and timeout share one (see [`mod@crate::startup::assemble`]).
pub(super) fn apiserver_clients(
    token_review: Option<&TokenReviewSettings>,
    authorization: &AuthorizationSettings,
) -> usize {
    let mut keys: Vec<(Option<&Path>, Duration)> = Vec::new();
    let token = token_review.map(|t| t.apiserver.sharing_key());
    let webhooks = authorization.authorizers.iter().filter_map(|a| match a {
        AuthorizerSettings::Webhook { apiserver, .. } => Some(apiserver.sharing_key()),
        _ => None,
    });
    for key in token.into_iter().chain(webhooks) {
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.len()
}

/// The client connections to serve: `--max-connections`, lowered (with a warning) when it does not
/// fit the descriptor limit beside the upstream and API server bounds (see [`descriptors`]).
pub(super) fn descriptor_plan(
    flags: &ProxyFlags,
    apiserver_clients: usize,
    serving_threads: usize,
    warnings: &mut Vec<Warning>,
) -> Result<u32, ConfigError> {
    let limit = descriptors::hard_limit();
    // Two review kinds per API server client.
    let apiserver = 2 * u64::from(flags.apiserver_max_reviews_inflight) * apiserver_clients as u64;
    let plan = descriptors::plan(
        limit,
        descriptors::Demand {
            max_connections: flags.max_connections,
            // Each serving thread keeps its own pool of kubelet connections, and a pool keeps
            // idle as many as its thread last had in flight: at worst each thread in turn had
            // every place.
            upstream: u64::from(flags.upstream_max_requests_inflight) * serving_threads as u64,
            apiserver,
        },
    )
    .map_err(|e| flag_error("--max-connections", e.to_string()))?;
    if let Some(warning) = plan.warning {
        warnings.push(Warning::new("--max-connections", warning));
    }
    Ok(plan.max_connections)
}

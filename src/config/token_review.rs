//! Bearer-token authentication (`--authentication-token-webhook`): the API server to send
//! TokenReviews to, the audiences and the cache TTL.

use std::time::Duration;

use super::ConfigError;
use super::error::{flag_error, kubeconfig_error};
use super::flags::ProxyFlags;
use crate::apiserver::ApiServerSettings;

/// TokenReview settings.
pub struct TokenReviewSettings {
    /// How to reach the API server.
    pub apiserver: ApiServerSettings,
    /// `--authentication-token-audiences`.
    pub audiences: Vec<String>,
    /// `--authentication-token-webhook-cache-ttl`.
    pub cache_ttl: Duration,
}

/// TokenReview: the kubeconfig, read only when `--authentication-token-webhook` is on.
pub(super) async fn token_review_settings(
    flags: &ProxyFlags,
) -> Result<Option<TokenReviewSettings>, ConfigError> {
    if !flags.authentication_token_audiences.is_empty() && !flags.authentication_token_webhook {
        return Err(flag_error(
            "--authentication-token-audiences",
            "given, but --authentication-token-webhook is off",
        ));
    }
    if !flags.authentication_token_webhook {
        return Ok(None);
    }
    Ok(Some(TokenReviewSettings {
        apiserver: ApiServerSettings::read(
            flags.kubeconfig.as_deref(),
            flags.apiserver_request_timeout,
        )
        .map_err(|e| kubeconfig_error(flags, e))?,
        audiences: flags.authentication_token_audiences.clone(),
        cache_ttl: flags.authentication_token_webhook_cache_ttl,
    }))
}

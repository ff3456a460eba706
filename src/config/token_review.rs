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
    /// `--service-account-issuer`; empty: discovered from the API server.
    pub service_account_issuers: Vec<String>,
    /// The audiences a service-account token is checked for on the node:
    /// `--authentication-token-audiences`, else `--api-audiences`; empty: not checked there.
    pub local_audiences: Vec<String>,
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
    for (flag, given) in [
        (
            "--service-account-issuer",
            !flags.service_account_issuer.is_empty(),
        ),
        ("--api-audiences", !flags.api_audiences.is_empty()),
    ] {
        if given && !flags.authentication_token_webhook {
            return Err(flag_error(
                flag,
                "given, but --authentication-token-webhook is off (no bearer token is checked)",
            ));
        }
    }
    if let Some(empty) = flags
        .service_account_issuer
        .iter()
        .chain(&flags.api_audiences)
        .find(|value| value.trim().is_empty())
    {
        let flag = if flags.service_account_issuer.contains(empty) {
            "--service-account-issuer"
        } else {
            "--api-audiences"
        };
        return Err(flag_error(flag, "an empty value"));
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
        service_account_issuers: flags.service_account_issuer.clone(),
        local_audiences: if flags.authentication_token_audiences.is_empty() {
            flags.api_audiences.clone()
        } else {
            flags.authentication_token_audiences.clone()
        },
    }))
}

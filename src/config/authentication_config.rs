//! `--authentication-config`: kube-apiserver's `AuthenticationConfiguration` file, loaded and
//! validated with the flags it must agree with ([`crate::authn::structured`]); what it holds that
//! the node cannot honour as the control plane does is a warning.

use super::ConfigError;
use super::error::reload_cause;
use super::flags::ProxyFlags;
use super::warnings::Warning;
use crate::authn::structured::StructuredSettings;
use crate::authn::structured::mapping::PrefixedMapping;
use crate::authn::structured::validation::Context;

const FLAG: &str = "--authentication-config";

/// The file, loaded, when the flag is given; warnings about what it configures.
pub(super) fn authentication_config_settings(
    flags: &ProxyFlags,
    warnings: &mut Vec<Warning>,
) -> Result<Option<StructuredSettings>, ConfigError> {
    let Some(path) = &flags.authentication_config else {
        return Ok(None);
    };
    let context = Context {
        service_account_issuers: flags.service_account_issuer.clone(),
        anonymous_flag: flags.anonymous_auth,
    };
    let settings =
        StructuredSettings::load(path.clone(), context).map_err(|e| reload_cause(FLAG, path, e))?;
    let loaded = settings.current();
    for (i, jwt) in loaded.validated.jwt.iter().enumerate() {
        if let Some(egress) = &jwt.egress_selector {
            warnings.push(Warning::new(
                FLAG,
                format!(
                    "jwt[{i}].issuer.egressSelectorType is {egress:?}: the proxy has no egress \
                     selector and fetches {}'s keys directly from the node",
                    jwt.source.url
                ),
            ));
        }
        if let PrefixedMapping::Claim { claim, prefix } = &jwt.mapper.username
            && prefix.is_empty()
            && claim != "email"
            && jwt.mapper.user_rules.is_empty()
        {
            warnings.push(Warning::new(
                FLAG,
                format!(
                    "jwt[{i}].claimMappings.username takes the claim {claim:?} with no prefix and                      no userValidationRules: whoever controls that claim at {} can be named                      system:node:… or system:kube-controller-manager on this node; add a prefix or                      a rule such as \"!user.username.startsWith('system:')\"",
                    jwt.source.url
                ),
            ));
        }
    }
    Ok(Some(settings))
}

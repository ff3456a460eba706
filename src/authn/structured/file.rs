//! The `AuthenticationConfiguration` file as kube-apiserver's `--authentication-config` reads it
//! (`apiserver.config.k8s.io/v1`, and the `v1beta1` and `v1alpha1` it still accepts, which have
//! the same fields): decoded strictly, so a misspelt or unknown field is an error, as
//! kube-apiserver's strict decoder makes it. Only the shape is checked here; the rules are
//! [`super::validation`]'s.

use serde::Deserialize;

/// The versions kube-apiserver 1.36 decodes.
pub const API_VERSIONS: [&str; 3] = [
    "apiserver.config.k8s.io/v1",
    "apiserver.config.k8s.io/v1beta1",
    "apiserver.config.k8s.io/v1alpha1",
];
/// The kind.
pub const KIND: &str = "AuthenticationConfiguration";
/// Largest file read: a configuration of 64 authenticators with their CA bundles and
/// expressions fits many times over, and a larger one is refused rather than read whole.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AuthenticationConfiguration {
    /// One of [`API_VERSIONS`].
    pub api_version: String,
    /// [`KIND`].
    pub kind: String,
    /// The JWT authenticators, in order.
    #[serde(default)]
    pub jwt: Vec<JwtAuthenticator>,
    /// Anonymous access, when the file governs it.
    #[serde(default)]
    pub anonymous: Option<Anonymous>,
}

/// One JWT issuer and how its tokens become users.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JwtAuthenticator {
    /// Where the tokens come from and whom they are for.
    pub issuer: Issuer,
    /// Conditions on the claims.
    #[serde(default)]
    pub claim_validation_rules: Vec<ClaimValidationRule>,
    /// How the claims become a user.
    #[serde(default)]
    pub claim_mappings: ClaimMappings,
    /// Conditions on the user.
    #[serde(default)]
    pub user_validation_rules: Vec<UserValidationRule>,
}

/// `jwt[].issuer`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Issuer {
    /// The issuer URL, which tokens name in `iss`.
    #[serde(default)]
    pub url: String,
    /// Where the discovery document is, when not under `url`.
    #[serde(default, rename = "discoveryURL")]
    pub discovery_url: String,
    /// PEM CA bundle for discovery and keys; the host's roots when empty.
    #[serde(default)]
    pub certificate_authority: String,
    /// The audiences a token must name one of.
    #[serde(default)]
    pub audiences: Vec<String>,
    /// Only `MatchAny`.
    #[serde(default)]
    pub audience_match_policy: String,
    /// `controlplane` or `cluster`: which network kube-apiserver reaches the issuer through.
    #[serde(default)]
    pub egress_selector_type: String,
}

/// `jwt[].claimValidationRules[]`: a claim with its required value, or a CEL expression.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClaimValidationRule {
    /// A claim that must be present as a string equal to `required_value`.
    #[serde(default)]
    pub claim: String,
    /// The value `claim` must have.
    #[serde(default)]
    pub required_value: String,
    /// A CEL expression over `claims` that must be true.
    #[serde(default)]
    pub expression: String,
    /// Said when `expression` is false.
    #[serde(default)]
    pub message: String,
}

/// `jwt[].claimMappings`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClaimMappings {
    /// The user name: required.
    #[serde(default)]
    pub username: PrefixedClaimOrExpression,
    /// The groups.
    #[serde(default)]
    pub groups: PrefixedClaimOrExpression,
    /// The uid.
    #[serde(default)]
    pub uid: ClaimOrExpression,
    /// Extra attributes.
    #[serde(default)]
    pub extra: Vec<ExtraMapping>,
}

/// A claim with a prefix, or a CEL expression.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrefixedClaimOrExpression {
    /// The claim.
    #[serde(default)]
    pub claim: String,
    /// Put before the claim's value; required with `claim` (empty to add none).
    #[serde(default)]
    pub prefix: Option<String>,
    /// A CEL expression over `claims`.
    #[serde(default)]
    pub expression: String,
}

/// A claim or a CEL expression.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClaimOrExpression {
    /// The claim.
    #[serde(default)]
    pub claim: String,
    /// A CEL expression over `claims`.
    #[serde(default)]
    pub expression: String,
}

/// `claimMappings.extra[]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtraMapping {
    /// A domain-prefixed, lowercase key.
    #[serde(default)]
    pub key: String,
    /// A CEL expression over `claims` giving a string or a list of strings.
    #[serde(default)]
    pub value_expression: String,
}

/// `jwt[].userValidationRules[]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UserValidationRule {
    /// A CEL expression over `user` that must be true.
    #[serde(default)]
    pub expression: String,
    /// Said when it is false.
    #[serde(default)]
    pub message: String,
}

/// `anonymous`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Anonymous {
    /// Whether requests with no credential are served as `system:anonymous`.
    #[serde(default)]
    pub enabled: bool,
    /// The paths they are, when listed; every path when none is.
    #[serde(default)]
    pub conditions: Vec<AnonymousCondition>,
}

/// `anonymous.conditions[]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AnonymousCondition {
    /// A request path, matched exactly.
    #[serde(default)]
    pub path: String,
}

/// Why the file could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not YAML or JSON of this shape (an unknown field, a wrong type).
    #[error("not an AuthenticationConfiguration: {0}")]
    Syntax(#[source] serde_saphyr::Error),
    /// Another version or kind.
    #[error(
        "apiVersion {api_version:?}, kind {kind:?}: expected kind {KIND} in apiserver.config.k8s.io/v1 (or v1beta1, v1alpha1)"
    )]
    Kind {
        /// What the file says.
        api_version: String,
        /// What the file says.
        kind: String,
    },
}

/// Decodes the file's text.
pub fn decode(text: &str) -> Result<AuthenticationConfiguration, DecodeError> {
    let config: AuthenticationConfiguration =
        serde_saphyr::from_str_with_options(text, serde_saphyr::options! { with_snippet: false })
            .map_err(DecodeError::Syntax)?;
    if !API_VERSIONS.contains(&config.api_version.as_str()) || config.kind != KIND {
        return Err(DecodeError::Kind {
            api_version: config.api_version,
            kind: config.kind,
        });
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_decodes_and_unknown_ones_are_refused() {
        let config = decode(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthenticationConfiguration\n\
             jwt:\n- issuer:\n    url: https://issuer.example\n    discoveryURL: https://d.example/x\n\
             \x20   audiences: [a, b]\n    audienceMatchPolicy: MatchAny\n\
             \x20 claimValidationRules:\n  - claim: hd\n    requiredValue: example.com\n\
             \x20 - expression: claims.admin == true\n    message: admins only\n\
             \x20 claimMappings:\n    username: {claim: sub, prefix: 'oidc:'}\n\
             \x20   groups: {expression: claims.roles}\n    uid: {claim: sub}\n\
             \x20   extra: [{key: example.com/tenant, valueExpression: claims.tenant}]\n\
             \x20 userValidationRules: [{expression: \"!user.username.startsWith('system:')\", message: no}]\n\
             anonymous: {enabled: true, conditions: [{path: /healthz}]}\n",
        )
        .unwrap();
        let jwt = &config.jwt[0];
        assert_eq!(jwt.issuer.discovery_url, "https://d.example/x");
        assert_eq!(jwt.issuer.audiences, ["a", "b"]);
        assert_eq!(jwt.claim_validation_rules[1].message, "admins only");
        assert_eq!(jwt.claim_mappings.username.prefix.as_deref(), Some("oidc:"));
        assert_eq!(jwt.claim_mappings.groups.prefix, None);
        assert_eq!(jwt.claim_mappings.extra[0].key, "example.com/tenant");
        assert_eq!(config.anonymous.unwrap().conditions[0].path, "/healthz");

        let unknown = decode(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthenticationConfiguration\n\
             jwt:\n- issuer: {url: https://i.example, audience: [a]}\n",
        );
        assert!(
            matches!(&unknown, Err(DecodeError::Syntax(e)) if e.to_string().contains("audience")),
            "{unknown:?}"
        );
        let kind =
            decode("apiVersion: apiserver.config.k8s.io/v1\nkind: AuthorizationConfiguration\n");
        assert!(matches!(kind, Err(DecodeError::Kind { .. })), "{kind:?}");
        for version in API_VERSIONS {
            decode(&format!("apiVersion: {version}\nkind: {KIND}\n")).unwrap();
        }
    }
}

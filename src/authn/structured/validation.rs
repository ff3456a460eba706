//! The rules kube-apiserver v1.36 applies to an `AuthenticationConfiguration`
//! (`staging/src/k8s.io/apiserver/pkg/apis/apiserver/validation/validation.go`
//! `ValidateAuthenticationConfiguration`), every refusal named by its field path and worded as
//! kube-apiserver words it (`jwt[0].issuer.url: Invalid value: "http://x": URL scheme must be
//! https`), all of them reported at once. What passes is compiled: the CEL expressions
//! ([`super::expressions`]) and the mappings ([`super::mapping`]).
//!
//! Beyond kube-apiserver's own rules, the file and the proxy's flags must agree: the
//! `anonymous` stanza and `--anonymous-auth=true` exclude each other (kube-apiserver refuses the
//! flag with the stanza at all; this proxy's flag defaults to false, so only `true` can be told).

use std::collections::HashSet;
use std::fmt;

use super::expressions::{self, Expression, Returns, Scope};
use super::file::{self, AuthenticationConfiguration, PrefixedClaimOrExpression};
use super::keys::IssuerSource;
use super::mapping::{Mapper, PrefixedMapping, Rule, UidMapping};
use crate::base::names::is_dns1123_subdomain;

/// kube-apiserver's bound on `jwt`.
pub const MAX_AUTHENTICATORS: usize = 64;

/// What the rules need beyond the file.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// The service-account issuers (`--service-account-issuer`), which no JWT authenticator may
    /// claim.
    pub service_account_issuers: Vec<String>,
    /// `--anonymous-auth`.
    pub anonymous_flag: bool,
}

/// One JWT authenticator, validated and compiled.
#[derive(Debug, Clone)]
pub struct JwtSpec {
    /// Where its keys come from.
    pub source: IssuerSource,
    /// The audiences a token must name one of.
    pub audiences: Vec<String>,
    /// `issuer.egressSelectorType`, when set: the proxy has no egress selector.
    pub egress_selector: Option<String>,
    /// Its mappings and rules.
    pub mapper: Mapper,
}

/// Anonymous access as the file sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnonymousRule {
    /// Off.
    Disabled,
    /// On for every path.
    Everywhere,
    /// On for these paths only, matched exactly.
    Paths(HashSet<String>),
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Validated {
    /// The JWT authenticators, in the file's order.
    pub jwt: Vec<JwtSpec>,
    /// `anonymous`, when the file has it (else `--anonymous-auth` decides).
    pub anonymous: Option<AnonymousRule>,
}

/// One line for `check-config`: which issuers are decided on the node, and anonymous access.
impl fmt::Display for Validated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let issuers: Vec<&str> = self.jwt.iter().map(|jwt| jwt.source.url.as_str()).collect();
        match issuers.as_slice() {
            [] => f.write_str("no JWT issuer")?,
            issuers => write!(f, "tokens of {} decided on the node", issuers.join(", "))?,
        }
        match &self.anonymous {
            None => f.write_str("; anonymous access as --anonymous-auth says"),
            Some(AnonymousRule::Disabled) => f.write_str("; anonymous access off"),
            Some(AnonymousRule::Everywhere) => f.write_str("; anonymous access on every path"),
            Some(AnonymousRule::Paths(paths)) => {
                let mut paths: Vec<&str> = paths.iter().map(String::as_str).collect();
                paths.sort_unstable();
                write!(f, "; anonymous access only on {}", paths.join(", "))
            }
        }
    }
}

/// What is wrong with one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// Missing, with an optional detail.
    Required(String),
    /// Wrong: the value as quoted, and why.
    Invalid {
        /// The value, quoted as kube-apiserver quotes it.
        value: String,
        /// Why.
        detail: String,
    },
    /// Given twice: the value, quoted.
    Duplicate(String),
    /// Too many items.
    TooMany {
        /// How many.
        count: usize,
        /// The most allowed.
        max: usize,
    },
    /// Not allowed here.
    Forbidden(String),
}

/// One refusal, at its field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field path, e.g. `jwt[0].claimMappings.username.prefix`.
    pub path: String,
    /// What is wrong.
    pub problem: Problem,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = &self.path;
        match &self.problem {
            Problem::Required(detail) if detail.is_empty() => write!(f, "{path}: Required value"),
            Problem::Required(detail) => write!(f, "{path}: Required value: {detail}"),
            Problem::Invalid { value, detail } => {
                write!(f, "{path}: Invalid value: {value}: {detail}")
            }
            Problem::Duplicate(value) => write!(f, "{path}: Duplicate value: {value}"),
            Problem::TooMany { count, max } => {
                write!(
                    f,
                    "{path}: Too many: {count}: must have at most {max} items"
                )
            }
            Problem::Forbidden(detail) => write!(f, "{path}: Forbidden: {detail}"),
        }
    }
}

/// Every refusal of a file, shown as kube-apiserver aggregates them (one alone, several as
/// `[a, b]`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct FieldErrors(pub Vec<FieldError>);

impl fmt::Display for FieldErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let [only] = self.0.as_slice() {
            return write!(f, "{only}");
        }
        f.write_str("[")?;
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{error}")?;
        }
        f.write_str("]")
    }
}

/// Go's `%q` of a string, near enough for a message: Rust's debug quoting.
fn quote(value: &str) -> String {
    format!("{value:?}")
}

/// The errors of one pass, and where they are.
struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, path: impl Into<String>, problem: Problem) {
        self.0.push(FieldError {
            path: path.into(),
            problem,
        });
    }

    fn required(&mut self, path: impl Into<String>, detail: &str) {
        self.push(path, Problem::Required(detail.to_owned()));
    }

    fn invalid(&mut self, path: impl Into<String>, value: &str, detail: impl Into<String>) {
        self.push(
            path,
            Problem::Invalid {
                value: quote(value),
                detail: detail.into(),
            },
        );
    }

    fn duplicate(&mut self, path: impl Into<String>, value: &str) {
        self.push(path, Problem::Duplicate(quote(value)));
    }

    /// Compiles `expression`, recording why not at `path`.
    fn compile(
        &mut self,
        path: String,
        expression: &str,
        scope: Scope,
        returns: Returns,
    ) -> Option<Expression> {
        match expressions::compile(expression, scope, returns) {
            Ok(compiled) => Some(compiled),
            Err(e) => {
                self.invalid(path, expression, e.to_string());
                None
            }
        }
    }
}

/// Validates `config` as kube-apiserver does, and compiles it.
pub fn validate(
    config: &AuthenticationConfiguration,
    context: &Context,
) -> Result<Validated, FieldErrors> {
    let mut errors = Errors(Vec::new());
    if config.jwt.len() > MAX_AUTHENTICATORS {
        errors.push(
            "jwt",
            Problem::TooMany {
                count: config.jwt.len(),
                max: MAX_AUTHENTICATORS,
            },
        );
        return Err(FieldErrors(errors.0));
    }
    let mut jwt = Vec::with_capacity(config.jwt.len());
    let (mut issuers, mut discovery_urls) = (HashSet::new(), HashSet::new());
    for (i, authenticator) in config.jwt.iter().enumerate() {
        let at = format!("jwt[{i}]");
        let spec = validate_authenticator(authenticator, &at, context, &mut errors);
        let issuer = &authenticator.issuer;
        if !issuers.insert(issuer.url.as_str()) {
            errors.duplicate(format!("{at}.issuer.url"), &issuer.url);
        }
        if !issuer.discovery_url.is_empty() && !discovery_urls.insert(issuer.discovery_url.as_str())
        {
            errors.duplicate(format!("{at}.issuer.discoveryURL"), &issuer.discovery_url);
        }
        jwt.extend(spec);
    }
    let anonymous = config.anonymous.as_ref().map(|anonymous| {
        if !anonymous.enabled && !anonymous.conditions.is_empty() {
            let paths: Vec<&str> = anonymous
                .conditions
                .iter()
                .map(|c| c.path.as_str())
                .collect();
            errors.push(
                "anonymous.conditions",
                Problem::Invalid {
                    value: format!("{paths:?}"),
                    detail: "enabled should be set to true when conditions are defined".into(),
                },
            );
        }
        if context.anonymous_flag {
            errors.push(
                "anonymous",
                Problem::Forbidden(
                    "--anonymous-auth cannot be set when the authentication configuration file \
                     has an anonymous field: set anonymous.enabled in the file instead"
                        .into(),
                ),
            );
        }
        match (anonymous.enabled, anonymous.conditions.is_empty()) {
            (false, _) => AnonymousRule::Disabled,
            (true, true) => AnonymousRule::Everywhere,
            (true, false) => AnonymousRule::Paths(
                anonymous
                    .conditions
                    .iter()
                    .map(|c| c.path.clone())
                    .collect(),
            ),
        }
    });
    if errors.0.is_empty() {
        Ok(Validated { jwt, anonymous })
    } else {
        Err(FieldErrors(errors.0))
    }
}

fn validate_authenticator(
    authenticator: &file::JwtAuthenticator,
    at: &str,
    context: &Context,
    errors: &mut Errors,
) -> Option<JwtSpec> {
    let before = errors.0.len();
    let issuer = &authenticator.issuer;
    let path = |field: &str| format!("{at}.issuer.{field}");
    if issuer.url.is_empty() {
        errors.required(path("url"), "");
    } else {
        validate_url(
            &issuer.url,
            &context.service_account_issuers,
            &path("url"),
            errors,
        );
    }
    if !issuer.discovery_url.is_empty() {
        if !issuer.url.is_empty()
            && issuer.url.trim_end_matches('/') == issuer.discovery_url.trim_end_matches('/')
        {
            errors.invalid(
                path("discoveryURL"),
                &issuer.discovery_url,
                "discoveryURL must be different from URL",
            );
        }
        validate_url(&issuer.discovery_url, &[], &path("discoveryURL"), errors);
    }
    validate_audiences(issuer, at, errors);
    if !issuer.certificate_authority.is_empty()
        && crate::tls::parse_certs(issuer.certificate_authority.as_bytes())
            .map_or(true, |certs| certs.is_empty())
    {
        errors.push(
            path("certificateAuthority"),
            Problem::Invalid {
                value: quote("<omitted>"),
                detail: "data does not contain any valid RSA or ECDSA certificates".into(),
            },
        );
    }
    if !issuer.egress_selector_type.is_empty()
        && !matches!(
            issuer.egress_selector_type.as_str(),
            "controlplane" | "cluster"
        )
    {
        errors.invalid(
            path("egressSelectorType"),
            &issuer.egress_selector_type,
            "egress selector must be either controlplane or cluster",
        );
    }
    let mut uses_email_verified = false;
    let claim_rules = claim_validation_rules(authenticator, at, errors, &mut uses_email_verified);
    let mappings = &authenticator.claim_mappings;
    let mapping_path = format!("{at}.claimMappings");
    let username = prefixed(
        &mappings.username,
        &format!("{mapping_path}.username"),
        true,
        errors,
    );
    let uses_email =
        matches!(&username, Some(PrefixedMapping::Expression(e)) if e.selects("claims", "email"));
    uses_email_verified |= matches!(&username, Some(PrefixedMapping::Expression(e)) if e.selects("claims", "email_verified"));
    let groups = prefixed(
        &mappings.groups,
        &format!("{mapping_path}.groups"),
        false,
        errors,
    );
    let uid = match (&mappings.uid.claim, &mappings.uid.expression) {
        (claim, expression) if !claim.is_empty() && !expression.is_empty() => {
            errors.invalid(
                format!("{mapping_path}.uid"),
                "",
                "claim and expression can't both be set",
            );
            None
        }
        (_, expression) if !expression.is_empty() => errors
            .compile(
                format!("{mapping_path}.uid.expression"),
                expression,
                Scope::Claims,
                Returns::Any,
            )
            .map(UidMapping::Expression),
        (claim, _) if !claim.is_empty() => Some(UidMapping::Claim(claim.clone())),
        _ => Some(UidMapping::None),
    };
    let mut extra = Vec::new();
    let mut keys = HashSet::new();
    for (i, mapping) in mappings.extra.iter().enumerate() {
        let path = format!("{mapping_path}.extra[{i}]");
        validate_extra_key(&mapping.key, &format!("{path}.key"), errors);
        if !keys.insert(mapping.key.as_str()) {
            errors.duplicate(format!("{path}.key"), &mapping.key);
            continue;
        }
        if mapping.value_expression.is_empty() {
            errors.required(format!("{path}.valueExpression"), "");
            continue;
        }
        if let Some(expression) = errors.compile(
            format!("{path}.valueExpression"),
            &mapping.value_expression,
            Scope::Claims,
            Returns::Any,
        ) {
            uses_email_verified |= expression.selects("claims", "email_verified");
            extra.push((mapping.key.clone(), expression));
        }
    }
    if uses_email && !uses_email_verified {
        errors.invalid(
            format!("{mapping_path}.username.expression"),
            &mappings.username.expression,
            "claims.email_verified must be used in claimMappings.username.expression or \
             claimMappings.extra[*].valueExpression or claimValidationRules[*].expression when \
             claims.email is used in claimMappings.username.expression",
        );
    }
    let user_rules = user_validation_rules(authenticator, at, errors);
    let (Some(username), Some(groups), Some(uid), Some((required_claims, claim_rules))) =
        (username, groups, uid, claim_rules)
    else {
        return None;
    };
    if errors.0.len() > before {
        return None;
    }
    Some(JwtSpec {
        source: IssuerSource {
            url: issuer.url.clone(),
            discovery_url: (!issuer.discovery_url.is_empty()).then(|| issuer.discovery_url.clone()),
            certificate_authority: (!issuer.certificate_authority.is_empty())
                .then(|| issuer.certificate_authority.clone()),
        },
        audiences: issuer.audiences.clone(),
        egress_selector: (!issuer.egress_selector_type.is_empty())
            .then(|| issuer.egress_selector_type.clone()),
        mapper: Mapper {
            username,
            groups,
            uid,
            extra,
            required_claims,
            claim_rules,
            user_rules,
        },
    })
}

/// kube-apiserver's `validateURL`: https, no user, no query, no fragment, not a disallowed issuer.
fn validate_url(url: &str, disallowed: &[String], path: &str, errors: &mut Errors) {
    if disallowed.iter().any(|d| d == url) {
        let mut sorted: Vec<&str> = disallowed.iter().map(String::as_str).collect();
        sorted.sort_unstable();
        errors.invalid(
            path,
            url,
            format!(
                "URL must not overlap with disallowed issuers: [{}]",
                sorted.join(" ")
            ),
        );
    }
    if url.chars().any(|c| c.is_ascii_control()) {
        errors.invalid(path, url, "net/url: invalid control character in URL");
        return;
    }
    let (rest, fragment) = url.split_once('#').unwrap_or((url, ""));
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let scheme = rest
        .split_once(':')
        .map(|(scheme, _)| scheme)
        .filter(|scheme| {
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        })
        .unwrap_or("");
    if !scheme.eq_ignore_ascii_case("https") {
        errors.invalid(path, url, "URL scheme must be https");
    }
    let authority = rest
        .get(scheme.len()..)
        .and_then(|r| r.strip_prefix("://"))
        .map(|r| r.split('/').next().unwrap_or_default());
    if authority.is_some_and(|a| a.contains('@')) {
        errors.invalid(path, url, "URL must not contain a username or password");
    }
    if !query.is_empty() {
        errors.invalid(path, url, "URL must not contain a query");
    }
    if !fragment.is_empty() {
        errors.invalid(path, url, "URL must not contain a fragment");
    }
}

fn validate_audiences(issuer: &file::Issuer, at: &str, errors: &mut Errors) {
    let path = format!("{at}.issuer.audiences");
    let policy_path = format!("{at}.issuer.audienceMatchPolicy");
    if issuer.audiences.is_empty() {
        errors.required(&path, &format!("at least one {path} is required"));
        return;
    }
    let mut seen = HashSet::new();
    for (i, audience) in issuer.audiences.iter().enumerate() {
        if audience.is_empty() {
            errors.required(format!("{path}[{i}]"), "");
        }
        if !seen.insert(audience.as_str()) {
            errors.duplicate(format!("{path}[{i}]"), audience);
        }
    }
    let policy = issuer.audience_match_policy.as_str();
    if issuer.audiences.len() > 1 && policy != "MatchAny" {
        errors.invalid(
            &policy_path,
            policy,
            "audienceMatchPolicy must be MatchAny for multiple audiences",
        );
    }
    if issuer.audiences.len() == 1 && !policy.is_empty() && policy != "MatchAny" {
        errors.invalid(
            &policy_path,
            policy,
            "audienceMatchPolicy must be empty or MatchAny for single audience",
        );
    }
}

/// The claims a rule requires and the rules' expressions; `None` when one is refused.
type ClaimRules = (Vec<(String, String)>, Vec<Rule>);

fn claim_validation_rules(
    authenticator: &file::JwtAuthenticator,
    at: &str,
    errors: &mut Errors,
    uses_email_verified: &mut bool,
) -> Option<ClaimRules> {
    let before = errors.0.len();
    let (mut claims, mut expressions) = (HashSet::new(), HashSet::new());
    let (mut required, mut rules) = (Vec::new(), Vec::new());
    for (i, rule) in authenticator.claim_validation_rules.iter().enumerate() {
        let path = format!("{at}.claimValidationRules[{i}]");
        match (rule.claim.is_empty(), rule.expression.is_empty()) {
            (false, false) => {
                errors.invalid(&path, &rule.claim, "claim and expression can't both be set");
            }
            (true, true) => errors.required(&path, "claim or expression is required"),
            (false, true) => {
                if !rule.message.is_empty() {
                    errors.invalid(
                        format!("{path}.message"),
                        &rule.message,
                        "may not be specified when claim is set",
                    );
                }
                if !claims.insert(rule.claim.as_str()) {
                    errors.duplicate(format!("{path}.claim"), &rule.claim);
                }
                required.push((rule.claim.clone(), rule.required_value.clone()));
            }
            (true, false) => {
                if !rule.required_value.is_empty() {
                    errors.invalid(
                        format!("{path}.requiredValue"),
                        &rule.required_value,
                        "may not be specified when expression is set",
                    );
                }
                if !expressions.insert(rule.expression.as_str()) {
                    errors.duplicate(format!("{path}.expression"), &rule.expression);
                    continue;
                }
                if let Some(expression) = errors.compile(
                    format!("{path}.expression"),
                    &rule.expression,
                    Scope::Claims,
                    Returns::Bool,
                ) {
                    *uses_email_verified |= expression.selects("claims", "email_verified");
                    rules.push(Rule {
                        expression,
                        message: rule.message.clone(),
                    });
                }
            }
        }
    }
    (errors.0.len() == before).then_some((required, rules))
}

/// kube-apiserver's `validatePrefixClaimOrExpression`.
fn prefixed(
    mapping: &PrefixedClaimOrExpression,
    path: &str,
    required: bool,
    errors: &mut Errors,
) -> Option<PrefixedMapping> {
    match (mapping.claim.is_empty(), mapping.expression.is_empty()) {
        (false, false) => {
            errors.invalid(path, "", "claim and expression can't both be set");
            None
        }
        (true, true) if required => {
            errors.required(path, "claim or expression is required");
            None
        }
        (true, true) => Some(PrefixedMapping::None),
        (true, false) => {
            if let Some(prefix) = &mapping.prefix {
                errors.invalid(
                    format!("{path}.prefix"),
                    prefix,
                    "may not be specified when expression is set",
                );
            }
            let expression = errors.compile(
                format!("{path}.expression"),
                &mapping.expression,
                Scope::Claims,
                Returns::Any,
            )?;
            mapping
                .prefix
                .is_none()
                .then_some(PrefixedMapping::Expression(expression))
        }
        (false, true) => match &mapping.prefix {
            None => {
                errors.required(
                    format!("{path}.prefix"),
                    "prefix is required when claim is set. It can be set to an empty string to \
                     disable prefixing",
                );
                None
            }
            Some(prefix) => Some(PrefixedMapping::Claim {
                claim: mapping.claim.clone(),
                prefix: prefix.clone(),
            }),
        },
    }
}

/// apimachinery's `IsDomainPrefixedPath`, lowercase, and not a Kubernetes domain.
fn validate_extra_key(key: &str, path: &str, errors: &mut Errors) {
    if key.is_empty() {
        errors.required(path, "");
    } else {
        match key.split_once('/') {
            Some((host, rest)) if !host.is_empty() && !rest.is_empty() => {
                if host.len() > 253 {
                    errors.invalid(path, host, "must be no more than 253 characters");
                }
                if !is_dns1123_subdomain(host) {
                    errors.invalid(
                        path,
                        host,
                        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric \
                         characters, '-' or '.', and must start and end with an alphanumeric \
                         character (e.g. 'example.com', regex used for validation is \
                         '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
                    );
                }
                let http_path =
                    |c: char| c.is_ascii_alphanumeric() || "/-._~%!$&'()*+,;=:".contains(c);
                if !rest.chars().all(http_path) {
                    errors.invalid(
                        path,
                        rest,
                        "Invalid path (regex used for validation is \
                         '[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+')",
                    );
                }
            }
            _ => errors.invalid(
                path,
                key,
                "must be a domain-prefixed path (such as \"acme.io/foo\")",
            ),
        }
    }
    if key != key.to_lowercase() {
        errors.invalid(path, key, "must be lowercase");
    }
    let domain = key.split_once('/').map_or("", |(domain, _)| domain);
    if ["kubernetes.io", "k8s.io"]
        .iter()
        .any(|reserved| domain == *reserved || domain.ends_with(&format!(".{reserved}")))
    {
        errors.invalid(
            path,
            key,
            "k8s.io, kubernetes.io and their subdomains are reserved for Kubernetes use",
        );
    }
}

fn user_validation_rules(
    authenticator: &file::JwtAuthenticator,
    at: &str,
    errors: &mut Errors,
) -> Vec<Rule> {
    let mut seen = HashSet::new();
    let mut rules = Vec::new();
    for (i, rule) in authenticator.user_validation_rules.iter().enumerate() {
        let path = format!("{at}.userValidationRules[{i}].expression");
        if rule.expression.is_empty() {
            errors.required(&path, "");
            continue;
        }
        if !seen.insert(rule.expression.as_str()) {
            errors.duplicate(&path, &rule.expression);
            continue;
        }
        if let Some(expression) = errors.compile(path, &rule.expression, Scope::User, Returns::Bool)
        {
            rules.push(Rule {
                expression,
                message: rule.message.clone(),
            });
        }
    }
    rules
}

#[cfg(test)]
mod tests;

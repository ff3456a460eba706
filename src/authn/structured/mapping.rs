//! A verified token's claims → the user, as kube-apiserver's JWT authenticator makes it
//! (`plugin/pkg/authenticator/token/oidc/oidc.go` `AuthenticateToken` and its `get*` helpers,
//! v1.36): the user name, groups, uid and extra (the credential id from `jti` first), then the
//! claims a rule requires, the claim validation rules and the user validation rules, in that
//! order; the first failure refuses the token.
//!
//! A claim mapped by name is read as Go's `encoding/json` reads it into the field's type: a
//! `null` is the type's zero value (an empty string, no groups), any other type mismatch is an
//! error. Groups may be one string or a list of them; an absent groups claim is no group, an
//! absent user name or uid claim an error. A claim mapped by a CEL expression
//! ([`super::expressions`]) must give a string (user name, uid) or a string, a list of strings
//! or null (groups, extra; empty strings dropped).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::expressions::{EvaluationError, Expression, Input, Output};
use crate::authn::User;
use crate::authn::x509::CREDENTIAL_ID_EXTRA;

/// How a user name or groups are read: a claim with a prefix, or an expression.
#[derive(Debug, Clone)]
pub enum PrefixedMapping {
    /// Not mapped (groups only).
    None,
    /// The claim's value, each prefixed (an empty prefix adds nothing).
    Claim {
        /// The claim.
        claim: String,
        /// The prefix.
        prefix: String,
    },
    /// A CEL expression over `claims`.
    Expression(Expression),
}

/// How the uid is read.
#[derive(Debug, Clone)]
pub enum UidMapping {
    /// Not mapped: no uid.
    None,
    /// The claim's value.
    Claim(String),
    /// A CEL expression over `claims`.
    Expression(Expression),
}

/// A rule's expression and what is said when it is false.
#[derive(Debug, Clone)]
pub struct Rule {
    /// The expression, which must be true.
    pub expression: Expression,
    /// The rule's message.
    pub message: String,
}

/// An authenticator's claim mappings and rules, compiled.
#[derive(Debug, Clone)]
pub struct Mapper {
    /// `claimMappings.username`.
    pub username: PrefixedMapping,
    /// `claimMappings.groups`.
    pub groups: PrefixedMapping,
    /// `claimMappings.uid`.
    pub uid: UidMapping,
    /// `claimMappings.extra`: key and expression.
    pub extra: Vec<(String, Expression)>,
    /// `claimValidationRules` with `claim`: claim and required value.
    pub required_claims: Vec<(String, String)>,
    /// `claimValidationRules` with `expression`.
    pub claim_rules: Vec<Rule>,
    /// `userValidationRules`.
    pub user_rules: Vec<Rule>,
}

/// Why a verified token yields no user. The text is for logs: it quotes claim names and
/// expressions, never claim values beyond what kube-apiserver's own errors show.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MappingError {
    /// A claim mapped by name is absent or not of its type.
    #[error("parse {what} claim {claim:?}: {reason}")]
    Claim {
        /// user name, groups, uid, or a required claim.
        what: &'static str,
        /// The claim.
        claim: String,
        /// Why.
        reason: &'static str,
    },
    /// `email_verified` is present and not true.
    #[error("email not verified")]
    EmailNotVerified,
    /// An expression failed or gave the wrong type.
    #[error("error evaluating {what} claim expression: {source}")]
    Expression {
        /// Which mapping.
        what: &'static str,
        /// Why.
        #[source]
        source: ExpressionFailure,
    },
    /// A user name expression gave an empty string.
    #[error("empty username via CEL expression is not allowed")]
    EmptyUsername,
    /// A required claim has another value.
    #[error("required claim {claim} value does not match")]
    RequiredValue {
        /// The claim.
        claim: String,
    },
    /// A claim validation rule is false, failed, or is not a bool.
    #[error("error evaluating claim validation expression: {0}")]
    ClaimRule(#[source] ExpressionFailure),
    /// A user validation rule is false, failed, or is not a bool.
    #[error("error evaluating user info validation rule: {0}")]
    UserRule(#[source] ExpressionFailure),
}

/// How one expression failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ExpressionFailure {
    /// It could not be evaluated.
    #[error(transparent)]
    Evaluation(#[from] EvaluationError),
    /// It gave a value of the wrong type.
    #[error("{0}")]
    Type(&'static str),
    /// A validation rule is false.
    #[error("validation expression '{expression}' failed: {message}")]
    False {
        /// The expression.
        expression: String,
        /// The rule's message.
        message: String,
    },
}

impl Mapper {
    /// Whether any mapping or claim rule is an expression: only then are the claims made a CEL
    /// value.
    fn uses_claims_expressions(&self) -> bool {
        matches!(self.username, PrefixedMapping::Expression(_))
            || matches!(self.groups, PrefixedMapping::Expression(_))
            || matches!(self.uid, UidMapping::Expression(_))
            || !self.extra.is_empty()
            || !self.claim_rules.is_empty()
    }

    /// The user `claims` (a verified token's payload) map to, without `system:authenticated`
    /// (added by the chain, as kube-apiserver's group adder does).
    pub fn user(&self, claims: &Map<String, Value>) -> Result<User, MappingError> {
        let input = self
            .uses_claims_expressions()
            .then(|| Input::claims(claims));
        let input = input.as_ref();
        let name = self.username(claims, input)?;
        let groups = self.groups(claims, input)?;
        let uid = self.uid(claims, input)?;
        let extra = self.extra(claims, input)?;
        let user = User {
            name,
            uid,
            groups,
            extra,
        };
        for (claim, required) in &self.required_claims {
            let value = string_claim(claims, claim).map_err(|reason| MappingError::Claim {
                what: "required",
                claim: claim.clone(),
                reason,
            })?;
            if value != *required {
                return Err(MappingError::RequiredValue {
                    claim: claim.clone(),
                });
            }
        }
        if let Some(input) = input {
            check_rules(&self.claim_rules, input).map_err(MappingError::ClaimRule)?;
        }
        if !self.user_rules.is_empty() {
            check_rules(&self.user_rules, &Input::user(&user)).map_err(MappingError::UserRule)?;
        }
        Ok(user)
    }

    fn username(
        &self,
        claims: &Map<String, Value>,
        input: Option<&Input>,
    ) -> Result<String, MappingError> {
        let (claim, prefix) = match &self.username {
            PrefixedMapping::Expression(expression) => {
                let name = evaluate_string(expression, input, "username").map_err(|source| {
                    MappingError::Expression {
                        what: "username",
                        source,
                    }
                })?;
                if name.is_empty() {
                    return Err(MappingError::EmptyUsername);
                }
                return Ok(name);
            }
            PrefixedMapping::Claim { claim, prefix } => (claim, prefix),
            // Validation requires a user name mapping.
            PrefixedMapping::None => {
                return Err(MappingError::Claim {
                    what: "username",
                    claim: String::new(),
                    reason: "claim not present",
                });
            }
        };
        let name = string_claim(claims, claim).map_err(|reason| MappingError::Claim {
            what: "username",
            claim: claim.clone(),
            reason,
        })?;
        if claim == "email"
            && let Some(verified) = claims.get("email_verified")
        {
            // Go reads `null` into a bool as false.
            match verified {
                Value::Bool(true) => {}
                Value::Bool(false) | Value::Null => return Err(MappingError::EmailNotVerified),
                _ => {
                    return Err(MappingError::Claim {
                        what: "email_verified",
                        claim: "email_verified".to_owned(),
                        reason: "not a boolean",
                    });
                }
            }
        }
        Ok(format!("{prefix}{name}"))
    }

    fn groups(
        &self,
        claims: &Map<String, Value>,
        input: Option<&Input>,
    ) -> Result<Vec<String>, MappingError> {
        match &self.groups {
            PrefixedMapping::None => Ok(Vec::new()),
            PrefixedMapping::Claim { claim, prefix } => {
                let Some(value) = claims.get(claim) else {
                    return Ok(Vec::new());
                };
                let groups = string_or_array(value).ok_or_else(|| MappingError::Claim {
                    what: "groups",
                    claim: claim.clone(),
                    reason: "not a string or a list of strings",
                })?;
                Ok(groups.into_iter().map(|g| format!("{prefix}{g}")).collect())
            }
            PrefixedMapping::Expression(expression) => {
                evaluate_strings(expression, input).map_err(|source| MappingError::Expression {
                    what: "group",
                    source,
                })
            }
        }
    }

    fn uid(
        &self,
        claims: &Map<String, Value>,
        input: Option<&Input>,
    ) -> Result<String, MappingError> {
        match &self.uid {
            UidMapping::None => Ok(String::new()),
            UidMapping::Claim(claim) => {
                string_claim(claims, claim).map_err(|reason| MappingError::Claim {
                    what: "uid",
                    claim: claim.clone(),
                    reason,
                })
            }
            UidMapping::Expression(expression) => evaluate_string(expression, input, "uid")
                .map_err(|source| MappingError::Expression {
                    what: "uid",
                    source,
                }),
        }
    }

    fn extra(
        &self,
        claims: &Map<String, Value>,
        input: Option<&Input>,
    ) -> Result<BTreeMap<String, Vec<String>>, MappingError> {
        let mut extra = BTreeMap::new();
        // kube-apiserver's credential id: the `jti` claim, when it is a string.
        if let Some(Value::String(jti)) = claims.get("jti")
            && !jti.is_empty()
        {
            extra.insert(CREDENTIAL_ID_EXTRA.to_owned(), vec![format!("JTI={jti}")]);
        }
        for (key, expression) in &self.extra {
            let values =
                evaluate_strings(expression, input).map_err(|source| MappingError::Expression {
                    what: "extra",
                    source,
                })?;
            if !values.is_empty() {
                extra.insert(key.clone(), values);
            }
        }
        Ok(extra)
    }
}

/// A claim read into a Go string: absent is an error, `null` the empty string, anything but a
/// string an error.
fn string_claim(claims: &Map<String, Value>, claim: &str) -> Result<String, &'static str> {
    match claims.get(claim) {
        None => Err("claim not present"),
        Some(Value::Null) => Ok(String::new()),
        Some(Value::String(value)) => Ok(value.clone()),
        Some(_) => Err("not a string"),
    }
}

/// A claim read as kube-apiserver's `stringOrArray`: a list of strings (`null` elements are
/// empty strings, a `null` list none), else one string; anything else is `None`.
fn string_or_array(value: &Value) -> Option<Vec<String>> {
    match value {
        Value::Null => Some(Vec::new()),
        Value::String(one) => Some(vec![one.clone()]),
        Value::Array(values) => values
            .iter()
            .map(|value| match value {
                Value::String(value) => Some(value.clone()),
                Value::Null => Some(String::new()),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

/// An expression that must give a string.
fn evaluate_string(
    expression: &Expression,
    input: Option<&Input>,
    what: &'static str,
) -> Result<String, ExpressionFailure> {
    let input = input.ok_or(ExpressionFailure::Type("no claims to evaluate on"))?;
    match expression.evaluate(input)? {
        Output::String(value) => Ok(value),
        _ => Err(ExpressionFailure::Type(if what == "uid" {
            "uid claim expression must return a string"
        } else {
            "username claim expression must return a string"
        })),
    }
}

/// An expression that must give a string, a list of strings or null, read as kube-apiserver's
/// `convertCELValueToStringList`: empty strings are dropped.
fn evaluate_strings(
    expression: &Expression,
    input: Option<&Input>,
) -> Result<Vec<String>, ExpressionFailure> {
    const MESSAGE: &str = "expression must return a string or a list of strings";
    let input = input.ok_or(ExpressionFailure::Type("no claims to evaluate on"))?;
    match expression.evaluate(input)? {
        Output::String(value) if value.is_empty() => Ok(Vec::new()),
        Output::String(value) => Ok(vec![value]),
        Output::Null => Ok(Vec::new()),
        Output::List(values) => values
            .into_iter()
            .filter(|value| value.as_deref() != Some(""))
            .map(|value| value.ok_or(ExpressionFailure::Type(MESSAGE)))
            .collect(),
        Output::Bool(_) | Output::Other(_) => Err(ExpressionFailure::Type(MESSAGE)),
    }
}

/// Every rule, in order: the first that fails, is false or is not a bool is the error.
fn check_rules(rules: &[Rule], input: &Input) -> Result<(), ExpressionFailure> {
    for rule in rules {
        match rule.expression.evaluate(input)? {
            Output::Bool(true) => {}
            Output::Bool(false) => {
                return Err(ExpressionFailure::False {
                    expression: rule.expression.text().to_owned(),
                    message: rule.message.clone(),
                });
            }
            _ => {
                return Err(ExpressionFailure::Type(
                    "validation expression must return a boolean",
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

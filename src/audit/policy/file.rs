//! The policy file: YAML or JSON, `apiVersion: audit.k8s.io/v1`, `kind: Policy`, validated as
//! kube-apiserver validates it, then what this proxy cannot honour refused: the levels that
//! record bodies. Unknown fields are refused rather than ignored, so a misspelt `userGroups`
//! cannot silently widen a rule. `omitManagedFields` is accepted and ignored: it concerns only the
//! bodies the proxy never records.

use serde::Deserialize;
use serde::de::IgnoredAny;

use super::rules::{GroupResources, Names, Rule};
use super::{AuditPolicy, Level, Stages};

/// The only `apiVersion` read.
pub const API_VERSION: &str = "audit.k8s.io/v1";
/// The only `kind` read.
pub const KIND: &str = "Policy";

/// Why a policy file is refused: the field at fault, what is wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    /// Not YAML or JSON, or a field of the wrong type or unknown; the parser's message carries
    /// the line and column.
    #[error("not a valid audit.k8s.io/v1 Policy: {source}")]
    Syntax {
        /// The parser's error.
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// A field the proxy refuses.
    #[error("{field}: {problem}")]
    Invalid {
        /// The field, e.g. `rules[2].level`.
        field: String,
        /// What is wrong, and the hint.
        problem: String,
    },
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> PolicyFileError {
    PolicyFileError::Invalid {
        field: field.into(),
        problem: problem.into(),
    }
}

/// The file as written; every field may be left out.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct PolicyFile {
    api_version: Option<String>,
    kind: Option<String>,
    /// ObjectMeta; nothing in it affects auditing.
    #[serde(rename = "metadata")]
    _metadata: Option<IgnoredAny>,
    rules: Vec<RuleFile>,
    omit_stages: Vec<String>,
    /// Bodies only.
    #[serde(rename = "omitManagedFields")]
    _omit_managed_fields: Option<bool>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct RuleFile {
    level: String,
    users: Vec<String>,
    user_groups: Vec<String>,
    verbs: Vec<String>,
    resources: Vec<GroupResourcesFile>,
    namespaces: Vec<String>,
    #[serde(rename = "nonResourceURLs")]
    non_resource_urls: Vec<String>,
    omit_stages: Vec<String>,
    /// Bodies only.
    #[serde(rename = "omitManagedFields")]
    _omit_managed_fields: Option<bool>,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct GroupResourcesFile {
    group: String,
    resources: Vec<String>,
    resource_names: Vec<String>,
}

impl AuditPolicy {
    /// Reads and validates a policy from the text of its file.
    pub fn parse(text: &str) -> Result<AuditPolicy, PolicyFileError> {
        let options = serde_saphyr::options! { with_snippet: false };
        let file: PolicyFile = serde_saphyr::from_str_with_options(text, options).map_err(|e| {
            PolicyFileError::Syntax {
                source: Box::new(e),
            }
        })?;
        match file.api_version.as_deref() {
            Some(API_VERSION) => {}
            Some(other) => {
                return Err(invalid(
                    "apiVersion",
                    format!(
                        "{other:?} is not read; write apiVersion: {API_VERSION} (kube-apiserver \
                         no longer serves the older versions either)"
                    ),
                ));
            }
            None => {
                return Err(invalid(
                    "apiVersion",
                    format!("missing; write apiVersion: {API_VERSION}"),
                ));
            }
        }
        match file.kind.as_deref() {
            Some(KIND) => {}
            Some(other) => {
                return Err(invalid(
                    "kind",
                    format!("{other:?} is not an audit policy; write kind: {KIND}"),
                ));
            }
            None => return Err(invalid("kind", format!("missing; write kind: {KIND}"))),
        }
        let omit_stages = stages("omitStages", &file.omit_stages)?;
        if file.rules.is_empty() {
            return Err(invalid(
                "rules",
                "no rule: every request would get level None and nothing but acts would be \
                 recorded; kube-apiserver refuses such a policy too. End with `- level: Metadata` \
                 to keep the default",
            ));
        }
        let rules = file
            .rules
            .into_iter()
            .enumerate()
            .map(|(index, rule)| compile(index, rule, omit_stages))
            .collect::<Result<_, _>>()?;
        Ok(AuditPolicy { rules, omit_stages })
    }
}

/// Validates rule `index` as kube-apiserver does, refuses the body levels, and compiles it.
fn compile(index: usize, rule: RuleFile, policy_omits: Stages) -> Result<Rule, PolicyFileError> {
    let at = |field: &str| format!("rules[{index}].{field}");
    let level = match rule.level.as_str() {
        "None" => Level::None,
        "Metadata" => Level::Metadata,
        "Request" | "RequestResponse" => {
            return Err(invalid(
                at("level"),
                format!(
                    "{} records request bodies, which this proxy never reads into its audit log; \
                     use Metadata (every event the proxy writes is at Metadata) or None",
                    rule.level
                ),
            ));
        }
        "" => {
            return Err(invalid(at("level"), "missing; use None or Metadata"));
        }
        other => {
            return Err(invalid(
                at("level"),
                format!("{other:?} is not a level; use None or Metadata"),
            ));
        }
    };
    for (i, url) in rule.non_resource_urls.iter().enumerate() {
        if url == "*" {
            continue;
        }
        let field = || at(&format!("nonResourceURLs[{i}]"));
        if !url.starts_with('/') {
            return Err(invalid(
                field(),
                format!("{url:?}: non-resource URL rules must begin with a '/' character"),
            ));
        }
        if url[..url.len() - 1].contains('*') {
            return Err(invalid(
                field(),
                format!("{url:?}: non-resource URL wildcards '*' must be the final character"),
            ));
        }
    }
    if !rule.non_resource_urls.is_empty()
        && (!rule.resources.is_empty() || !rule.namespaces.is_empty())
    {
        return Err(invalid(
            at("nonResourceURLs"),
            "rules cannot apply to both regular resources and non-resource URLs; split the rule \
             in two",
        ));
    }
    let mut resources = Vec::with_capacity(rule.resources.len());
    for (i, group) in rule.resources.into_iter().enumerate() {
        if !group.group.is_empty() && !crate::base::names::is_dns1123_subdomain(&group.group) {
            return Err(invalid(
                at(&format!("resources[{i}].group")),
                format!(
                    "{:?} is not an API group (a lowercase DNS subdomain, no version); the \
                     kubelet's resources are in the core group \"\"",
                    group.group
                ),
            ));
        }
        if !group.resource_names.is_empty() && group.resources.is_empty() {
            return Err(invalid(
                at(&format!("resources[{i}].resourceNames")),
                "using resourceNames requires at least one resource",
            ));
        }
        resources.push(GroupResources {
            group: group.group.into_boxed_str(),
            resources: group
                .resources
                .into_iter()
                .map(String::into_boxed_str)
                .collect(),
            resource_names: Names::new(group.resource_names),
        });
    }
    let omit_stages = stages(&at("omitStages"), &rule.omit_stages)?.union(policy_omits);
    Ok(Rule {
        level,
        omit_stages,
        users: Names::new(rule.users),
        user_groups: Names::new(rule.user_groups),
        verbs: Names::new(rule.verbs),
        namespaces: Names::new(rule.namespaces),
        resources: resources.into_boxed_slice(),
        non_resource_urls: rule
            .non_resource_urls
            .into_iter()
            .map(String::into_boxed_str)
            .collect(),
    })
}

/// The stages named in an `omitStages` list at `field`.
fn stages(field: &str, names: &[String]) -> Result<Stages, PolicyFileError> {
    names
        .iter()
        .enumerate()
        .try_fold(Stages::NONE, |set, (i, name)| {
            Stages::named(name).map(|s| set.union(s)).ok_or_else(|| {
                invalid(
                    format!("{field}[{i}]"),
                    format!(
                        "{name:?} is not a stage; allowed stages are RequestReceived, \
                     ResponseStarted, ResponseComplete, Panic"
                    ),
                )
            })
        })
}

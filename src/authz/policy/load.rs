//! Loading a policy: reading files, parsing manifests, validating them as the API server would,
//! resolving roleRefs and building the subject index. Nothing here runs on the request path.

use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write as _};
use std::fs::File;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::PolicyAuthorizer;
use super::aggregate::{AggregationInput, AggregationRule, aggregate};
use super::errors::{PolicyError, PolicyProblem};
use super::index::{Binding, Candidate, SubjectIndex};
use super::kinds::{BOOTSTRAPPING_LABEL, Kind, RBAC_API_GROUP};
use super::validation::{rule_problem, subject_problem};
use crate::authz::Reason;
use crate::authz::rbac::{PolicyRule, SERVICE_ACCOUNT_KIND, Subject};

/// Policy files larger than this are refused rather than read: a path pointing at the wrong file
/// (a log, `/dev/zero`) must fail start-up, not exhaust memory. Real policies are kilobytes.
pub const MAX_POLICY_FILE_BYTES: u64 = 16 * 1024 * 1024;

impl PolicyAuthorizer {
    /// Reads and validates every policy file, in order.
    ///
    /// An empty `paths` is [`PolicyError::NoSources`]; files holding no binding at all are fine
    /// and give an authorizer that always says `NoOpinion`. Any problem in any file fails the
    /// whole load: a partial policy is never used.
    pub fn load(paths: &[PathBuf]) -> Result<PolicyAuthorizer, PolicyError> {
        let sources = paths
            .iter()
            .map(|path| Ok((path.display().to_string(), read_policy_file(path)?)))
            .collect::<Result<Vec<_>, PolicyError>>()?;
        PolicyAuthorizer::from_sources(&sources)
    }

    /// Like [`load`](Self::load), from `(source name, YAML text)` pairs held in memory (an
    /// embedded policy, tests). Source names only appear in error messages.
    pub fn from_sources(sources: &[(String, String)]) -> Result<PolicyAuthorizer, PolicyError> {
        if sources.is_empty() {
            return Err(PolicyError::NoSources);
        }
        let mut loader = Loader::default();
        for (source_name, text) in sources {
            let documents: Vec<Spanned<RawObject>> =
                serde_saphyr::from_multiple_with_options(text, yaml_options()).map_err(
                    |error| PolicyError::Yaml {
                        source_name: source_name.clone(),
                        error: Box::new(error),
                    },
                )?;
            for document in documents {
                loader.add(source_name, document, None)?;
            }
        }
        loader.finish(MissingRole::Refuse)
    }
}

/// Parser options: no rendered snippets (messages stay one line for logs), and a budget sized for
/// large policies (thousands of bindings) within [`MAX_POLICY_FILE_BYTES`]; alias-expansion limits
/// stay at their defaults.
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        with_snippet: false,
        budget: serde_saphyr::budget! {
            max_documents: 1_000_000,
            max_nodes: 10_000_000,
            max_events: 20_000_000,
        },
    }
}

/// Reads a policy file as UTF-8, refusing files over [`MAX_POLICY_FILE_BYTES`].
fn read_policy_file(path: &Path) -> Result<String, PolicyError> {
    let read_error = |source| PolicyError::Read {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(read_error)?;
    let mut text = String::new();
    file.take(MAX_POLICY_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(read_error)?;
    if text.len() as u64 > MAX_POLICY_FILE_BYTES {
        return Err(PolicyError::TooLarge {
            path: path.to_owned(),
            limit: MAX_POLICY_FILE_BYTES,
        });
    }
    Ok(text)
}

/// One YAML document or List item: the union of the fields of the accepted kinds, so that any
/// other top-level field is a parse error and the kind-specific checks can say precisely what is
/// wrong.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawObject {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    metadata: RawMetadata,
    rules: Option<Vec<PolicyRule>>,
    subjects: Option<Vec<Subject>>,
    role_ref: Option<RoleRef>,
    aggregation_rule: Option<AggregationRule>,
    items: Option<Vec<Spanned<RawObject>>>,
}

/// Object metadata: the name, and the labels aggregation selects by. Every other field
/// (`annotations`, and the `uid`, `resourceVersion`, `managedFields`, … of a dump) is accepted
/// and ignored, as RBAC ignores it.
#[derive(Debug, Default, Deserialize)]
struct RawMetadata {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// A binding's `roleRef`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RoleRef {
    #[serde(default)]
    api_group: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    name: String,
}

/// A role's kind, name and definition site, for tools that inspect a policy.
#[derive(Debug)]
pub(super) struct RoleSource {
    /// `ClusterRole` or `Role`.
    pub(super) kind: &'static str,
    /// Empty for a ClusterRole.
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) origin: Origin,
    /// Labelled `kubernetes.io/bootstrapping: rbac-defaults`: one of Kubernetes' own roles.
    pub(super) is_default: bool,
    /// Its rules were filled in from its `aggregationRule`.
    pub(super) aggregated: bool,
}

/// Where an object was defined, for error messages.
#[derive(Debug, Clone)]
pub(super) struct Origin {
    pub(super) source_name: String,
    pub(super) line: u64,
}

impl Origin {
    /// The error for a problem with the object defined here.
    fn invalid(&self, object: String, problem: PolicyProblem) -> PolicyError {
        PolicyError::Invalid {
            source_name: self.source_name.clone(),
            line: self.line,
            object,
            problem: Box::new(problem),
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.source_name, self.line)
    }
}

/// A validated binding whose roleRef is not resolved yet (its role may come from a later file).
#[derive(Debug)]
pub(super) struct PendingBinding {
    pub(super) kind: Kind,
    /// Empty for a ClusterRoleBinding.
    pub(super) namespace: String,
    pub(super) name: String,
    /// `ClusterRole`, or `Role` (RoleBindings only, in the binding's namespace).
    pub(super) role_kind: Kind,
    pub(super) role_name: String,
    pub(super) subjects: Vec<Subject>,
    pub(super) origin: Origin,
}

/// A validated ClusterRole or Role.
#[derive(Debug)]
pub(super) struct PendingRole {
    pub(super) kind: Kind,
    /// Empty for a ClusterRole.
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) labels: BTreeMap<String, String>,
    pub(super) rules: Vec<PolicyRule>,
    /// The selectors to fill `rules` from: an aggregated ClusterRole written without rules.
    pub(super) fill_from: Option<AggregationRule>,
    pub(super) origin: Origin,
}

/// What [`Loader::finish`] does with a binding whose role it does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MissingRole {
    /// A policy file naming a role no file defines is refused: it is a typo.
    Refuse,
    /// The cluster's bindings may name roles that do not exist (yet), or roles the watch did
    /// not keep because no rule of theirs can grant a kubelet attribute: such a binding grants
    /// nothing, as in RBAC.
    Skip,
}

/// Collects validated objects across all sources, then resolves and indexes them.
#[derive(Debug, Default)]
pub(super) struct Loader {
    roles: Vec<PendingRole>,
    /// (namespace, name) → index into `roles`; namespace empty for ClusterRoles, so a Role and a
    /// ClusterRole never share a key.
    role_names: HashMap<(String, String), usize>,
    bindings: Vec<PendingBinding>,
    /// (namespace, name) → where the binding was defined, as for `role_names`.
    binding_names: HashMap<(String, String), Origin>,
}

impl Loader {
    /// Records a role already validated (by the API server that served it). Its key must be new.
    pub(super) fn add_role(&mut self, role: PendingRole) {
        self.role_names.insert(
            (role.namespace.clone(), role.name.clone()),
            self.roles.len(),
        );
        self.roles.push(role);
    }

    /// Records a binding already validated (by the API server that served it).
    pub(super) fn add_binding(&mut self, binding: PendingBinding) {
        self.bindings.push(binding);
    }

    /// Validates one document, or an item of the list of kind `list`, and records what it
    /// defines.
    fn add(
        &mut self,
        source_name: &str,
        document: Spanned<RawObject>,
        list: Option<Kind>,
    ) -> Result<(), PolicyError> {
        let origin = Origin {
            source_name: source_name.to_owned(),
            line: document.referenced.line(),
        };
        let mut raw = document.value;
        // The API server writes the items of a typed list without apiVersion and kind.
        let item_kind = list.and_then(Kind::item_kind);
        if let Some(kind) = item_kind.filter(|_| raw.kind.is_empty()) {
            raw.kind = kind.name().to_owned();
            if raw.api_version.is_empty() {
                raw.api_version = kind.api_version().to_owned();
            }
        }
        let object = describe_object(&raw);
        let fail = |problem| Err(origin.invalid(object.clone(), problem));

        let kind = match Kind::parse(&raw.kind, list.is_some()) {
            Ok(kind) => kind,
            Err(problem) => return fail(problem),
        };
        if let (Some(list), Some(expected)) = (list, item_kind)
            && kind != expected
        {
            return fail(PolicyProblem::WrongItemKind {
                list: list.name(),
                expected: expected.name(),
            });
        }
        if raw.api_version != kind.api_version() {
            return fail(PolicyProblem::WrongApiVersion {
                found: raw.api_version,
                expected: kind.api_version(),
            });
        }
        let present = [
            ("rules", raw.rules.is_some()),
            ("aggregationRule", raw.aggregation_rule.is_some()),
            ("subjects", raw.subjects.is_some()),
            ("roleRef", raw.role_ref.is_some()),
            ("items", raw.items.is_some()),
        ];
        if let Some((field, _)) = present
            .iter()
            .find(|(field, is_present)| *is_present && !kind.fields().contains(field))
        {
            return fail(PolicyProblem::UnexpectedField {
                field,
                kind: kind.name(),
            });
        }
        if kind.is_list() {
            for item in raw.items.unwrap_or_default() {
                self.add(source_name, item, Some(kind))?;
            }
            return Ok(());
        }
        let name = raw.metadata.name;
        if name.is_empty() {
            return fail(PolicyProblem::MissingName);
        }
        // A cluster-scoped object's namespace means nothing, as in the API server.
        let namespace = if kind.is_namespaced() {
            if raw.metadata.namespace.is_empty() {
                return fail(PolicyProblem::MissingNamespace { kind: kind.name() });
            }
            raw.metadata.namespace
        } else {
            String::new()
        };
        let key = (namespace, name);
        if kind.is_role() {
            if let Some(&first) = self.role_names.get(&key) {
                return fail(PolicyProblem::Duplicate {
                    first: self.roles[first].origin.to_string(),
                });
            }
            let rules = raw.rules.unwrap_or_default();
            for (index, rule) in rules.iter().enumerate() {
                if let Some(reason) = rule_problem(rule) {
                    return fail(PolicyProblem::InvalidRule { index, reason });
                }
            }
            if let Some(aggregation) = &raw.aggregation_rule {
                for (index, selector) in aggregation.cluster_role_selectors.iter().enumerate() {
                    if let Some(reason) = selector.problem() {
                        return fail(PolicyProblem::BadSelector { index, reason });
                    }
                }
            }
            self.role_names.insert(key.clone(), self.roles.len());
            let (namespace, name) = key;
            self.roles.push(PendingRole {
                kind,
                namespace,
                name,
                labels: raw.metadata.labels,
                // RBAC reads `rules` only; the controller fills them in when they are empty.
                fill_from: raw.aggregation_rule.filter(|_| rules.is_empty()),
                rules,
                origin,
            });
            return Ok(());
        }

        if let Some(first) = self.binding_names.get(&key) {
            return fail(PolicyProblem::Duplicate {
                first: first.to_string(),
            });
        }
        let Some(role_ref) = raw.role_ref else {
            return fail(PolicyProblem::MissingRoleRef);
        };
        let role_kind = match role_ref.kind.as_str() {
            "ClusterRole" => Some(Kind::ClusterRole),
            "Role" if kind == Kind::RoleBinding => Some(Kind::Role),
            _ => None,
        };
        let Some(role_kind) = role_kind.filter(|_| role_ref.api_group == RBAC_API_GROUP) else {
            return fail(PolicyProblem::BadRoleRef {
                binding: kind.name(),
                kind: role_ref.kind,
                api_group: role_ref.api_group,
            });
        };
        let subjects = raw.subjects.unwrap_or_default();
        for (index, subject) in subjects.iter().enumerate() {
            if let Some(problem) = subject_problem(index, subject, kind) {
                return fail(problem);
            }
        }
        self.binding_names.insert(key.clone(), origin.clone());
        let (namespace, name) = key;
        self.bindings.push(PendingBinding {
            kind,
            namespace,
            name,
            role_kind,
            role_name: role_ref.name,
            subjects,
            origin,
        });
        Ok(())
    }

    /// Fills in aggregated roles, resolves every roleRef, builds the reasons and the subject
    /// indexes: one for ClusterRoleBindings, one per namespace for RoleBindings.
    pub(super) fn finish(self, missing: MissingRole) -> Result<PolicyAuthorizer, PolicyError> {
        let mut rules: Vec<Vec<PolicyRule>> = self.roles.iter().map(|r| r.rules.clone()).collect();
        // Aggregation selects among ClusterRoles only.
        let cluster_roles: Vec<usize> = (0..self.roles.len())
            .filter(|&i| self.roles[i].kind == Kind::ClusterRole)
            .collect();
        let inputs: Vec<AggregationInput<'_>> = cluster_roles
            .iter()
            .map(|&i| AggregationInput {
                name: &self.roles[i].name,
                labels: &self.roles[i].labels,
                fill_from: self.roles[i]
                    .fill_from
                    .as_ref()
                    .map(|a| a.cluster_role_selectors.as_slice()),
            })
            .collect();
        let mut cluster_rules: Vec<Vec<PolicyRule>> = cluster_roles
            .iter()
            .map(|&i| std::mem::take(&mut rules[i]))
            .collect();
        aggregate(&inputs, &mut cluster_rules);
        for (&i, filled) in cluster_roles.iter().zip(cluster_rules) {
            rules[i] = filled;
        }

        let mut bindings = Vec::with_capacity(self.bindings.len());
        let mut index = SubjectIndex::default();
        let mut namespaces: HashMap<String, SubjectIndex> = HashMap::new();
        let mut role_bindings = 0;
        for pending in self.bindings {
            // Its index among the bindings kept.
            let binding = bindings.len();
            let role_namespace = match pending.role_kind {
                Kind::Role => pending.namespace.clone(),
                _ => String::new(),
            };
            let Some(&role) = self
                .role_names
                .get(&(role_namespace, pending.role_name.clone()))
            else {
                if missing == MissingRole::Skip {
                    continue;
                }
                return Err(pending.origin.invalid(
                    describe_named(pending.kind, &pending.namespace, &pending.name),
                    PolicyProblem::MissingRole {
                        kind: pending.role_kind.name(),
                        name: pending.role_name,
                        namespace: pending.namespace,
                    },
                ));
            };
            let subject_index = if pending.kind == Kind::RoleBinding {
                role_bindings += 1;
                namespaces.entry(pending.namespace.clone()).or_default()
            } else {
                &mut index
            };
            let mut reasons = Vec::with_capacity(pending.subjects.len());
            for (subject, s) in pending.subjects.iter().enumerate() {
                // A ServiceAccount subject of a RoleBinding defaults to the binding's namespace.
                let mut s = s.clone();
                if s.kind == SERVICE_ACCOUNT_KIND && s.namespace.is_empty() {
                    s.namespace.clone_from(&pending.namespace);
                }
                reasons.push(Reason::Shared(Arc::from(allow_reason(&pending, &s))));
                subject_index.add(&s, Candidate { binding, subject });
            }
            bindings.push(Binding {
                role,
                reasons: reasons.into_boxed_slice(),
            });
        }
        Ok(PolicyAuthorizer {
            roles: rules.into_iter().map(Vec::into_boxed_slice).collect(),
            bindings,
            index,
            namespaces,
            role_bindings,
            role_sources: self
                .roles
                .into_iter()
                .map(|role| RoleSource {
                    is_default: role.labels.get(BOOTSTRAPPING_LABEL.0).map(String::as_str)
                        == Some(BOOTSTRAPPING_LABEL.1),
                    aggregated: role.fill_from.is_some(),
                    kind: role.kind.name(),
                    namespace: role.namespace,
                    name: role.name,
                    origin: role.origin,
                })
                .collect(),
        })
    }
}

/// `ClusterRoleBinding "x"`, `Role "ns/x"`, `ClusterRole` (no name), or `document` (no or
/// unknown kind, which the problem itself reports), for messages.
fn describe_object(raw: &RawObject) -> String {
    match (Kind::parse(&raw.kind, false), raw.metadata.name.as_str()) {
        (Err(_), _) => "document".to_owned(),
        (Ok(kind), "") => kind.name().to_owned(),
        (Ok(kind), name) => describe_named(kind, &raw.metadata.namespace, name),
    }
}

/// `<kind> "<name>"`, or `<kind> "<namespace>/<name>"` for namespaced kinds, quoted so that it
/// cannot break the message.
fn describe_named(kind: Kind, namespace: &str, name: &str) -> String {
    if kind.is_namespaced() && !namespace.is_empty() {
        format!(
            "{} {}",
            kind.name(),
            go_quote(&format!("{namespace}/{name}"))
        )
    } else {
        format!("{} {}", kind.name(), go_quote(name))
    }
}

/// RBAC's allow reason (kubernetes `pkg/registry/rbac/validation/rule.go`,
/// `clusterRoleBindingDescriber` and `roleBindingDescriber`): `ClusterRoleBinding "b" of
/// ClusterRole "r" to User "u"`, `RoleBinding "b/ns" of Role "r" to Group "g"`; a ServiceAccount
/// subject as `ServiceAccount "name/namespace"`, its namespace defaulted to the binding's.
fn allow_reason(binding: &PendingBinding, subject: &Subject) -> String {
    let subject_name = if subject.kind == SERVICE_ACCOUNT_KIND {
        go_quote(&format!("{}/{}", subject.name, subject.namespace))
    } else {
        go_quote(&subject.name)
    };
    let binding_name = if binding.kind == Kind::RoleBinding {
        go_quote(&format!("{}/{}", binding.name, binding.namespace))
    } else {
        go_quote(&binding.name)
    };
    format!(
        "RBAC: allowed by {} {binding_name} of {} {} to {} {subject_name}",
        binding.kind.name(),
        binding.role_kind.name(),
        go_quote(&binding.role_name),
        subject.kind,
    )
}

/// Quotes like Go's `%q`, which RBAC uses in its reasons: backslash escapes for `"`, `\` and
/// control characters, so a name can never break a log line. Printable characters are kept;
/// unlike Go, non-ASCII format characters (e.g. zero-width space) are kept too.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            // Writing to a String cannot fail.
            c if c.is_ascii_control() => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if c.is_control() || (c.is_whitespace() && c != ' ') => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

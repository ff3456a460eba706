//! Loading a policy: reading files, parsing manifests, validating them as the API server would,
//! resolving roleRefs and building the subject index. Nothing here runs on the request path.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::fs::File;
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_saphyr::Spanned;

use super::PolicyAuthorizer;
use super::index::{Binding, Candidate, SubjectIndex};
use crate::authz::Reason;
use crate::authz::rbac::{GROUP_KIND, PolicyRule, SERVICE_ACCOUNT_KIND, Subject, USER_KIND};
/// The only apiVersion accepted for ClusterRole and ClusterRoleBinding.
pub(super) const RBAC_API_VERSION: &str = "rbac.authorization.k8s.io/v1";
/// The API group a roleRef (and a User or Group subject) names.
pub(super) const RBAC_API_GROUP: &str = "rbac.authorization.k8s.io";
/// The apiVersion of `kind: List`, as `kubectl get -o yaml` writes it.
pub(super) const LIST_API_VERSION: &str = "v1";

/// The kinds a policy file may hold, parsed once from a document's `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    ClusterRole,
    ClusterRoleBinding,
    /// `kind: List`, as `kubectl get -o yaml` writes several objects.
    List,
}

impl Kind {
    /// The kind as written.
    fn name(self) -> &'static str {
        match self {
            Kind::ClusterRole => "ClusterRole",
            Kind::ClusterRoleBinding => "ClusterRoleBinding",
            Kind::List => "List",
        }
    }

    /// The only apiVersion accepted with it.
    fn api_version(self) -> &'static str {
        match self {
            Kind::ClusterRole | Kind::ClusterRoleBinding => RBAC_API_VERSION,
            Kind::List => LIST_API_VERSION,
        }
    }

    /// The top-level fields (besides apiVersion, kind and metadata) it may have.
    fn fields(self) -> &'static [&'static str] {
        match self {
            Kind::ClusterRole => &["rules"],
            Kind::ClusterRoleBinding => &["subjects", "roleRef"],
            Kind::List => &["items"],
        }
    }

    /// The kind a document declares; `in_list` for the items of a List, which cannot nest.
    fn parse(kind: &str, in_list: bool) -> Result<Kind, PolicyProblem> {
        match kind {
            "ClusterRole" => Ok(Kind::ClusterRole),
            "ClusterRoleBinding" => Ok(Kind::ClusterRoleBinding),
            "List" if in_list => Err(PolicyProblem::NestedList),
            "List" => Ok(Kind::List),
            "" => Err(PolicyProblem::MissingKind),
            "Role" | "RoleBinding" => Err(PolicyProblem::Namespaced {
                replacement: if kind == "Role" {
                    Kind::ClusterRole.name()
                } else {
                    Kind::ClusterRoleBinding.name()
                },
                kind: kind.to_owned(),
            }),
            _ => Err(PolicyProblem::UnknownKind(kind.to_owned())),
        }
    }
}

/// Policy files larger than this are refused rather than read: a path pointing at the wrong file
/// (a log, `/dev/zero`) must fail start-up, not exhaust memory. Real policies are kilobytes.
pub const MAX_POLICY_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Why a policy could not be loaded. Every variant names the file; manifest problems also name the
/// line and the object, so an operator can fix the policy from the message alone.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// `load(&[])` / `from_sources(&[])`: the `Policy` mode without a policy is a configuration
    /// mistake, not an authorizer that silently allows nothing.
    #[error("no policy file given: the Policy authorizer needs at least one")]
    NoSources,
    /// The file could not be opened or read (missing, unreadable, not UTF-8, a directory).
    #[error("cannot read policy file {}: {source}", path.display())]
    Read {
        /// The file as given.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
    /// The file exceeds [`MAX_POLICY_FILE_BYTES`].
    #[error("policy file {} is larger than {limit} bytes", path.display())]
    TooLarge {
        /// The file as given.
        path: PathBuf,
        /// The limit it exceeds.
        limit: u64,
    },
    /// The text is not valid YAML, or does not have the shape of the accepted manifests (unknown
    /// field, wrong type, duplicate key). The parser's message carries line and column.
    #[error("{source_name}: invalid policy YAML: {error}")]
    Yaml {
        /// The file (or in-memory source) name.
        source_name: String,
        /// The parser's error; `error.location()` gives line and column.
        error: Box<serde_saphyr::Error>,
    },
    /// A well-formed manifest that the policy cannot accept.
    #[error("{source_name}:{line}: {object}: {problem}")]
    Invalid {
        /// The file (or in-memory source) name.
        source_name: String,
        /// The 1-based line where the offending object starts.
        line: u64,
        /// The object, e.g. `ClusterRoleBinding "metrics"`.
        object: String,
        /// What is wrong with it.
        problem: PolicyProblem,
    },
}

/// What is wrong with one manifest object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyProblem {
    /// The document has no `kind`.
    #[error("missing `kind`: expected ClusterRole, ClusterRoleBinding or List")]
    MissingKind,
    /// `Role` or `RoleBinding`: namespaced, so they can never grant kubelet API access.
    #[error(
        "a {kind} never grants kubelet API access: kubelet requests have namespace \"\", which \
         namespaced RBAC objects do not cover; use {replacement} instead"
    )]
    Namespaced {
        /// `Role` or `RoleBinding`.
        kind: String,
        /// `ClusterRole` or `ClusterRoleBinding`.
        replacement: &'static str,
    },
    /// Any other kind.
    #[error("unsupported kind {0:?}: expected ClusterRole, ClusterRoleBinding or List")]
    UnknownKind(String),
    /// The apiVersion does not go with the kind.
    #[error("apiVersion is {found:?}, expected {expected:?}")]
    WrongApiVersion {
        /// What the manifest says.
        found: String,
        /// What this kind needs.
        expected: &'static str,
    },
    /// `metadata.name` is missing or empty.
    #[error("metadata.name is missing")]
    MissingName,
    /// Another object of the same kind already has this name.
    #[error("duplicate name, first defined at {first}")]
    Duplicate {
        /// `file:line` of the first definition.
        first: String,
    },
    /// A top-level field that belongs to another kind (`subjects` in a ClusterRole, …).
    #[error("field `{field}` does not belong in a {kind}")]
    UnexpectedField {
        /// The field.
        field: &'static str,
        /// The object's kind.
        kind: &'static str,
    },
    /// A List inside a List.
    #[error("a List inside a List is not supported")]
    NestedList,
    /// A ClusterRole with `aggregationRule`: its rules come from a controller we do not run.
    #[error("aggregated ClusterRoles are not supported; list the rules directly")]
    Aggregated,
    /// A rule the API server's validation would reject; most such rules could never match.
    #[error("rules[{index}]: {reason}")]
    InvalidRule {
        /// Position in `rules`.
        index: usize,
        /// What is wrong, in the API server's words.
        reason: &'static str,
    },
    /// A ClusterRoleBinding without `roleRef`.
    #[error("missing roleRef")]
    MissingRoleRef,
    /// A roleRef that is not `kind: ClusterRole`, `apiGroup: rbac.authorization.k8s.io`.
    #[error(
        "roleRef must have kind \"ClusterRole\" and apiGroup \"rbac.authorization.k8s.io\", \
         found kind {kind:?} and apiGroup {api_group:?}"
    )]
    BadRoleRef {
        /// The roleRef's kind.
        kind: String,
        /// The roleRef's apiGroup.
        api_group: String,
    },
    /// The roleRef names a ClusterRole that none of the policy files defines.
    #[error("roleRef names ClusterRole {0:?}, which no policy file defines")]
    MissingRole(String),
    /// A subject whose kind is not User, Group or ServiceAccount: it could never match.
    #[error("subjects[{index}]: unknown kind {kind:?}: expected User, Group or ServiceAccount")]
    UnknownSubjectKind {
        /// Position in `subjects`.
        index: usize,
        /// The subject's kind.
        kind: String,
    },
    /// A subject with an empty name.
    #[error("subjects[{index}]: name is empty")]
    EmptySubjectName {
        /// Position in `subjects`.
        index: usize,
    },
    /// A ServiceAccount subject without namespace: in a ClusterRoleBinding it never matches.
    #[error(
        "subjects[{index}]: ServiceAccount {name:?} has no namespace, so it could never match \
         in a ClusterRoleBinding"
    )]
    ServiceAccountWithoutNamespace {
        /// Position in `subjects`.
        index: usize,
        /// The service account's name.
        name: String,
    },
    /// A subject apiGroup the API server would reject (User/Group: `rbac.authorization.k8s.io` or
    /// empty; ServiceAccount: empty).
    #[error("subjects[{index}]: apiGroup {api_group:?} is not valid for kind {kind}")]
    BadSubjectApiGroup {
        /// Position in `subjects`.
        index: usize,
        /// The subject's kind.
        kind: String,
        /// The subject's apiGroup.
        api_group: String,
    },
}

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
                loader.add(source_name, document, false)?;
            }
        }
        loader.finish()
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
    aggregation_rule: Option<IgnoredAny>,
    items: Option<Vec<Spanned<RawObject>>>,
}

/// Object metadata. Only the name matters; every other field (`labels`, `annotations`, and the
/// `uid`, `resourceVersion`, … of `kubectl get -o yaml` output) is accepted and ignored.
#[derive(Debug, Default, Deserialize)]
struct RawMetadata {
    #[serde(default)]
    name: String,
}

/// A ClusterRoleBinding's `roleRef`.
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
            problem,
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.source_name, self.line)
    }
}

/// A validated ClusterRoleBinding whose roleRef is not resolved yet (its role may come from a
/// later file).
#[derive(Debug)]
struct PendingBinding {
    name: String,
    role_name: String,
    subjects: Vec<Subject>,
    origin: Origin,
}

/// Collects validated objects across all sources, then resolves and indexes them.
#[derive(Debug, Default)]
struct Loader {
    roles: Vec<Box<[PolicyRule]>>,
    /// Role name → (index into `roles`, where it was defined).
    role_names: HashMap<String, (usize, Origin)>,
    bindings: Vec<PendingBinding>,
    /// Binding name → where it was defined.
    binding_names: HashMap<String, Origin>,
}

impl Loader {
    /// Validates one document (or List item, `in_list`) and records what it defines.
    fn add(
        &mut self,
        source_name: &str,
        document: Spanned<RawObject>,
        in_list: bool,
    ) -> Result<(), PolicyError> {
        let origin = Origin {
            source_name: source_name.to_owned(),
            line: document.referenced.line(),
        };
        let raw = document.value;
        let object = describe_object(&raw);
        let fail = |problem| Err(origin.invalid(object.clone(), problem));

        let kind = match Kind::parse(&raw.kind, in_list) {
            Ok(kind) => kind,
            Err(problem) => return fail(problem),
        };
        if raw.api_version != kind.api_version() {
            return fail(PolicyProblem::WrongApiVersion {
                found: raw.api_version,
                expected: kind.api_version(),
            });
        }
        let present = [
            ("rules", raw.rules.is_some()),
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
        if raw.aggregation_rule.is_some() {
            return fail(if kind == Kind::ClusterRole {
                PolicyProblem::Aggregated
            } else {
                PolicyProblem::UnexpectedField {
                    field: "aggregationRule",
                    kind: kind.name(),
                }
            });
        }

        if kind == Kind::List {
            for item in raw.items.unwrap_or_default() {
                self.add(source_name, item, true)?;
            }
            return Ok(());
        }
        let name = raw.metadata.name;
        if name.is_empty() {
            return fail(PolicyProblem::MissingName);
        }
        if kind == Kind::ClusterRole {
            if let Some((_, first)) = self.role_names.get(&name) {
                return fail(PolicyProblem::Duplicate {
                    first: first.to_string(),
                });
            }
            let rules = raw.rules.unwrap_or_default();
            for (index, rule) in rules.iter().enumerate() {
                if let Some(reason) = rule_problem(rule) {
                    return fail(PolicyProblem::InvalidRule { index, reason });
                }
            }
            self.role_names.insert(name, (self.roles.len(), origin));
            self.roles.push(rules.into_boxed_slice());
            return Ok(());
        }

        if let Some(first) = self.binding_names.get(&name) {
            return fail(PolicyProblem::Duplicate {
                first: first.to_string(),
            });
        }
        let Some(role_ref) = raw.role_ref else {
            return fail(PolicyProblem::MissingRoleRef);
        };
        if role_ref.kind != Kind::ClusterRole.name() || role_ref.api_group != RBAC_API_GROUP {
            return fail(PolicyProblem::BadRoleRef {
                kind: role_ref.kind,
                api_group: role_ref.api_group,
            });
        }
        let subjects = raw.subjects.unwrap_or_default();
        for (index, subject) in subjects.iter().enumerate() {
            if let Some(problem) = subject_problem(index, subject) {
                return fail(problem);
            }
        }
        self.binding_names.insert(name.clone(), origin.clone());
        self.bindings.push(PendingBinding {
            name,
            role_name: role_ref.name,
            subjects,
            origin,
        });
        Ok(())
    }

    /// Resolves every roleRef, builds the reasons and the subject index.
    fn finish(self) -> Result<PolicyAuthorizer, PolicyError> {
        let mut bindings = Vec::with_capacity(self.bindings.len());
        let mut index = SubjectIndex::default();
        for (binding, pending) in self.bindings.into_iter().enumerate() {
            let Some((role, _)) = self.role_names.get(&pending.role_name) else {
                return Err(pending.origin.invalid(
                    describe(Kind::ClusterRoleBinding.name(), &pending.name),
                    PolicyProblem::MissingRole(pending.role_name),
                ));
            };
            let mut reasons = Vec::with_capacity(pending.subjects.len());
            for (subject, s) in pending.subjects.iter().enumerate() {
                reasons.push(Reason::Shared(Arc::from(allow_reason(
                    &pending.name,
                    &pending.role_name,
                    s,
                ))));
                index.add(s, Candidate { binding, subject });
            }
            bindings.push(Binding {
                role: *role,
                reasons: reasons.into_boxed_slice(),
            });
        }
        // Role names are unique, so ordering by index lists each role once, in load order.
        let mut role_sources: Vec<_> = self.role_names.into_iter().collect();
        role_sources.sort_unstable_by_key(|(_, (index, _))| *index);
        Ok(PolicyAuthorizer {
            roles: self.roles,
            bindings,
            index,
            role_sources: role_sources
                .into_iter()
                .map(|(name, (_, origin))| (name, origin))
                .collect(),
        })
    }
}

/// Checks one ClusterRole rule as the API server's validation would: a forgotten `apiGroups: [""]`
/// or `verbs` would otherwise load as a rule that silently grants nothing.
fn rule_problem(rule: &PolicyRule) -> Option<&'static str> {
    if rule.verbs.is_empty() {
        return Some("verbs must contain at least one value");
    }
    if !rule.non_resource_urls.is_empty() {
        let mixed = !(rule.api_groups.is_empty()
            && rule.resources.is_empty()
            && rule.resource_names.is_empty());
        return mixed
            .then_some("rules cannot apply to both regular resources and non-resource URLs");
    }
    if rule.api_groups.is_empty() {
        return Some("resource rules must supply at least one api group");
    }
    if rule.resources.is_empty() {
        return Some("resource rules must supply at least one resource");
    }
    None
}

/// Checks one ClusterRoleBinding subject as the API server's validation would, and rejects what
/// could never match.
fn subject_problem(index: usize, subject: &Subject) -> Option<PolicyProblem> {
    let api_group_ok = match subject.kind.as_str() {
        USER_KIND | GROUP_KIND => {
            subject.api_group.is_empty() || subject.api_group == RBAC_API_GROUP
        }
        SERVICE_ACCOUNT_KIND => subject.api_group.is_empty(),
        _ => {
            return Some(PolicyProblem::UnknownSubjectKind {
                index,
                kind: subject.kind.clone(),
            });
        }
    };
    if subject.name.is_empty() {
        return Some(PolicyProblem::EmptySubjectName { index });
    }
    if !api_group_ok {
        return Some(PolicyProblem::BadSubjectApiGroup {
            index,
            kind: subject.kind.clone(),
            api_group: subject.api_group.clone(),
        });
    }
    if subject.kind == SERVICE_ACCOUNT_KIND && subject.namespace.is_empty() {
        return Some(PolicyProblem::ServiceAccountWithoutNamespace {
            index,
            name: subject.name.clone(),
        });
    }
    None
}

/// `ClusterRoleBinding "x"`, `ClusterRole` (no name), or `document` (no or unknown kind, which
/// the problem itself reports), for messages.
fn describe_object(raw: &RawObject) -> String {
    let known = [
        Kind::ClusterRole.name(),
        Kind::ClusterRoleBinding.name(),
        Kind::List.name(),
        "Role",
        "RoleBinding",
    ];
    match (raw.kind.as_str(), raw.metadata.name.as_str()) {
        (kind, _) if !known.contains(&kind) => "document".to_owned(),
        (kind, "") => kind.to_owned(),
        (kind, name) => describe(kind, name),
    }
}

/// `<kind> "<name>"`, the name quoted so that it cannot break the message.
fn describe(kind: &str, name: &str) -> String {
    format!("{kind} {}", go_quote(name))
}

/// RBAC's allow reason for a ClusterRoleBinding, subject described as upstream's
/// `describeSubject`: `User "u"`, `Group "g"`, `ServiceAccount "name/namespace"`.
fn allow_reason(binding: &str, role: &str, subject: &Subject) -> String {
    let subject_name = if subject.kind == SERVICE_ACCOUNT_KIND {
        go_quote(&format!("{}/{}", subject.name, subject.namespace))
    } else {
        go_quote(&subject.name)
    };
    format!(
        "RBAC: allowed by ClusterRoleBinding {} of ClusterRole {} to {} {subject_name}",
        go_quote(binding),
        go_quote(role),
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

//! The `Policy` authorizer: local RBAC from ClusterRole / ClusterRoleBinding manifests, evaluated
//! like the API server's RBAC authorizer, so kubelet access rules hold while the API server is down.
//! Manifests are validated and indexed by subject once at load; a request only visits its bindings.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::fs::File;
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_saphyr::Spanned;

use super::rbac::{
    GROUP_KIND, PolicyRule, RuleRequest, SERVICE_ACCOUNT_KIND, Subject, USER_KIND, rule_allows,
    service_account_username,
};
use super::{Attributes, Decision, RESOURCE, Reason};

/// The only apiVersion accepted for ClusterRole and ClusterRoleBinding.
const RBAC_API_VERSION: &str = "rbac.authorization.k8s.io/v1";
/// The API group a roleRef (and a User or Group subject) names.
const RBAC_API_GROUP: &str = "rbac.authorization.k8s.io";
/// The apiVersion of `kind: List`, as `kubectl get -o yaml` writes it.
const LIST_API_VERSION: &str = "v1";

const CLUSTER_ROLE: &str = "ClusterRole";
const CLUSTER_ROLE_BINDING: &str = "ClusterRoleBinding";
const LIST: &str = "List";

/// Policy files larger than this are refused rather than read: a path pointing at the wrong file
/// (a log, `/dev/zero`) must fail start-up, not exhaust memory. Real policies are kilobytes.
pub const MAX_POLICY_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// The reason given when no binding allows a request.
const NO_BINDING_ALLOWS: Reason =
    Reason::Static("no ClusterRoleBinding of the local policy allows the request");

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

/// Counts of what a policy holds, for the start-up log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyStats {
    /// ClusterRoles loaded.
    pub cluster_roles: usize,
    /// ClusterRoleBindings loaded.
    pub cluster_role_bindings: usize,
    /// Rules over all ClusterRoles.
    pub rules: usize,
}

/// Authorizes kubelet requests from local ClusterRoles and ClusterRoleBindings, as the API
/// server's RBAC authorizer would: `Allow` when some binding applying to the user references a
/// role with a rule that allows the request, otherwise `NoOpinion` — never `Deny`.
///
/// Immutable after load, so it is shared between requests without locking. Per request it does
/// one hash lookup for the user name and one per group, evaluates only the bindings found there,
/// and allocates nothing. When several bindings allow, the first in load order (files in the
/// order given, documents and List items in file order) gives the reason.
#[derive(Debug)]
pub struct PolicyAuthorizer {
    /// Rules of each ClusterRole, by role index.
    roles: Vec<Box<[PolicyRule]>>,
    /// ClusterRoleBindings in load order.
    bindings: Vec<Binding>,
    /// Bindings with a User subject of that name or a ServiceAccount subject whose user name
    /// (`system:serviceaccount:<ns>:<name>`) it is; ascending binding order.
    by_user: HashMap<String, Vec<Candidate>>,
    /// Bindings with a Group subject of that name; ascending binding order.
    by_group: HashMap<String, Vec<Candidate>>,
    /// Name and definition site of each ClusterRole, by role index; read only by [`roles`]
    /// (`explain`'s policy warnings), never on the request path.
    ///
    /// [`roles`]: PolicyAuthorizer::roles
    role_sources: Vec<(String, Origin)>,
}

/// One ClusterRole of a loaded policy as written, for tools that inspect a policy (`explain`'s
/// warnings about rules no kubelet request can match).
#[derive(Debug, Clone, Copy)]
pub struct PolicyRole<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// The file (or in-memory source name) that defines it.
    pub source_name: &'a str,
    /// The 1-based line where its manifest starts.
    pub line: u64,
    /// Its rules, in order (`rules[i]`).
    pub rules: &'a [PolicyRule],
}

/// A resolved ClusterRoleBinding.
#[derive(Debug)]
struct Binding {
    /// Index into `PolicyAuthorizer::roles`.
    role: usize,
    /// The `Allow` reason for each subject, built at load so the request path only clones an
    /// `Arc`.
    reasons: Box<[Reason]>,
}

/// "Binding `binding` applies to this key through its subject `subject`". Each binding appears
/// at most once per key, with its first subject for that key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Candidate {
    binding: usize,
    subject: usize,
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

    /// What the policy holds, for operators (logged at start-up).
    pub fn stats(&self) -> PolicyStats {
        PolicyStats {
            cluster_roles: self.roles.len(),
            cluster_role_bindings: self.bindings.len(),
            rules: self.roles.iter().map(|rules| rules.len()).sum(),
        }
    }

    /// Every ClusterRole in load order, with where it was defined, so its rules can be checked
    /// against what the kubelet ever asks.
    pub fn roles(&self) -> impl Iterator<Item = PolicyRole<'_>> {
        self.roles
            .iter()
            .zip(&self.role_sources)
            .map(|(rules, (name, origin))| PolicyRole {
                name,
                source_name: &origin.source_name,
                line: origin.line,
                rules,
            })
    }

    /// Decides one kubelet attribute: `Allow` with RBAC's reason
    /// (`RBAC: allowed by ClusterRoleBinding "<b>" of ClusterRole "<r>" to <subject>`, naming the
    /// binding's first subject that applies), else `NoOpinion`. Never `Deny`, so later
    /// authorizers are still asked.
    pub fn authorize(&self, attrs: &Attributes<'_>) -> Decision {
        let request = RuleRequest {
            verb: attrs.verb,
            api_group: "",
            resource: RESOURCE,
            subresource: attrs.subresource,
            name: attrs.name,
            resource_request: true,
            path: attrs.path,
        };
        let user = attrs.user;
        let lists = self.by_user.get(user.name.as_str()).into_iter().chain(
            user.groups
                .iter()
                .filter_map(|group| self.by_group.get(group.as_str())),
        );
        // The allowing candidate with the lowest (binding, subject): each list is sorted, so it
        // is abandoned as soon as it reaches a binding after the best found so far.
        let mut best: Option<Candidate> = None;
        for list in lists {
            for &candidate in list {
                match best {
                    Some(found) if candidate.binding > found.binding => break,
                    Some(found) if candidate.binding == found.binding => {
                        if candidate.subject < found.subject {
                            best = Some(candidate);
                        }
                        break;
                    }
                    _ if self.binding_allows(candidate.binding, &request) => {
                        best = Some(candidate);
                        break;
                    }
                    _ => {}
                }
            }
        }
        match best {
            Some(c) => Decision::Allow(self.bindings[c.binding].reasons[c.subject].clone()),
            None => Decision::NoOpinion(NO_BINDING_ALLOWS),
        }
    }

    /// Whether some rule of the role of binding `binding` allows `request`.
    fn binding_allows(&self, binding: usize, request: &RuleRequest<'_>) -> bool {
        self.roles[self.bindings[binding].role]
            .iter()
            .any(|rule| rule_allows(rule, request))
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
struct Origin {
    source_name: String,
    line: u64,
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

        let (kind, api_version) = match raw.kind.as_str() {
            CLUSTER_ROLE => (CLUSTER_ROLE, RBAC_API_VERSION),
            CLUSTER_ROLE_BINDING => (CLUSTER_ROLE_BINDING, RBAC_API_VERSION),
            LIST if in_list => return fail(PolicyProblem::NestedList),
            LIST => (LIST, LIST_API_VERSION),
            "" => return fail(PolicyProblem::MissingKind),
            "Role" | "RoleBinding" => {
                return fail(PolicyProblem::Namespaced {
                    replacement: if raw.kind == "Role" {
                        CLUSTER_ROLE
                    } else {
                        CLUSTER_ROLE_BINDING
                    },
                    kind: raw.kind,
                });
            }
            _ => return fail(PolicyProblem::UnknownKind(raw.kind)),
        };
        if raw.api_version != api_version {
            return fail(PolicyProblem::WrongApiVersion {
                found: raw.api_version,
                expected: api_version,
            });
        }
        let present = [
            ("rules", raw.rules.is_some()),
            ("subjects", raw.subjects.is_some()),
            ("roleRef", raw.role_ref.is_some()),
            ("items", raw.items.is_some()),
        ];
        let allowed: &[&str] = match kind {
            CLUSTER_ROLE => &["rules"],
            CLUSTER_ROLE_BINDING => &["subjects", "roleRef"],
            _ => &["items"],
        };
        if let Some((field, _)) = present
            .iter()
            .find(|(field, is_present)| *is_present && !allowed.contains(field))
        {
            return fail(PolicyProblem::UnexpectedField { field, kind });
        }
        if raw.aggregation_rule.is_some() {
            return fail(if kind == CLUSTER_ROLE {
                PolicyProblem::Aggregated
            } else {
                PolicyProblem::UnexpectedField {
                    field: "aggregationRule",
                    kind,
                }
            });
        }

        if kind == LIST {
            for item in raw.items.unwrap_or_default() {
                self.add(source_name, item, true)?;
            }
            return Ok(());
        }
        let name = raw.metadata.name;
        if name.is_empty() {
            return fail(PolicyProblem::MissingName);
        }
        if kind == CLUSTER_ROLE {
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
        if role_ref.kind != CLUSTER_ROLE || role_ref.api_group != RBAC_API_GROUP {
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
        let mut by_user: HashMap<String, Vec<Candidate>> = HashMap::new();
        let mut by_group: HashMap<String, Vec<Candidate>> = HashMap::new();
        for (binding, pending) in self.bindings.into_iter().enumerate() {
            let Some((role, _)) = self.role_names.get(&pending.role_name) else {
                return Err(pending.origin.invalid(
                    describe(CLUSTER_ROLE_BINDING, &pending.name),
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
                let (index, key) = match s.kind.as_str() {
                    GROUP_KIND => (&mut by_group, s.name.clone()),
                    SERVICE_ACCOUNT_KIND => (
                        &mut by_user,
                        service_account_username(&s.namespace, &s.name),
                    ),
                    _ => (&mut by_user, s.name.clone()),
                };
                let list = index.entry(key).or_default();
                // Keep only the binding's first subject for this key: it is the one RBAC names.
                if list.last().is_none_or(|c| c.binding != binding) {
                    list.push(Candidate { binding, subject });
                }
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
            by_user,
            by_group,
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
        CLUSTER_ROLE,
        CLUSTER_ROLE_BINDING,
        LIST,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authn::User;
    use crate::test_data::{AttributeCase, KUBELET_VECTORS, cases};

    /// A ClusterRole granting `get` on `nodes/metrics` and `nodes/stats` (the grant the kubelet
    /// docs give metrics scrapers).
    const METRICS_READER: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: kubelet-metrics-reader
rules:
- apiGroups: [""]
  resources: ["nodes/metrics", "nodes/stats"]
  verbs: ["get"]
"#;

    fn binding(name: &str, role: &str, subjects: &str) -> String {
        format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n\
             metadata:\n  name: {name}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  \
             kind: ClusterRole\n  name: {role}\nsubjects:\n{subjects}"
        )
    }

    fn policy(sources: &[(&str, &str)]) -> Result<PolicyAuthorizer, PolicyError> {
        let owned: Vec<(String, String)> = sources
            .iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect();
        PolicyAuthorizer::from_sources(&owned)
    }

    fn user(name: &str, groups: &[&str]) -> User {
        User {
            name: name.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            ..User::default()
        }
    }

    fn decide(
        p: &PolicyAuthorizer,
        u: &User,
        verb: &str,
        subresource: &str,
        node: &str,
    ) -> Decision {
        p.authorize(&Attributes {
            user: u,
            verb,
            subresource,
            name: node,
            path: "/",
        })
    }

    fn allow_reason_of(decision: Decision) -> String {
        match decision {
            Decision::Allow(reason) => reason.to_string(),
            other => panic!("expected Allow, got {other:?}"),
        }
    }

    /// The verb and subresources the kubelet derives for `method path` (fine-grained gate on when
    /// a case has it, the 1.33 table), taken from the kubelet vectors.
    fn kubelet_attributes(method: &str, path: &str) -> (String, Vec<String>) {
        let mut matching: Vec<AttributeCase> = cases(KUBELET_VECTORS, "kubeletAttributes")
            .into_iter()
            .filter(|c: &AttributeCase| {
                c.method == method && c.path == path && !c.standalone_statusz_flagz
            })
            .collect();
        matching.sort_by_key(|c| !c.fine_grained_authz);
        let case = matching
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no kubelet vector for {method} {path}"));
        (case.verb, case.subresources)
    }

    /// The kubelet's loop: each attribute in order, only `Allow` stops. Returns the reason of the
    /// allowing attribute, or `None` for a 403.
    fn kubelet_allows(
        p: &PolicyAuthorizer,
        u: &User,
        node: &str,
        method: &str,
        path: &str,
    ) -> Option<String> {
        let (verb, subresources) = kubelet_attributes(method, path);
        subresources.iter().find_map(|sub| {
            match p.authorize(&Attributes {
                user: u,
                verb: &verb,
                subresource: sub,
                name: node,
                path,
            }) {
                Decision::Allow(reason) => Some(reason.to_string()),
                Decision::Deny(reason) => panic!("Policy must never deny: {reason}"),
                Decision::NoOpinion(_) => None,
            }
        })
    }

    fn invalid(result: Result<PolicyAuthorizer, PolicyError>) -> (PolicyProblem, String) {
        match result {
            Err(e @ PolicyError::Invalid { .. }) => {
                let message = e.to_string();
                let PolicyError::Invalid { problem, .. } = e else {
                    unreachable!()
                };
                (problem, message)
            }
            other => panic!("expected an Invalid error, got {other:?}"),
        }
    }

    #[test]
    fn metrics_reader_service_account_end_to_end() {
        let crb = binding(
            "agent-metrics",
            "kubelet-metrics-reader",
            "- kind: ServiceAccount\n  name: agent\n  namespace: mon\n",
        );
        let p = policy(&[("policy.yaml", &format!("{METRICS_READER}---\n{crb}"))]).unwrap();
        let agent = user(
            "system:serviceaccount:mon:agent",
            &["system:serviceaccounts"],
        );
        let want = "RBAC: allowed by ClusterRoleBinding \"agent-metrics\" of ClusterRole \
                    \"kubelet-metrics-reader\" to ServiceAccount \"agent/mon\"";
        assert_eq!(
            kubelet_allows(&p, &agent, "n1", "GET", "/metrics/cadvisor").as_deref(),
            Some(want)
        );
        assert_eq!(
            kubelet_allows(&p, &agent, "n1", "GET", "/stats/summary").as_deref(),
            Some(want)
        );
        assert_eq!(kubelet_allows(&p, &agent, "n1", "GET", "/pods"), None);
        assert_eq!(
            kubelet_allows(&p, &agent, "n1", "GET", "/exec/default/pod/ctr"),
            None
        );
        assert_eq!(
            kubelet_allows(&p, &agent, "n1", "POST", "/exec/default/pod/ctr"),
            None
        );
        // Another service account of the same namespace gets nothing.
        let other = user(
            "system:serviceaccount:mon:other",
            &["system:serviceaccounts"],
        );
        assert_eq!(
            kubelet_allows(&p, &other, "n1", "GET", "/metrics/cadvisor"),
            None
        );
    }

    #[test]
    fn resource_names_limit_access_to_one_node() {
        let role = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n\
                    metadata: {name: n1-proxy}\nrules:\n- apiGroups: [\"\"]\n  \
                    resources: [nodes/proxy]\n  verbs: [get]\n  resourceNames: [n1]\n";
        let crb = binding("ops-n1", "n1-proxy", "- kind: User\n  name: ops\n");
        let p = policy(&[("policy.yaml", &format!("{role}---\n{crb}"))]).unwrap();
        let ops = user("ops", &[]);
        // `/pods` is tried as nodes/pods first, then allowed through the nodes/proxy fallback.
        assert_eq!(
            kubelet_allows(&p, &ops, "n1", "GET", "/pods").as_deref(),
            Some(
                "RBAC: allowed by ClusterRoleBinding \"ops-n1\" of ClusterRole \"n1-proxy\" to User \"ops\""
            )
        );
        assert_eq!(kubelet_allows(&p, &ops, "n2", "GET", "/pods"), None);
    }

    #[test]
    fn role_binding_is_rejected_because_it_never_applies() {
        let rb = "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n\
                  metadata: {name: proxy, namespace: mon}\nroleRef: {apiGroup: rbac.authorization.k8s.io, \
                  kind: ClusterRole, name: kubelet-metrics-reader}\nsubjects: []\n";
        let (problem, message) = invalid(policy(&[(
            "rb.yaml",
            &format!("{METRICS_READER}---\n{rb}"),
        )]));
        assert_eq!(
            problem,
            PolicyProblem::Namespaced {
                kind: "RoleBinding".into(),
                replacement: CLUSTER_ROLE_BINDING
            }
        );
        assert!(
            message.starts_with("rb.yaml:11: RoleBinding \"proxy\": "),
            "{message}"
        );
        assert!(
            message.contains("namespace \"\"") && message.contains("use ClusterRoleBinding"),
            "{message}"
        );

        let role = "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: r}\n";
        let (problem, message) = invalid(policy(&[("r.yaml", role)]));
        assert!(matches!(
            problem,
            PolicyProblem::Namespaced {
                replacement: CLUSTER_ROLE,
                ..
            }
        ));
        assert!(message.contains("use ClusterRole instead"), "{message}");
    }

    #[test]
    fn subject_kinds_and_reasons() {
        let crb = binding(
            "readers",
            "kubelet-metrics-reader",
            "- kind: User\n  apiGroup: rbac.authorization.k8s.io\n  name: alice\n\
             - kind: Group\n  name: monitoring\n\
             - kind: ServiceAccount\n  name: agent\n  namespace: mon\n",
        );
        let p = policy(&[("p.yaml", &format!("{METRICS_READER}---\n{crb}"))]).unwrap();
        let prefix = "RBAC: allowed by ClusterRoleBinding \"readers\" of ClusterRole \"kubelet-metrics-reader\" to ";
        let cases = [
            (user("alice", &[]), "User \"alice\""),
            (user("bob", &["monitoring"]), "Group \"monitoring\""),
            (
                user("system:serviceaccount:mon:agent", &[]),
                "ServiceAccount \"agent/mon\"",
            ),
        ];
        for (u, subject) in cases {
            assert_eq!(
                allow_reason_of(decide(&p, &u, "get", "stats", "n1")),
                format!("{prefix}{subject}"),
                "{u:?}"
            );
        }
        // Case-sensitive names; a group named like the user does not count; wrong verb.
        for (u, verb) in [
            (user("Alice", &[]), "get"),
            (user("monitoring", &["Monitoring"]), "get"),
            (user("alice", &[]), "create"),
            (user("system:serviceaccount:other:agent", &["mon"]), "get"),
        ] {
            assert_eq!(
                decide(&p, &u, verb, "stats", "n1"),
                Decision::NoOpinion(NO_BINDING_ALLOWS),
                "{u:?} {verb}"
            );
        }
    }

    #[test]
    fn first_applying_subject_of_a_binding_is_named() {
        // The user matches both subjects; RBAC names the first in the binding's order, even
        // though the index reaches the binding through the user name first.
        let crb = binding(
            "b",
            "kubelet-metrics-reader",
            "- kind: Group\n  name: ops\n- kind: User\n  name: alice\n",
        );
        let p = policy(&[("p.yaml", &format!("{METRICS_READER}---\n{crb}"))]).unwrap();
        let reason = allow_reason_of(decide(&p, &user("alice", &["ops"]), "get", "metrics", "n1"));
        assert!(reason.ends_with("to Group \"ops\""), "{reason}");
        let reason = allow_reason_of(decide(&p, &user("alice", &[]), "get", "metrics", "n1"));
        assert!(reason.ends_with("to User \"alice\""), "{reason}");
    }

    #[test]
    fn first_allowing_binding_in_load_order_is_named() {
        let proxy_role = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n\
                          metadata: {name: proxy}\nrules:\n- apiGroups: [\"\"]\n  \
                          resources: [\"nodes/proxy\"]\n  verbs: [\"*\"]\n";
        // 1st: matches alice but grants nothing for stats; 2nd: via a group; 3rd: via her name;
        // 4th: via another group.
        let first = binding("a-proxy", "proxy", "- kind: User\n  name: alice\n");
        let second = binding(
            "b-group",
            "kubelet-metrics-reader",
            "- kind: Group\n  name: ops\n",
        );
        let third = binding(
            "c-user",
            "kubelet-metrics-reader",
            "- kind: User\n  name: alice\n",
        );
        let fourth = binding(
            "d-late",
            "kubelet-metrics-reader",
            "- kind: Group\n  name: late\n",
        );
        let p = policy(&[
            (
                "bindings.yaml",
                &format!("{first}---\n{second}---\n{third}---\n{fourth}"),
            ),
            ("roles.yaml", &format!("{METRICS_READER}---\n{proxy_role}")),
        ])
        .unwrap();
        let alice = user("alice", &["ops"]);
        let reason = allow_reason_of(decide(&p, &alice, "get", "stats", "n1"));
        assert!(reason.contains("\"b-group\""), "{reason}");
        let reason = allow_reason_of(decide(&p, &user("alice", &[]), "get", "stats", "n1"));
        assert!(reason.contains("\"c-user\""), "{reason}");
        // Found through the user name first, a later binding found through a group loses.
        let reason = allow_reason_of(decide(&p, &user("alice", &["late"]), "get", "stats", "n1"));
        assert!(reason.contains("\"c-user\""), "{reason}");
        let reason = allow_reason_of(decide(&p, &alice, "", "proxy", "n1"));
        assert!(reason.contains("\"a-proxy\""), "{reason}");
        assert_eq!(
            p.stats(),
            PolicyStats {
                cluster_roles: 2,
                cluster_role_bindings: 4,
                rules: 2
            }
        );
    }

    #[test]
    fn multi_document_list_and_kubectl_output_are_accepted() {
        let list = r#"
# leading comment, then empty documents
---
---
apiVersion: v1
kind: List
metadata:
  resourceVersion: ""
items:
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRole
  metadata:
    annotations:
      rbac.authorization.kubernetes.io/autoupdate: "true"
    creationTimestamp: "2024-05-01T10:00:00Z"
    labels:
      kubernetes.io/bootstrapping: rbac-defaults
    name: system:kubelet-api-admin
    resourceVersion: "74"
    uid: 2f1e7c1e-5d5b-4a55-9b8e-0d6c2f3c8d11
  rules:
  - apiGroups:
    - ""
    resources:
    - nodes/proxy
    - nodes/log
    - nodes/stats
    - nodes/metrics
    - nodes/spec
    verbs:
    - '*'
  - nonResourceURLs:
    - /healthz
    verbs:
    - get
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRoleBinding
  metadata:
    name: kube-apiserver-kubelet-client
  roleRef:
    apiGroup: rbac.authorization.k8s.io
    kind: ClusterRole
    name: system:kubelet-api-admin
  subjects:
  - apiGroup: rbac.authorization.k8s.io
    kind: User
    name: kube-apiserver-kubelet-client
---
"#;
        let p = policy(&[("list.yaml", list)]).unwrap();
        assert_eq!(
            p.stats(),
            PolicyStats {
                cluster_roles: 1,
                cluster_role_bindings: 1,
                rules: 2
            }
        );
        let apiserver = user("kube-apiserver-kubelet-client", &["system:masters"]);
        assert_eq!(
            kubelet_allows(&p, &apiserver, "n1", "POST", "/exec/default/pod/ctr").as_deref(),
            Some(
                "RBAC: allowed by ClusterRoleBinding \"kube-apiserver-kubelet-client\" of \
                 ClusterRole \"system:kubelet-api-admin\" to User \"kube-apiserver-kubelet-client\""
            )
        );
        assert_eq!(
            kubelet_allows(&p, &apiserver, "n1", "POST", "/checkpoint/default/pod/ctr"),
            None
        );
    }

    #[test]
    fn roles_name_their_file_line_and_rules_in_load_order() {
        let list = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: rbac.authorization.k8s.io/v1\n  \
                    kind: ClusterRole\n  metadata: {name: in-list}\n  rules:\n  - {apiGroups: [\"\"], \
                    resources: [nodes/proxy], verbs: [get]}\n  - {nonResourceURLs: [/healthz], verbs: [get]}\n";
        let p = policy(&[("a.yaml", METRICS_READER), ("b.yaml", list)]).unwrap();
        let roles: Vec<_> = p
            .roles()
            .map(|r| (r.name, r.source_name, r.line, r.rules.len()))
            .collect();
        assert_eq!(
            roles,
            [
                ("kubelet-metrics-reader", "a.yaml", 2, 1),
                ("in-list", "b.yaml", 4, 2)
            ]
        );
        let in_list = p.roles().nth(1).unwrap();
        assert_eq!(in_list.rules[0].resources, ["nodes/proxy"]);
        assert_eq!(in_list.rules[1].non_resource_urls, ["/healthz"]);
    }

    #[test]
    fn policy_without_bindings_never_allows() {
        for text in ["", "# nothing here\n", METRICS_READER] {
            let p = policy(&[("empty.yaml", text)]).unwrap();
            assert_eq!(
                decide(
                    &p,
                    &user("system:masters", &["system:masters"]),
                    "get",
                    "proxy",
                    "n1"
                ),
                Decision::NoOpinion(NO_BINDING_ALLOWS)
            );
        }
    }

    #[test]
    fn no_sources_is_an_error() {
        assert!(matches!(
            PolicyAuthorizer::load(&[]),
            Err(PolicyError::NoSources)
        ));
        assert!(matches!(
            PolicyAuthorizer::from_sources(&[]),
            Err(PolicyError::NoSources)
        ));
    }

    #[test]
    fn yaml_errors_name_the_source_and_line() {
        let cases = [
            ("kind: ClusterRole\nmetadata: {name: x\n", "line"),
            // An operator's typo in a rule field.
            (
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: x}\n\
                 rules:\n- apiGroups: [\"\"]\n  resources: [nodes/proxy]\n  verb: [get]\n",
                "unknown field `verb`",
            ),
            // Unknown top-level field.
            (
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: x}\nstatus: {}\n",
                "unknown field `status`",
            ),
            // A duplicate key must not silently replace the first value.
            ("kind: ClusterRole\nkind: ClusterRoleBinding\n", "duplicate"),
            ("- not a mapping\n", "line 1"),
        ];
        for (text, needle) in cases {
            match policy(&[("bad.yaml", text)]) {
                Err(e @ PolicyError::Yaml { .. }) => {
                    let message = e.to_string();
                    assert!(
                        message.starts_with("bad.yaml: invalid policy YAML: "),
                        "{message}"
                    );
                    assert!(message.contains(needle), "{message} lacks {needle}");
                    assert!(!message.contains('\n'), "one line: {message}");
                }
                other => panic!("{text:?}: expected a YAML error, got {other:?}"),
            }
        }
        let Err(PolicyError::Yaml { error, .. }) = policy(&[("bad.yaml", cases[1].0)]) else {
            panic!("expected a YAML error")
        };
        assert_eq!(error.location().map(|l| l.line()), Some(7));
    }

    #[test]
    fn manifest_errors_name_file_line_object_and_problem() {
        let rbac = "apiVersion: rbac.authorization.k8s.io/v1";
        let role_ref = "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kubelet-metrics-reader}";
        let cases: Vec<(String, &str, PolicyProblem)> = vec![
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n".into(),
                "document",
                PolicyProblem::UnknownKind("Pod".into()),
            ),
            ("metadata: {name: p}\n".into(), "document", PolicyProblem::MissingKind),
            (
                "apiVersion: rbac.authorization.k8s.io/v1beta1\nkind: ClusterRole\nmetadata: {name: r}\n".into(),
                "ClusterRole \"r\"",
                PolicyProblem::WrongApiVersion {
                    found: "rbac.authorization.k8s.io/v1beta1".into(),
                    expected: RBAC_API_VERSION,
                },
            ),
            (
                "kind: ClusterRoleBinding\nmetadata: {name: b}\n".into(),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::WrongApiVersion { found: String::new(), expected: RBAC_API_VERSION },
            ),
            (
                format!("{rbac}\nkind: List\nitems: []\n"),
                "List",
                PolicyProblem::WrongApiVersion { found: RBAC_API_VERSION.into(), expected: LIST_API_VERSION },
            ),
            (
                "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: List\n".into(),
                "List",
                PolicyProblem::NestedList,
            ),
            (format!("{rbac}\nkind: ClusterRole\nmetadata: {{labels: {{a: b}}}}\n"), "ClusterRole", PolicyProblem::MissingName),
            (
                format!("{rbac}\nkind: ClusterRole\nmetadata: {{name: agg}}\naggregationRule:\n  clusterRoleSelectors:\n  - matchLabels: {{a: b}}\nrules: []\n"),
                "ClusterRole \"agg\"",
                PolicyProblem::Aggregated,
            ),
            (
                format!("{rbac}\nkind: ClusterRole\nmetadata: {{name: r}}\nrules:\n- {{verbs: [get], apiGroups: [\"\"], resources: [nodes/stats]}}\n- {{verbs: [get], resources: [nodes/proxy]}}\n"),
                "ClusterRole \"r\"",
                PolicyProblem::InvalidRule { index: 1, reason: "resource rules must supply at least one api group" },
            ),
            (
                format!("{rbac}\nkind: ClusterRole\nmetadata: {{name: r}}\nrules:\n- {{apiGroups: [\"\"], resources: [nodes/proxy]}}\n"),
                "ClusterRole \"r\"",
                PolicyProblem::InvalidRule { index: 0, reason: "verbs must contain at least one value" },
            ),
            (
                format!("{rbac}\nkind: ClusterRole\nmetadata: {{name: r}}\nrules:\n- {{verbs: [get], apiGroups: [\"\"]}}\n"),
                "ClusterRole \"r\"",
                PolicyProblem::InvalidRule { index: 0, reason: "resource rules must supply at least one resource" },
            ),
            (
                format!("{rbac}\nkind: ClusterRole\nmetadata: {{name: r}}\nrules:\n- {{verbs: [get], nonResourceURLs: [/healthz], resources: [nodes/proxy]}}\n"),
                "ClusterRole \"r\"",
                PolicyProblem::InvalidRule { index: 0, reason: "rules cannot apply to both regular resources and non-resource URLs" },
            ),
            (
                format!("{rbac}\nkind: ClusterRole\nmetadata: {{name: r}}\nsubjects: []\n"),
                "ClusterRole \"r\"",
                PolicyProblem::UnexpectedField { field: "subjects", kind: CLUSTER_ROLE },
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\n{role_ref}\nrules: []\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::UnexpectedField { field: "rules", kind: CLUSTER_ROLE_BINDING },
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\nsubjects: []\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::MissingRoleRef,
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: r}}\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::BadRoleRef { kind: "Role".into(), api_group: RBAC_API_GROUP.into() },
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\nroleRef: {{kind: ClusterRole, name: kubelet-metrics-reader}}\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::BadRoleRef { kind: CLUSTER_ROLE.into(), api_group: String::new() },
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nowhere}}\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::MissingRole("nowhere".into()),
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\n{role_ref}\nsubjects:\n- {{kind: User, name: a}}\n- {{kind: user, name: a}}\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::UnknownSubjectKind { index: 1, kind: "user".into() },
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\n{role_ref}\nsubjects:\n- {{kind: ServiceAccount, name: agent}}\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::ServiceAccountWithoutNamespace { index: 0, name: "agent".into() },
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\n{role_ref}\nsubjects:\n- {{kind: Group, name: \"\"}}\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::EmptySubjectName { index: 0 },
            ),
            (
                format!("{rbac}\nkind: ClusterRoleBinding\nmetadata: {{name: b}}\n{role_ref}\nsubjects:\n- {{kind: ServiceAccount, apiGroup: rbac.authorization.k8s.io, name: a, namespace: n}}\n"),
                "ClusterRoleBinding \"b\"",
                PolicyProblem::BadSubjectApiGroup { index: 0, kind: SERVICE_ACCOUNT_KIND.into(), api_group: RBAC_API_GROUP.into() },
            ),
        ];
        for (text, object, want) in cases {
            // Line 1 of the file is the role; the object under test starts after `---` on line 11.
            let source = format!("{METRICS_READER}---\n{text}");
            let (problem, message) = invalid(policy(&[("cfg/p.yaml", &source)]));
            assert_eq!(problem, want, "{text}");
            let line = if object == "List" && want == PolicyProblem::NestedList {
                14
            } else {
                11
            };
            let prefix = format!("cfg/p.yaml:{line}: {object}: {want}");
            assert_eq!(message, prefix, "{text}");
        }
    }

    #[test]
    fn duplicate_names_point_at_the_first_definition() {
        let (problem, message) = invalid(policy(&[
            ("a.yaml", METRICS_READER),
            (
                "b.yaml",
                &format!(
                    "# the same role again
{METRICS_READER}"
                ),
            ),
        ]));
        assert_eq!(
            problem,
            PolicyProblem::Duplicate {
                first: "a.yaml:2".into()
            }
        );
        assert_eq!(
            message,
            "b.yaml:3: ClusterRole \"kubelet-metrics-reader\": duplicate name, first defined at a.yaml:2"
        );

        let crb = binding(
            "twice",
            "kubelet-metrics-reader",
            "- kind: User\n  name: a\n",
        );
        let (problem, message) = invalid(policy(&[(
            "p.yaml",
            &format!("{METRICS_READER}---\n{crb}---\n{crb}"),
        )]));
        assert_eq!(
            problem,
            PolicyProblem::Duplicate {
                first: "p.yaml:11".into()
            }
        );
        assert!(
            message.starts_with("p.yaml:23: ClusterRoleBinding \"twice\": "),
            "{message}"
        );

        // A role and a binding may share a name: they are different kinds.
        let crb = binding("kubelet-metrics-reader", "kubelet-metrics-reader", "  []\n");
        policy(&[("p.yaml", &format!("{METRICS_READER}---\n{crb}"))]).unwrap();
    }

    #[test]
    fn load_reads_files_in_order_and_reports_unreadable_ones() {
        let dir =
            std::env::temp_dir().join(format!("kubelet-auth-proxy-policy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let roles = dir.join("roles.yaml");
        let bindings = dir.join("bindings.yaml");
        std::fs::write(&roles, METRICS_READER).unwrap();
        std::fs::write(
            &bindings,
            binding(
                "b",
                "kubelet-metrics-reader",
                "- kind: User\n  name: alice\n",
            ),
        )
        .unwrap();

        // The binding's role comes from a file loaded after it.
        let p = PolicyAuthorizer::load(&[bindings.clone(), roles.clone()]).unwrap();
        assert!(matches!(
            decide(&p, &user("alice", &[]), "get", "metrics", "n1"),
            Decision::Allow(_)
        ));

        let missing = dir.join("missing.yaml");
        let err = PolicyAuthorizer::load(&[roles.clone(), missing.clone()]).unwrap_err();
        assert!(
            matches!(&err, PolicyError::Read { path, .. } if *path == missing),
            "{err:?}"
        );
        assert!(
            err.to_string().contains(&missing.display().to_string()),
            "{err}"
        );

        // A directory given by mistake.
        let err = PolicyAuthorizer::load(std::slice::from_ref(&dir)).unwrap_err();
        assert!(matches!(err, PolicyError::Read { .. }), "{err:?}");

        // Errors inside a file name that file.
        let bad = dir.join("bad.yaml");
        std::fs::write(&bad, "apiVersion: v1\nkind: Secret\n").unwrap();
        let err = PolicyAuthorizer::load(&[roles, bad.clone()])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("{}:1: document: ", bad.display())),
            "{err}"
        );

        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn endless_file_is_refused() {
        let path = PathBuf::from("/dev/zero");
        match PolicyAuthorizer::load(std::slice::from_ref(&path)) {
            Err(PolicyError::TooLarge { path: p, limit }) => {
                assert_eq!(p, path);
                assert_eq!(limit, MAX_POLICY_FILE_BYTES);
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
    }

    #[test]
    fn names_are_quoted_like_go_in_reasons() {
        let crb = binding(
            "b",
            "kubelet-metrics-reader",
            "- kind: User\n  name: \"eve\\\"\\n\\u0001\\\\x\\u0085\\u2028é\"\n",
        );
        let p = policy(&[("p.yaml", &format!("{METRICS_READER}---\n{crb}"))]).unwrap();
        let eve = user("eve\"\n\u{1}\\x\u{85}\u{2028}é", &[]);
        let reason = allow_reason_of(decide(&p, &eve, "get", "stats", "n1"));
        assert!(
            reason.ends_with(r#"to User "eve\"\n\x01\\x\u0085\u2028é""#),
            "{reason}"
        );
    }

    #[test]
    fn index_finds_the_right_binding_among_ten_thousand() {
        const N: usize = 10_000;
        let mut text = String::from(METRICS_READER);
        for i in 0..N {
            let subjects = format!("- kind: User\n  name: user-{i}\n");
            text.push_str("---\n");
            text.push_str(&binding(
                &format!("binding-{i}"),
                "kubelet-metrics-reader",
                &subjects,
            ));
        }
        // One binding per node-scoped role, for a user whose access is limited to one node.
        let scoped = "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n\
                      metadata: {name: node-7-stats}\nrules:\n- apiGroups: [\"\"]\n  \
                      resources: [nodes/stats]\n  verbs: [get]\n  resourceNames: [node-7]\n---\n";
        text.push_str(scoped);
        text.push_str(&binding(
            "scoped",
            "node-7-stats",
            "- kind: Group\n  name: node-7-readers\n",
        ));
        let p = policy(&[("big.yaml", &text)]).unwrap();
        assert_eq!(p.stats().cluster_role_bindings, N + 1);

        for i in [0, 1, 4_242, N - 1] {
            let reason = allow_reason_of(decide(
                &p,
                &user(&format!("user-{i}"), &[]),
                "get",
                "stats",
                "n1",
            ));
            assert_eq!(
                reason,
                format!(
                    "RBAC: allowed by ClusterRoleBinding \"binding-{i}\" of ClusterRole \
                     \"kubelet-metrics-reader\" to User \"user-{i}\""
                )
            );
        }
        for name in [format!("user-{N}"), "user-".into(), "User-1".into()] {
            assert_eq!(
                decide(
                    &p,
                    &user(&name, &["system:authenticated"]),
                    "get",
                    "stats",
                    "n1"
                ),
                Decision::NoOpinion(NO_BINDING_ALLOWS),
                "{name}"
            );
        }
        let reader = user("someone", &["system:authenticated", "node-7-readers"]);
        assert!(
            allow_reason_of(decide(&p, &reader, "get", "stats", "node-7")).contains("\"scoped\"")
        );
        assert_eq!(
            decide(&p, &reader, "get", "stats", "node-8"),
            Decision::NoOpinion(NO_BINDING_ALLOWS)
        );
    }
}

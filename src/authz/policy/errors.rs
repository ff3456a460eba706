//! Why a policy does not load: the file could not be read or parsed, or an object in it is one
//! the API server would refuse or that could never match, named with its file and line.

use std::io;
use std::path::PathBuf;

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
    /// The file exceeds [`MAX_POLICY_FILE_BYTES`](super::MAX_POLICY_FILE_BYTES).
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
        /// What is wrong with it (boxed: the error stays small on the success path).
        problem: Box<PolicyProblem>,
    },
}

/// What is wrong with one manifest object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyProblem {
    /// The document has no `kind`.
    #[error(
        "missing `kind`: expected ClusterRole, ClusterRoleBinding, Role, RoleBinding or a list \
         of them"
    )]
    MissingKind,
    /// Any other kind.
    #[error(
        "unsupported kind {0:?}: expected ClusterRole, ClusterRoleBinding, Role, RoleBinding or \
         a list of them"
    )]
    UnknownKind(String),
    /// A Role or RoleBinding without `metadata.namespace`.
    #[error("metadata.namespace is missing: a {kind} belongs to a namespace")]
    MissingNamespace {
        /// `Role` or `RoleBinding`.
        kind: &'static str,
    },
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
    /// An item of a typed list (`ClusterRoleList`) of another kind.
    #[error("a {list} holds only {expected} items")]
    WrongItemKind {
        /// The list's kind.
        list: &'static str,
        /// The kind its items must have.
        expected: &'static str,
    },
    /// An `aggregationRule` selector the clusterrole-aggregation controller could not use.
    #[error("aggregationRule.clusterRoleSelectors[{index}]: {reason}")]
    BadSelector {
        /// Position in `clusterRoleSelectors`.
        index: usize,
        /// What is wrong, in `metav1.LabelSelectorAsSelector`'s words.
        reason: String,
    },
    /// A rule the API server's validation would reject; most such rules could never match.
    #[error("rules[{index}]: {reason}")]
    InvalidRule {
        /// Position in `rules`.
        index: usize,
        /// What is wrong, in the API server's words.
        reason: &'static str,
    },
    /// A binding without `roleRef`.
    #[error("missing roleRef")]
    MissingRoleRef,
    /// A roleRef that is not `kind: ClusterRole` (or `Role` in a RoleBinding) with
    /// `apiGroup: rbac.authorization.k8s.io`.
    #[error(
        "roleRef must have kind {} and apiGroup \"rbac.authorization.k8s.io\", found kind \
         {kind:?} and apiGroup {api_group:?}",
        if *binding == "RoleBinding" { "\"Role\" or \"ClusterRole\"" } else { "\"ClusterRole\"" }
    )]
    BadRoleRef {
        /// The binding's kind.
        binding: &'static str,
        /// The roleRef's kind.
        kind: String,
        /// The roleRef's apiGroup.
        api_group: String,
    },
    /// The roleRef names a role that none of the policy files defines.
    #[error(
        "roleRef names {kind} {name:?}{}, which no policy file defines",
        if *kind == "Role" { format!(" in namespace {namespace:?}") } else { String::new() }
    )]
    MissingRole {
        /// `ClusterRole` or `Role`.
        kind: &'static str,
        /// The role's name.
        name: String,
        /// The binding's namespace (where a Role is looked up); empty for a ClusterRoleBinding.
        namespace: String,
    },
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
    /// A ServiceAccount subject without namespace in a ClusterRoleBinding: it never matches.
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

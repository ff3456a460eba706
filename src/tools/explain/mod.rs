//! `kubelet-auth-proxy explain`: why the proxy would allow or refuse one request for one identity,
//! step by step (path gate, attribute sets, each authorizer's answer, the exact response), from the
//! server's own configuration and code, plus warnings for local policy rules that can never match.

mod check;
mod render;
mod trace;

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write as _;
use std::path::PathBuf;

use http::Method;
use serde::Serialize;

use crate::authn::{ANONYMOUS_USER, UNAUTHENTICATED_GROUP, User};
use crate::authz::live_rbac::{RbacStatus, State as RbacState};
use crate::config::AuthorizationSettings;
use crate::config::file::Origins;
use crate::config::flags::ProxyFlags;
use crate::request::outcome::Outcome;
use crate::startup::assemble::decider_for_explain;

pub use crate::authz::policy::lint::{
    PolicyLint, PolicyWarning, UnlistedRules, lint_policies, role_lint,
};
pub use render::{render_json, render_text};
pub use trace::explain;

/// `apiVersion` of the JSON document, changed only with an incompatible change of its shape.
pub const API_VERSION: &str = "kubelet-auth-proxy/v1alpha1";
/// `kind` of the JSON document.
pub const KIND: &str = "Explanation";

/// Exit status when the request would be forwarded to the kubelet.
pub const EXIT_ALLOWED: u8 = 0;
/// Exit status when the proxy would refuse it (403, 301, 400).
pub const EXIT_NOT_ALLOWED: u8 = 1;
/// Exit status for bad input (flags, configuration), and when an authorizer fails (the proxy would
/// answer 500): the question could not be answered either way, so a script must not read it as
/// "denied".
pub const EXIT_ERROR: u8 = 2;

/// How `explain` prints its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Lines for people; policy warnings on stderr.
    Text,
    /// One JSON document for scripts, warnings included.
    Json,
}

/// Options of `kubelet-auth-proxy explain`, besides the server's own flags.
#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// The caller's user name, taken as authenticated: explain answers "may this identity do this",
    /// it does not check credentials.
    #[arg(
        long,
        value_name = "NAME",
        required_unless_present_any = ["anonymous", "check"],
        help_heading = "Identity"
    )]
    pub user: Option<String>,
    /// A group of the caller (repeatable). Add system:authenticated yourself: the authenticators
    /// add it to every authenticated caller.
    #[arg(long = "group", value_name = "GROUP", help_heading = "Identity")]
    pub groups: Vec<String>,
    /// The caller's uid.
    #[arg(long, value_name = "UID", help_heading = "Identity")]
    pub uid: Option<String>,
    /// An extra attribute of the caller, KEY=VALUE (repeatable; repeat a key for several values).
    #[arg(long = "extra", value_name = "KEY=VALUE", value_parser = parse_extra, help_heading = "Identity")]
    pub extra: Vec<(String, String)>,
    /// The anonymous caller: system:anonymous in group system:unauthenticated.
    #[arg(long, conflicts_with_all = ["user", "groups", "uid", "extra"], help_heading = "Identity")]
    pub anonymous: bool,
    /// Output format: text, or a JSON document for scripts.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// Check every row of a table of requests and the answers they must get, instead of
    /// explaining one request: exit 0 when all match, 1 on any mismatch, 2 on bad input or an
    /// authorizer error (see docs/EXPLAIN.md for the format).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["user", "groups", "uid", "extra", "anonymous", "method", "path"]
    )]
    pub check: Option<PathBuf>,
    /// The HTTP method, case-sensitive as the kubelet compares it (GET, POST, PUT, PATCH, DELETE,
    /// HEAD, …).
    #[arg(value_name = "METHOD", value_parser = parse_method, required_unless_present = "check")]
    pub method: Option<Method>,
    /// The request path as sent on the wire (percent-encoded), optionally with ?query.
    #[arg(value_name = "PATH", required_unless_present = "check")]
    pub path: Option<String>,
    #[command(flatten)]
    pub flags: Box<ProxyFlags>,
}

/// `KEY=VALUE` for `--extra`; the key must not be empty.
fn parse_extra(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!(
            "expected KEY=VALUE with a non-empty KEY, got {s:?}"
        )),
    }
}

/// An HTTP method token. A lower-case method is refused: the kubelet maps `get` to the empty verb,
/// which is almost never what the operator meant to ask about.
pub(crate) fn parse_method(s: &str) -> Result<Method, String> {
    if s.bytes().any(|b| b.is_ascii_lowercase()) {
        return Err(format!(
            "methods are case-sensitive and the kubelet maps {s:?} to no verb; did you mean {:?}?",
            s.to_ascii_uppercase()
        ));
    }
    Method::from_bytes(s.as_bytes()).map_err(|_| format!("{s:?} is not an HTTP method"))
}

impl ExplainArgs {
    /// The identity given on the command line.
    pub fn user(&self) -> User {
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (key, value) in &self.extra {
            extra.entry(key.clone()).or_default().push(value.clone());
        }
        caller(
            self.anonymous,
            self.user.as_deref().unwrap_or_default(),
            self.uid.as_deref().unwrap_or_default(),
            &self.groups,
            extra,
        )
    }
}

/// The caller explain asks about, from the command line or a `--check` row: the anonymous
/// identity as the authenticators make it, or the user as given, taken as authenticated.
fn caller(
    anonymous: bool,
    name: &str,
    uid: &str,
    groups: &[String],
    extra: BTreeMap<String, Vec<String>>,
) -> User {
    if anonymous {
        return User {
            name: ANONYMOUS_USER.to_owned(),
            groups: vec![UNAUTHENTICATED_GROUP.to_owned()],
            ..User::default()
        };
    }
    User {
        name: name.to_owned(),
        uid: uid.to_owned(),
        groups: groups.to_vec(),
        extra,
    }
}

/// Loads what authorization depends on as the server does, explains the request (or checks the
/// `--check` table), prints the answer and returns the exit status ([`EXIT_ALLOWED`],
/// [`EXIT_NOT_ALLOWED`], [`EXIT_ERROR`]).
pub async fn run(args: &ExplainArgs, origins: &Origins) -> u8 {
    let loaded = AuthorizationSettings::load(&args.flags)
        .await
        .and_then(decider_for_explain);
    let decider = match loaded {
        Ok(decider) => decider,
        Err(e) => {
            eprintln!("kubelet-auth-proxy: {}", origins.describe(&e));
            return EXIT_ERROR;
        }
    };
    if let Some(rbac) = decider.authorizers.rbac()
        && !rbac.wait_synced(RBAC_SYNC_WAIT).await
    {
        eprintln!(
            "kubelet-auth-proxy: warning: the RBAC authorizer could not list roles and bindings \
             within {}s (see the log above): it has no opinion in this answer",
            RBAC_SYNC_WAIT.as_secs()
        );
    }
    if let Some(table) = &args.check {
        return check::run(&decider, table, args.output).await;
    }
    let (Some(method), Some(path)) = (&args.method, &args.path) else {
        eprintln!("kubelet-auth-proxy: explain needs METHOD and PATH, or --check FILE");
        return EXIT_ERROR;
    };
    let explanation = explain(&decider, method, path, &args.user()).await;
    let document = match args.output {
        OutputFormat::Text => {
            explanation.print_warnings();
            render_text(&explanation)
        }
        OutputFormat::Json => render_json(&explanation) + "\n",
    };
    print(&document, explanation.exit_status())
}

/// Writes `document` to stdout and returns `status`; a closed stdout (`explain … | head -1`) is
/// [`EXIT_ERROR`], not a panic.
fn print(document: &str, status: u8) -> u8 {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(document.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => status,
        Err(_) => EXIT_ERROR,
    }
}

/// The watched state the `RBAC` authorizer decided from.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RbacView {
    /// `fresh`, `stale` (a watch is broken, the last state still decides), `expired` (broken
    /// longer than `--rbac-max-staleness`: no opinion) or `not synced` (no opinion).
    pub state: &'static str,
    /// How old the policy in force is, in seconds: since it was last rebuilt from the watched
    /// objects. Absent before the first complete list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_age_seconds: Option<f64>,
    /// Per watched kind (`clusterroles`, …), seconds since the API server last answered about it.
    pub last_contact_seconds: BTreeMap<&'static str, Option<f64>>,
}

impl RbacView {
    /// The view of `status`.
    pub fn of(status: &RbacStatus) -> RbacView {
        RbacView {
            state: match status.state {
                RbacState::NotSynced { .. } => "not synced",
                RbacState::Fresh => "fresh",
                RbacState::Stale { .. } => "stale",
                RbacState::Expired { .. } => "expired",
            },
            policy_age_seconds: status.policy_age.map(|age| age.as_secs_f64()),
            last_contact_seconds: status
                .contact
                .iter()
                .map(|(kind, since)| (kind.resource(), since.map(|s| s.as_secs_f64())))
                .collect(),
        }
    }
}

/// How long `explain` waits for the `RBAC` authorizer's first lists before deciding without them.
const RBAC_SYNC_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// Everything `explain` found out about one request, in the order the proxy decides.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// Always [`API_VERSION`].
    pub api_version: &'static str,
    /// Always [`KIND`].
    pub kind: &'static str,
    /// What was asked.
    pub request: RequestInfo,
    /// The Node name every attribute carries.
    pub node_name: String,
    /// The authorizer chain, in order.
    pub authorizers: Vec<&'static str>,
    /// What the `RBAC` authorizer decided from, when the chain has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rbac: Option<RbacView>,
    /// The path gate's verdict.
    pub path: PathVerdict,
    /// The verb, empty for methods the kubelet does not map; absent when the path gate answered.
    pub verb: Option<&'static str>,
    /// Every `nodes/<subresource>` that may be tried, in order; empty when the path gate answered.
    pub subresources: Vec<&'static str>,
    /// The pod-level set, when it was asked (`--pod-scoped-authz`, a container path, and no
    /// node-level set allowed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_attributes: Option<PodSet>,
    /// The attribute sets actually tried, in order: the loop stops at the first allowed one or at
    /// an error. The pod-level set's `subresource` is its label, `pods/<subresource>`.
    pub attributes: Vec<AttributeTrial>,
    /// What the proxy does in the end.
    pub result: Conclusion,
    /// Local policy rules meant for the kubelet that can never match a kubelet request.
    pub warnings: Vec<PolicyWarning>,
    /// The other rules that can never match (about other resources, or Kubernetes' own roles),
    /// counted.
    pub unlisted_rules: UnlistedRules,
}

impl Explanation {
    /// Writes the policy warnings, then the count of unlisted rules, to stderr.
    pub fn print_warnings(&self) {
        for warning in &self.warnings {
            eprintln!("kubelet-auth-proxy: warning: {warning}");
        }
        if self.unlisted_rules.rules > 0 {
            eprintln!("kubelet-auth-proxy: note: {}", self.unlisted_rules);
        }
    }

    /// [`EXIT_ALLOWED`] when forwarded, [`EXIT_ERROR`] on an authorizer error, else
    /// [`EXIT_NOT_ALLOWED`].
    pub fn exit_status(&self) -> u8 {
        match self.result.outcome {
            Outcome::Allowed => EXIT_ALLOWED,
            Outcome::AuthorizationError => EXIT_ERROR,
            _ => EXIT_NOT_ALLOWED,
        }
    }
}

/// The request as given.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestInfo {
    /// The HTTP method.
    pub method: String,
    /// The path (and query) as given.
    pub path: String,
    /// The identity, taken as authenticated.
    pub user: UserInfo,
}

/// The identity in Kubernetes' `UserInfo` shape.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UserInfo {
    /// User name.
    pub username: String,
    /// Uid, empty when none.
    pub uid: String,
    /// Groups, in order.
    pub groups: Vec<String>,
    /// Extra attributes.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What the path gate decides before authentication.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "camelCase")]
pub enum PathVerdict {
    /// The path is canonical; attributes come from `decoded`.
    Canonical {
        /// The percent-decoded path the attributes are computed from.
        decoded: String,
    },
    /// The path is unclean: 301 to `location` (query included).
    Redirect {
        /// The `Location` header.
        location: String,
    },
    /// The path is malformed or ambiguous: 400.
    Rejected {
        /// Why.
        reason: String,
    },
}

/// One attribute set (`nodes/<subresource>`) and the authorizers' answers on it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttributeTrial {
    /// The subresource.
    pub subresource: &'static str,
    /// Each authorizer of the chain, in order; those after the deciding one are `NotAsked`.
    pub answers: Vec<AuthorizerAnswer>,
    /// The chain's decision: `Allow`, `Deny`, `NoOpinion` or `Error`.
    pub decision: Answer,
    /// The authorizer whose `Allow` or `Deny` decided, if one did.
    pub decided_by: Option<&'static str>,
}

/// The pod-level attribute set of a request (`--pod-scoped-authz`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSet {
    /// `pods/<subresource>`.
    pub resource: &'static str,
    /// The verb the API server would check.
    pub verb: &'static str,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
}

/// One authorizer's answer on one attribute set.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizerAnswer {
    /// The mode name (`Node`, `Policy`, `Webhook`, …).
    pub authorizer: &'static str,
    /// What it answered.
    pub answer: Answer,
    /// Its reason (the RBAC binding and role, the SubjectAccessReview's reason, the error);
    /// empty when not asked or when none was given.
    pub reason: String,
    /// A Webhook authorizer's match conditions, in order, each with its result; absent when it
    /// has none (or was not asked).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub match_conditions: Vec<ConditionAnswer>,
    /// What the match conditions made of the webhook; absent when there are none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookStep>,
}

/// One match condition of a Webhook authorizer and its result on one attribute set.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionAnswer {
    /// The CEL expression.
    pub expression: String,
    /// Its result.
    pub result: ConditionOutcome,
    /// Why it could not be evaluated, when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A match condition's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ConditionOutcome {
    /// True.
    True,
    /// False: the webhook is skipped.
    False,
    /// Could not be evaluated, or is not a bool.
    Error,
    /// Not evaluated: an earlier condition is false.
    NotEvaluated,
}

impl fmt::Display for ConditionOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConditionOutcome::True => "true",
            ConditionOutcome::False => "false",
            ConditionOutcome::Error => "error",
            ConditionOutcome::NotEvaluated => "not evaluated",
        })
    }
}

/// Whether a Webhook authorizer with match conditions asked its webhook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum WebhookStep {
    /// Every condition is true: the webhook is asked (its answer may come from its cache).
    Called,
    /// A condition is false: no opinion, without asking.
    Skipped,
    /// No condition is false and some could not be evaluated: not asked, the failure policy
    /// answers.
    NotCalled,
}

/// An authorizer's (or the chain's) answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Answer {
    /// Allowed.
    Allow,
    /// Explicitly denied: later authorizers are not asked.
    Deny,
    /// No opinion: the next authorizer is asked.
    NoOpinion,
    /// Could not decide (e.g. the API server unreachable).
    Error,
    /// Not asked, because an earlier authorizer decided or failed with `failurePolicy: Deny`.
    NotAsked,
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Answer::Allow => "Allow",
            Answer::Deny => "Deny",
            Answer::NoOpinion => "NoOpinion",
            Answer::Error => "Error",
            Answer::NotAsked => "NotAsked",
        })
    }
}

/// The final answer: forwarded, or the exact refusal the proxy sends.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Conclusion {
    /// How it ends, in the vocabulary of the proxy's metrics (`decision` label), spelled
    /// `forwarded`, `redirect`, `badRequest`, `forbidden` or `authorizationError` here.
    pub outcome: Outcome,
    /// Whether the request reaches the kubelet.
    pub allowed: bool,
    /// The proxy's status code; absent when forwarded (the kubelet answers).
    pub status: Option<u16>,
    /// The proxy's response headers (lower-case names); empty when forwarded.
    pub headers: BTreeMap<String, String>,
    /// The proxy's response body, byte for byte; absent when forwarded.
    pub body: Option<String>,
}

#[cfg(test)]
mod tests;

//! `kubelet-auth-proxy explain`: why the proxy would allow or refuse one request for one identity,
//! step by step (path gate, attribute sets, each authorizer's answer, the exact response), from the
//! server's own configuration and code, plus warnings for local policy rules that can never match.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::sync::Arc;

use http::{Method, Response};
use http_body_util::BodyExt;
use serde::Serialize;

use crate::assemble::decider_for_explain;
use crate::authn::{ANONYMOUS_USER, Authentication, UNAUTHENTICATED_GROUP, User};
use crate::authz::attributes::{AttributeMapping, kubelet_verbs};
use crate::authz::policy::PolicyRole;
use crate::authz::rbac::PolicyRule;
use crate::authz::{AuthorizationError, Authorizer, AuthorizerChain, Decision};
use crate::config::AuthorizationSettings;
use crate::config::flags::ProxyFlags;
use crate::decision::{Decider, Observer, Verdict};
use crate::metrics::Outcome;
use crate::responses::ResponseBody;

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

/// The RBAC wildcard.
const ALL: &str = "*";

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
        required_unless_present = "anonymous",
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
    /// The HTTP method, case-sensitive as the kubelet compares it (GET, POST, PUT, PATCH, DELETE,
    /// HEAD, …).
    #[arg(value_name = "METHOD", value_parser = parse_method)]
    pub method: Method,
    /// The request path as sent on the wire (percent-encoded), optionally with ?query.
    #[arg(value_name = "PATH")]
    pub path: String,
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
fn parse_method(s: &str) -> Result<Method, String> {
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
        if self.anonymous {
            return User {
                name: ANONYMOUS_USER.to_owned(),
                groups: vec![UNAUTHENTICATED_GROUP.to_owned()],
                ..User::default()
            };
        }
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (key, value) in &self.extra {
            extra.entry(key.clone()).or_default().push(value.clone());
        }
        User {
            name: self.user.clone().unwrap_or_default(),
            uid: self.uid.clone().unwrap_or_default(),
            groups: self.groups.clone(),
            extra,
        }
    }
}

/// Loads the configuration as the server does, explains the request, prints the answer and
/// returns the exit status ([`EXIT_ALLOWED`], [`EXIT_NOT_ALLOWED`], [`EXIT_ERROR`]).
pub async fn run(args: &ExplainArgs) -> u8 {
    let loaded = AuthorizationSettings::load(&args.flags)
        .await
        .and_then(decider_for_explain);
    let decider = match loaded {
        Ok(decider) => decider,
        Err(e) => {
            eprintln!("kubelet-auth-proxy: {e}");
            return EXIT_ERROR;
        }
    };
    let explanation = explain(&decider, &args.method, &args.path, &args.user()).await;
    let document = match args.output {
        OutputFormat::Text => {
            for warning in &explanation.warnings {
                eprintln!("kubelet-auth-proxy: warning: {warning}");
            }
            render_text(&explanation)
        }
        OutputFormat::Json => render_json(&explanation) + "\n",
    };
    // A closed stdout (`explain … | head -1`) is an error status, not a panic.
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(document.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => explanation.exit_status(),
        Err(_) => EXIT_ERROR,
    }
}

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
    /// The path gate's verdict.
    pub path: PathVerdict,
    /// The verb, empty for methods the kubelet does not map; absent when the path gate answered.
    pub verb: Option<&'static str>,
    /// Every `nodes/<subresource>` that may be tried, in order; empty when the path gate answered.
    pub subresources: Vec<&'static str>,
    /// The attribute sets actually tried, in order: the loop stops at the first allowed one or at
    /// an error.
    pub attributes: Vec<AttributeTrial>,
    /// What the proxy does in the end.
    pub result: Conclusion,
    /// Local policy rules that can never match a kubelet request.
    pub warnings: Vec<PolicyWarning>,
}

impl Explanation {
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

/// A policy rule part that no kubelet request can match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyWarning {
    /// The policy file.
    pub file: String,
    /// The line where the ClusterRole starts.
    pub line: u64,
    /// The ClusterRole's name.
    pub role: String,
    /// The rule's index in `rules`.
    pub rule: usize,
    /// The rule field at fault: `verbs`, `apiGroups`, `resources`, `resourceNames` or
    /// `nonResourceURLs`.
    pub field: &'static str,
    /// What can never match, and why.
    pub message: String,
    /// Whether the whole rule can never match (otherwise only this entry is dead).
    pub rule_never_matches: bool,
}

impl fmt::Display for PolicyWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: ClusterRole {:?} rules[{}]: {}{}",
            self.file,
            self.line,
            self.role,
            self.rule,
            self.message,
            if self.rule_never_matches {
                "; this rule can never match a kubelet request"
            } else {
                ""
            }
        )
    }
}

/// Explains `method target` for `user`, taken as authenticated, by deciding it exactly as the
/// server does ([`Decider::decide`]) with an observer that records each authorizer's answer, and
/// showing the response the server would send ([`crate::decision::Refusal::answer`]). Webhook
/// authorizers make real SubjectAccessReview calls.
pub async fn explain(decider: &Decider, method: &Method, target: &str, user: &User) -> Explanation {
    let (raw_path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    };
    let chain = &decider.authorizers;
    let mut recorder = Recorder {
        chain,
        decoded: String::new(),
        trials: Vec::new(),
    };
    let caller = Arc::new(user.clone());
    let verdict = decider
        .decide(
            method,
            raw_path,
            query,
            || std::future::ready(Authentication::User(caller)),
            &mut recorder,
        )
        .await;
    let path = match &verdict {
        Verdict::Redirect { location } => PathVerdict::Redirect {
            location: location.clone(),
        },
        Verdict::BadPath(reason) => PathVerdict::Rejected {
            reason: reason.to_string(),
        },
        Verdict::Unauthenticated { .. } | Verdict::Authorized(_) => PathVerdict::Canonical {
            decoded: recorder.decoded,
        },
    };
    let (verb, subresources) = match &verdict {
        Verdict::Authorized(judgement) => (
            Some(judgement.attributes.verb),
            judgement.attributes.subresources.iter().collect(),
        ),
        _ => (None, Vec::new()),
    };
    let result = match verdict.refusal() {
        None => forwarded(),
        Some(refusal) => {
            let (response, outcome) = refusal.answer(method);
            refused(outcome, response).await
        }
    };
    Explanation {
        api_version: API_VERSION,
        kind: KIND,
        request: RequestInfo {
            method: method.to_string(),
            path: target.to_owned(),
            user: UserInfo {
                username: user.name.clone(),
                uid: user.uid.clone(),
                groups: user.groups.clone(),
                extra: user.extra.clone(),
            },
        },
        node_name: decider.node_name.to_string(),
        authorizers: chain.authorizers().iter().map(Authorizer::name).collect(),
        path,
        verb,
        subresources,
        attributes: recorder.trials,
        result,
        warnings: policy_warnings(chain, &decider.mapping, &decider.node_name),
    }
}

/// Records the decoded path and, per attribute set, every authorizer's answer; authorizers the
/// chain did not ask (after the deciding one) are listed as not asked.
struct Recorder<'a> {
    chain: &'a AuthorizerChain,
    decoded: String,
    trials: Vec<AttributeTrial>,
}

impl Observer for Recorder<'_> {
    fn canonical(&mut self, decoded: &str) {
        decoded.clone_into(&mut self.decoded);
    }

    fn answered(
        &mut self,
        subresource: &'static str,
        authorizer: &Authorizer,
        answer: &Result<Decision, AuthorizationError>,
    ) {
        if self
            .trials
            .last()
            .is_none_or(|t| t.subresource != subresource)
        {
            self.trials.push(AttributeTrial {
                subresource,
                answers: Vec::with_capacity(self.chain.authorizers().len()),
                decision: Answer::NotAsked,
                decided_by: None,
            });
        }
        let (answer, reason) = match answer {
            Ok(Decision::Allow(reason)) => (Answer::Allow, reason.to_string()),
            Ok(Decision::Deny(reason)) => (Answer::Deny, reason.to_string()),
            Ok(Decision::NoOpinion(reason)) => (Answer::NoOpinion, reason.to_string()),
            Err(error) => (Answer::Error, error.to_string()),
        };
        if let Some(trial) = self.trials.last_mut() {
            trial.answers.push(AuthorizerAnswer {
                authorizer: authorizer.name(),
                answer,
                reason,
            });
        }
    }

    fn decided(
        &mut self,
        subresource: &'static str,
        result: &Result<(Decision, Option<&'static str>), AuthorizationError>,
    ) {
        if self
            .trials
            .last()
            .is_none_or(|t| t.subresource != subresource)
        {
            self.trials.push(AttributeTrial {
                subresource,
                answers: Vec::new(),
                decision: Answer::NotAsked,
                decided_by: None,
            });
        }
        let Some(trial) = self.trials.last_mut() else {
            return;
        };
        for authorizer in self.chain.authorizers().iter().skip(trial.answers.len()) {
            trial.answers.push(AuthorizerAnswer {
                authorizer: authorizer.name(),
                answer: Answer::NotAsked,
                reason: String::new(),
            });
        }
        (trial.decision, trial.decided_by) = match result {
            Ok((Decision::Allow(_), by)) => (Answer::Allow, *by),
            Ok((Decision::Deny(_), by)) => (Answer::Deny, *by),
            Ok((Decision::NoOpinion(_), _)) => (Answer::NoOpinion, None),
            Err(_) => (Answer::Error, None),
        };
    }
}

/// The outcome of an allowed request: the kubelet answers.
fn forwarded() -> Conclusion {
    Conclusion {
        outcome: Outcome::Allowed,
        allowed: true,
        status: None,
        headers: BTreeMap::new(),
        body: None,
    }
}

/// A refusal as the proxy sends it: status, headers and body taken from the response itself.
async fn refused(outcome: Outcome, response: Response<ResponseBody>) -> Conclusion {
    let (parts, body) = response.into_parts();
    let headers = parts
        .headers
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    // Refusals are built in memory (`Full`), so collecting them cannot fail.
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    Conclusion {
        outcome,
        allowed: false,
        status: Some(parts.status.as_u16()),
        headers,
        body: Some(String::from_utf8_lossy(&body).into_owned()),
    }
}

/// Warnings for every rule of every local policy in `chain` that can never match a kubelet
/// request on `node_name` under `mapping`.
pub fn policy_warnings(
    chain: &AuthorizerChain,
    mapping: &AttributeMapping,
    node_name: &str,
) -> Vec<PolicyWarning> {
    let mut warnings = Vec::new();
    for authorizer in chain.authorizers() {
        if let Authorizer::Policy(policy) = authorizer {
            for role in policy.current().roles() {
                warnings.extend(role_warnings(&role, mapping, node_name));
            }
        }
    }
    warnings
}

/// What the kubelet ever asks about, from the attribute table in force.
struct Asked {
    verbs: [&'static str; 5],
    subresources: Vec<&'static str>,
}

/// Warnings for the rules of one ClusterRole: entries of a rule that no kubelet request can
/// match under `mapping`, each marked with whether the rule as a whole is dead.
pub fn role_warnings(
    role: &PolicyRole<'_>,
    mapping: &AttributeMapping,
    node_name: &str,
) -> Vec<PolicyWarning> {
    let asked = Asked {
        verbs: kubelet_verbs(),
        subresources: mapping.subresources(),
    };
    let mut warnings = Vec::new();
    for (index, rule) in role.rules.iter().enumerate() {
        let (found, dead) = rule_warnings(rule, &asked, node_name);
        warnings.extend(found.into_iter().map(|(field, message)| PolicyWarning {
            file: role.source_name.to_owned(),
            line: role.line,
            role: role.name.to_owned(),
            rule: index,
            field,
            message,
            rule_never_matches: dead,
        }));
    }
    warnings
}

/// The dead entries of one rule as `(field, message)`, and whether the whole rule is dead.
fn rule_warnings(
    rule: &PolicyRule,
    asked: &Asked,
    node_name: &str,
) -> (Vec<(&'static str, String)>, bool) {
    if !rule.non_resource_urls.is_empty() {
        let message = format!(
            "nonResourceURLs {:?} never match: the kubelet only makes resource requests \
             (nodes/<subresource>)",
            rule.non_resource_urls
        );
        return (vec![("nonResourceURLs", message)], true);
    }
    let mut found = Vec::new();
    let mut dead = false;

    let verb_live = |v: &String| v == ALL || v.is_empty() || asked.verbs.contains(&v.as_str());
    for verb in rule.verbs.iter().filter(|v| !verb_live(v)) {
        found.push((
            "verbs",
            format!(
                "verb {verb:?} is never asked: the kubelet asks only {} (and \"\" for other \
                 methods)",
                asked.verbs.join(", ")
            ),
        ));
    }
    dead |= !rule.verbs.iter().any(verb_live);

    let group_live = |g: &String| g.is_empty() || g == ALL;
    for group in rule.api_groups.iter().filter(|g| !group_live(g)) {
        found.push((
            "apiGroups",
            format!(
                "apiGroup {group:?} never matches: kubelet requests are in the core group \"\""
            ),
        ));
    }
    dead |= !rule.api_groups.iter().any(group_live);

    let mut any_resource_live = false;
    for resource in &rule.resources {
        match resource_problem(resource, &asked.subresources) {
            Some(message) => found.push(("resources", message)),
            None => any_resource_live = true,
        }
    }
    dead |= !any_resource_live;

    if !rule.resource_names.is_empty() && !rule.resource_names.iter().any(|n| n == node_name) {
        found.push((
            "resourceNames",
            format!(
                "resourceNames {:?} do not include this node's name {node_name:?}",
                rule.resource_names
            ),
        ));
        dead = true;
    }
    (found, dead)
}

/// Why a `resources` entry never matches a kubelet request, or `None` when it can.
fn resource_problem(resource: &str, subresources: &[&str]) -> Option<String> {
    if resource == ALL {
        return None;
    }
    let subresource = match resource.split_once('/') {
        Some(("nodes" | ALL, sub)) => sub,
        _ if resource == "nodes" => {
            return Some(
                "resource \"nodes\" matches only requests without a subresource, and every \
                 kubelet request has one: name it, e.g. \"nodes/proxy\""
                    .to_owned(),
            );
        }
        _ => {
            return Some(format!(
                "resource {resource:?} never matches: the kubelet asks only about \
                 nodes/<subresource>"
            ));
        }
    };
    if subresources.contains(&subresource) {
        return None;
    }
    if subresource == ALL {
        return Some(format!(
            "{resource:?} is not a wildcard in RBAC (only \"*\" and \"*/<subresource>\" are)"
        ));
    }
    Some(format!(
        "subresource {subresource:?} is never asked: the kubelet asks only about {}",
        subresources.join(", ")
    ))
}

/// The JSON document (pretty-printed).
pub fn render_json(explanation: &Explanation) -> String {
    // Only strings, numbers, booleans, maps with string keys and lists: serializing cannot fail.
    serde_json::to_string_pretty(explanation).unwrap_or_default()
}

/// The explanation for people, one fact per line.
pub fn render_text(e: &Explanation) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = write_text(e, &mut out);
    out
}

fn write_text(e: &Explanation, out: &mut String) -> fmt::Result {
    let user = &e.request.user;
    writeln!(
        out,
        "request:     {} {}",
        e.request.method,
        printable(&e.request.path)
    )?;
    writeln!(out, "user:        {}", printable(&user.username))?;
    if !user.uid.is_empty() {
        writeln!(out, "uid:         {}", printable(&user.uid))?;
    }
    if !user.groups.is_empty() {
        writeln!(out, "groups:      {}", printable(&user.groups.join(", ")))?;
    }
    for (key, values) in &user.extra {
        writeln!(
            out,
            "extra:       {}={}",
            printable(key),
            printable(&values.join(","))
        )?;
    }
    writeln!(out, "node:        {}", printable(&e.node_name))?;
    writeln!(out, "authorizers: {}", e.authorizers.join(", "))?;
    match &e.path {
        PathVerdict::Canonical { decoded } => {
            writeln!(out, "path:        canonical ({})", printable(decoded))?;
        }
        PathVerdict::Redirect { location } => writeln!(
            out,
            "path:        not canonical: redirected to {} before authentication",
            printable(location)
        )?,
        PathVerdict::Rejected { reason } => {
            writeln!(out, "path:        refused before authentication: {reason}")?;
        }
    }
    if let Some(verb) = e.verb {
        if verb.is_empty() {
            writeln!(
                out,
                "verb:        \"\" ({} maps to no verb; only a \"*\" verb rule matches)",
                e.request.method
            )?;
        } else {
            writeln!(out, "verb:        {verb}")?;
        }
        let tried: Vec<String> = e
            .subresources
            .iter()
            .map(|s| format!("nodes/{s}"))
            .collect();
        writeln!(out, "attributes:  {} (in order)", tried.join(", "))?;
    }
    for (index, trial) in e.attributes.iter().enumerate() {
        let then = if index + 1 < e.subresources.len() {
            "the next attribute set is tried"
        } else {
            "no attribute set left"
        };
        let decided = match (trial.decision, trial.decided_by) {
            (Answer::Allow, Some(by)) => format!("allowed by {by}"),
            (Answer::Deny, Some(by)) => format!("denied by {by}; {then}"),
            (Answer::Error, _) => "error: no further attribute set is tried".to_owned(),
            _ => format!("no authorizer allowed; {then}"),
        };
        writeln!(
            out,
            "  {} nodes/{}: {decided}",
            e.verb.unwrap_or_default(),
            trial.subresource
        )?;
        for answer in &trial.answers {
            let reason = if answer.reason.is_empty() && answer.answer != Answer::NotAsked {
                "(no reason given)".to_owned()
            } else {
                printable(&answer.reason)
            };
            writeln!(
                out,
                "    {:<12} {:<10} {reason}",
                answer.authorizer,
                answer.answer.to_string()
            )
            .map(|_| ())?;
        }
    }
    let result = &e.result;
    match (result.outcome, result.status) {
        (Outcome::Allowed, _) => writeln!(
            out,
            "result:      allowed: forwarded to the kubelet, which answers"
        )?,
        (outcome, Some(status)) => {
            let what = match outcome {
                Outcome::Redirected => "redirected",
                Outcome::BadRequest => "refused (bad path)",
                Outcome::Forbidden => "forbidden",
                Outcome::AuthorizationError => "authorization error",
                other => other.as_str(),
            };
            writeln!(out, "result:      {status} {what}")?;
            for (name, value) in &result.headers {
                writeln!(out, "  {name}: {}", printable(value))?;
            }
            writeln!(
                out,
                "  body: {:?}",
                result.body.as_deref().unwrap_or_default()
            )?;
        }
        (_, None) => {}
    }
    Ok(())
}

/// `s` with control characters escaped, so a name or an API server's reason cannot rewrite the
/// terminal or fake lines of the output.
fn printable(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_owned();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authz::node::NodeAuthorizer;
    use crate::authz::policy::PolicyAuthorizer;
    use crate::reload::Reloadable;
    use std::sync::Arc;

    const NODE: &str = "node-a";

    /// Two bindings for the same group: the first grants stats, the second metrics.
    const POLICY: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: stats-reader}
rules: [{apiGroups: [""], resources: [nodes/stats], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: metrics-reader}
rules: [{apiGroups: [""], resources: [nodes/metrics], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: proxy-reader}
rules: [{apiGroups: [""], resources: [nodes/proxy], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: monitoring-stats}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: stats-reader}
subjects: [{kind: Group, name: monitoring}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: monitoring-metrics}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: metrics-reader}
subjects: [{kind: Group, name: monitoring}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: debugger-proxy}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: proxy-reader}
subjects: [{kind: User, name: debugger}]
"#;

    fn policy(text: &'static str) -> Authorizer {
        let policy = Reloadable::load("policy", Vec::new(), |_| {
            PolicyAuthorizer::from_sources(&[("p.yaml".into(), text.into())])
                .map_err(|e| e.to_string())
        })
        .unwrap();
        Authorizer::Policy(Arc::new(policy))
    }

    fn chain() -> AuthorizerChain {
        AuthorizerChain::new(vec![Authorizer::Node(NodeAuthorizer), policy(POLICY)])
    }

    fn user(name: &str, groups: &[&str]) -> User {
        User {
            name: name.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            ..User::default()
        }
    }

    fn run(chain: AuthorizerChain, user: &User, method: Method, target: &str) -> Explanation {
        let decider = Decider {
            authorizers: chain,
            mapping: AttributeMapping::default(),
            node_name: Arc::from(NODE),
        };
        block_on(explain(&decider, &method, target, user))
    }

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(future)
    }

    #[test]
    fn allowed_by_the_second_binding_names_it_and_its_role() {
        let e = run(
            chain(),
            &user("prom", &["monitoring"]),
            Method::GET,
            "/metrics",
        );
        assert_eq!(e.exit_status(), EXIT_ALLOWED);
        assert_eq!(e.result.outcome, Outcome::Allowed);
        assert_eq!(e.result.status, None);
        assert_eq!(e.attributes.len(), 1);
        let trial = &e.attributes[0];
        assert_eq!(trial.subresource, "metrics");
        assert_eq!(trial.decision, Answer::Allow);
        assert_eq!(trial.decided_by, Some("Policy"));
        assert_eq!(trial.answers[0].answer, Answer::NoOpinion);
        assert_eq!(trial.answers[0].reason, "not a node identity");
        assert_eq!(
            trial.answers[1].reason,
            "RBAC: allowed by ClusterRoleBinding \"monitoring-metrics\" of ClusterRole \
             \"metrics-reader\" to Group \"monitoring\""
        );
    }

    #[test]
    fn denied_with_no_match_gives_the_kubelets_403() {
        let e = run(
            chain(),
            &user("prom", &["monitoring"]),
            Method::GET,
            "/pods",
        );
        assert_eq!(e.exit_status(), EXIT_NOT_ALLOWED);
        assert_eq!(e.subresources, ["pods", "proxy"]);
        let tried: Vec<_> = e.attributes.iter().map(|t| t.subresource).collect();
        assert_eq!(tried, ["pods", "proxy"]);
        assert!(e.attributes.iter().all(|t| t.decision == Answer::NoOpinion));
        assert_eq!(e.result.status, Some(403));
        assert_eq!(
            e.result.body.as_deref(),
            Some("Forbidden (user=prom, verb=get, resource=nodes, subresource(s)=[pods proxy])\n")
        );
        assert_eq!(
            e.result.headers.get("content-type").map(String::as_str),
            Some("text/plain; charset=utf-8")
        );
    }

    #[test]
    fn falls_back_to_proxy_after_pods() {
        let e = run(chain(), &user("debugger", &[]), Method::GET, "/pods");
        assert_eq!(e.exit_status(), EXIT_ALLOWED);
        assert_eq!(e.attributes[0].decision, Answer::NoOpinion);
        assert_eq!(e.attributes[1].subresource, "proxy");
        assert_eq!(e.attributes[1].decision, Answer::Allow);
        assert!(
            e.attributes[1].answers[1]
                .reason
                .contains("\"debugger-proxy\"")
        );
    }

    #[test]
    fn node_deny_stops_the_chain_and_later_authorizers_are_not_asked() {
        let chain = AuthorizerChain::new(vec![
            Authorizer::Node(NodeAuthorizer),
            Authorizer::AlwaysAllow,
        ]);
        let other = user("system:node:node-b", &["system:nodes"]);
        let e = run(chain, &other, Method::GET, "/healthz");
        assert_eq!(e.exit_status(), EXIT_NOT_ALLOWED);
        for trial in &e.attributes {
            assert_eq!(trial.decision, Answer::Deny);
            assert_eq!(trial.decided_by, Some("Node"));
            assert_eq!(
                trial.answers[0].reason,
                "node identities may only access their own node's kubelet"
            );
            assert_eq!(trial.answers[1].answer, Answer::NotAsked);
        }
        assert_eq!(e.result.status, Some(403));
    }

    #[test]
    fn unclean_path_stops_at_the_redirect_with_the_query_kept() {
        let e = run(
            chain(),
            &user("prom", &["monitoring"]),
            Method::GET,
            "//metrics/?x=1",
        );
        assert_eq!(e.exit_status(), EXIT_NOT_ALLOWED);
        assert_eq!(
            e.path,
            PathVerdict::Redirect {
                location: "/metrics/?x=1".into()
            }
        );
        assert!(e.attributes.is_empty());
        assert_eq!(e.verb, None);
        assert_eq!(e.result.status, Some(301));
        assert_eq!(
            e.result.headers.get("location").map(String::as_str),
            Some("/metrics/?x=1")
        );
        assert_eq!(
            e.result.body.as_deref(),
            Some("<a href=\"/metrics/?x=1\">Moved Permanently</a>.\n\n")
        );

        let e = run(
            chain(),
            &user("prom", &[]),
            Method::GET,
            "/stats%2F..%2Fexec",
        );
        assert_eq!(e.result.outcome, Outcome::BadRequest);
        assert_eq!(e.result.status, Some(400));
        assert_eq!(
            e.result.body.as_deref(),
            Some("Bad Request: percent-encoded '/' in path\n")
        );
    }

    #[test]
    fn json_document_has_the_documented_shape() {
        let e = run(
            chain(),
            &user("prom", &["monitoring"]),
            Method::GET,
            "/pods",
        );
        let json: serde_json::Value = serde_json::from_str(&render_json(&e)).unwrap();
        assert_eq!(json["apiVersion"], API_VERSION);
        assert_eq!(json["kind"], "Explanation");
        assert_eq!(json["request"]["method"], "GET");
        assert_eq!(json["request"]["user"]["username"], "prom");
        assert_eq!(json["request"]["user"]["groups"][0], "monitoring");
        assert_eq!(json["nodeName"], NODE);
        assert_eq!(json["authorizers"], serde_json::json!(["Node", "Policy"]));
        assert_eq!(json["path"]["verdict"], "canonical");
        assert_eq!(json["path"]["decoded"], "/pods");
        assert_eq!(json["verb"], "get");
        assert_eq!(json["attributes"][1]["subresource"], "proxy");
        assert_eq!(json["attributes"][1]["decision"], "NoOpinion");
        assert_eq!(json["attributes"][1]["decidedBy"], serde_json::Value::Null);
        assert_eq!(json["attributes"][0]["answers"][1]["authorizer"], "Policy");
        assert_eq!(json["result"]["outcome"], "forbidden");
        assert_eq!(json["result"]["allowed"], false);
        assert_eq!(json["result"]["status"], 403);
        assert_eq!(json["warnings"], serde_json::json!([]));
    }

    #[test]
    fn text_shows_each_answer_and_the_exact_body() {
        let e = run(
            chain(),
            &user("prom", &["monitoring"]),
            Method::GET,
            "/stats/summary",
        );
        let text = render_text(&e);
        assert!(
            text.contains("path:        canonical (/stats/summary)"),
            "{text}"
        );
        assert!(
            text.contains("  get nodes/stats: allowed by Policy"),
            "{text}"
        );
        assert!(text.contains("monitoring-stats"), "{text}");
        assert!(text.contains("result:      allowed"), "{text}");

        let e = run(chain(), &user("x\u{1b}[2J", &[]), Method::HEAD, "/healthz");
        let text = render_text(&e);
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(
            text.contains("verb:        \"\" (HEAD maps to no verb"),
            "{text}"
        );
        assert!(text.contains("result:      403 forbidden"), "{text}");
        assert!(
            text.contains(r#"body: "Forbidden (user=x\u{1b}[2J, verb=, resource=nodes, subresource(s)=[healthz proxy])\n""#),
            "{text}"
        );
    }

    fn warnings_for(rules: &str, node: &str) -> Vec<PolicyWarning> {
        warnings_under(&AttributeMapping::default(), rules, node)
    }

    fn warnings_under(mapping: &AttributeMapping, rules: &str, node: &str) -> Vec<PolicyWarning> {
        let text = format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: r}}\nrules:\n{rules}"
        );
        let p = PolicyAuthorizer::from_sources(&[("w.yaml".into(), text)]).unwrap();
        p.roles()
            .flat_map(|role| role_warnings(&role, mapping, node))
            .collect()
    }

    /// Without fine-grained checks the kubelet never asks about nodes/pods: a rule for it is
    /// dead there, and live with them.
    #[test]
    fn the_subresources_asked_follow_the_configured_mapping() {
        let rule = "- {apiGroups: [\"\"], resources: [nodes/pods], verbs: [get]}\n";
        assert!(warnings_for(rule, "n").is_empty());
        let coarse = AttributeMapping {
            fine_grained: false,
            ..AttributeMapping::default()
        };
        let w = warnings_under(&coarse, rule, "n");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].rule_never_matches);
        assert!(
            w[0].message.contains("\"pods\" is never asked"),
            "{}",
            w[0].message
        );
    }

    #[test]
    fn rules_that_cannot_match_are_named_with_file_role_and_index() {
        let w = warnings_for(
            "- {apiGroups: [\"\"], resources: [nodes/proxy], verbs: [get]}\n\
             - {apiGroups: [\"\"], resources: [nodes/stats], verbs: [list, watch]}\n\
             - {apiGroups: [apps], resources: [nodes/stats], verbs: [get]}\n\
             - {apiGroups: [\"\"], resources: [nodes/spec, nodes/metrics], verbs: [get, list]}\n\
             - {apiGroups: [\"\"], resources: [nodes], verbs: [get]}\n\
             - {apiGroups: [\"\"], resources: [nodes/stats], resourceNames: [node-b], verbs: [get]}\n\
             - {nonResourceURLs: [/metrics], verbs: [get]}\n\
             - {apiGroups: [\"*\"], resources: [\"*/stats\", \"nodes/*\", pods], resourceNames: [node-a], verbs: [\"*\"]}\n",
            "node-a",
        );
        let got: Vec<_> = w
            .iter()
            .map(|w| (w.rule, w.field, w.rule_never_matches))
            .collect();
        assert_eq!(
            got,
            [
                (1, "verbs", true),
                (1, "verbs", true),
                (2, "apiGroups", true),
                (3, "verbs", false),
                (3, "resources", false),
                (4, "resources", true),
                (5, "resourceNames", true),
                (6, "nonResourceURLs", true),
                (7, "resources", false),
                (7, "resources", false),
            ]
        );
        assert_eq!(
            w[0].to_string(),
            "w.yaml:1: ClusterRole \"r\" rules[1]: verb \"list\" is never asked: the kubelet \
             asks only get, create, update, patch, delete (and \"\" for other methods); this \
             rule can never match a kubelet request"
        );
        assert!(w[4].message.contains("\"spec\""), "{}", w[4].message);
        assert!(w[8].message.contains("not a wildcard"), "{}", w[8].message);
        assert!(w[9].message.contains("\"pods\""), "{}", w[9].message);
        // The same policy on node-b: the resourceNames rule matches there.
        assert!(
            warnings_for(
                "- {apiGroups: [\"\"], resources: [nodes/stats], resourceNames: [node-b], verbs: [get]}\n",
                "node-b"
            )
            .is_empty()
        );
    }

    #[test]
    fn identity_flags_build_the_user() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: ExplainArgs,
        }
        let cli = Cli::try_parse_from([
            "x",
            "--user=alice",
            "--group=g1",
            "--group=g2",
            "--uid=42",
            "--extra=scopes=a",
            "--extra=scopes=b=c",
            "GET",
            "/pods",
        ])
        .unwrap();
        let u = cli.args.user();
        assert_eq!(u.name, "alice");
        assert_eq!(u.uid, "42");
        assert_eq!(u.groups, ["g1", "g2"]);
        assert_eq!(u.extra["scopes"], ["a", "b=c"]);

        let anon = Cli::try_parse_from(["x", "--anonymous", "GET", "/pods"]).unwrap();
        assert_eq!(anon.args.user().name, "system:anonymous");
        assert_eq!(anon.args.user().groups, ["system:unauthenticated"]);

        for bad in [
            vec!["x", "--user=a", "--extra=novalue", "GET", "/"],
            vec!["x", "--user=a", "--extra==v", "GET", "/"],
            vec!["x", "--user=a", "get", "/"],
            vec!["x", "GET", "/"],
            vec!["x", "--anonymous", "--user=a", "GET", "/"],
        ] {
            assert!(Cli::try_parse_from(&bad).is_err(), "{bad:?}");
        }
    }
}

//! A Webhook authorizer's `matchConditions`: CEL expressions over the SubjectAccessReview spec
//! that decide whether the webhook is asked at all, compiled when the configuration is loaded and
//! evaluated as kube-apiserver evaluates them.
//!
//! As in Kubernetes v1.34 (`staging/src/k8s.io/apiserver/pkg/authorization/cel/compile.go` and
//! `matcher.go`, `staging/src/k8s.io/apiserver/plugin/pkg/authorizer/webhook/webhook.go`
//! `Authorize`, and `staging/src/k8s.io/apiserver/pkg/apis/apiserver/validation/validation.go`
//! `compileMatchConditions`):
//!
//! - the only variable is `request`, the v1 `SubjectAccessReviewSpec` as kube-apiserver hands it
//!   to CEL (`convertObjectToUnstructured`): `user`, `uid`, `groups` and `extra` always present
//!   (empty when the caller has none), `resourceAttributes` with all seven string fields (empty
//!   ones included), `nonResourceAttributes` only when the review is about a path; reading an
//!   absent field is an evaluation error, `has()` tells whether it is there;
//! - the conditions are evaluated in order; the first `false` skips the webhook (no opinion, no
//!   error) and the rest are not evaluated, so a `false` wins over an error in another condition;
//!   otherwise any error, or a result that is not a `bool`, is an error the webhook's
//!   `failurePolicy` answers; only when every condition is `true` is the webhook (or its cache)
//!   asked;
//! - at most [`MAX_CONDITIONS`] conditions, each non-empty, none repeated, at most
//!   [`MAX_EXPRESSION_CODE_POINTS`] code points, each compiled at load: a compile error is a
//!   configuration error naming the expression;
//! - an evaluation that would cost more than [`PER_CALL_LIMIT`] (`celconfig.PerCallLimit`) is
//!   an error, as kube-apiserver's cost limit makes it.
//!
//! cel-rust counts no cost, so [`cost`] prices the expression before it runs, from the sizes of
//! the review at hand. Beyond kube-apiserver, which estimates no cost for these expressions,
//! an expression whose worst case passes [`STATIC_ESTIMATED_COST_LIMIT`] (the limit it applies
//! to a CRD's rules) is refused at load, naming its cost.
//!
//! CEL is the `cel` crate (cel-rust) with its standard library and its strings extension, the
//! part of kube-apiserver's CEL environment that applies to a SubjectAccessReview. cel-rust has no
//! type checker; `check` stands in for the part of kube-apiserver's that catches the usual
//! mistakes at load: a name other than `request`, a field `request` does not declare, a result
//! that cannot be a `bool`, a malformed regular expression literal, and the functions of
//! Kubernetes' own CEL libraries, which cel-rust does not provide.

mod check;
mod cost;

use std::cell::LazyCell;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, LazyLock};

use cel::common::ast::{EntryExpr, Expr, IdedExpr, MapExpr, StructExpr};
use cel::common::types::{CelList, CelMap, CelMapKey, CelString};
use cel::common::value::Val;
use cel::{Context, Env, ExecutionError, ParseErrors, Program, Value};
use k8s_openapi::api::authorization::v1::SubjectAccessReviewSpec;

use check::{Shape, check};
use cost::{Inputs, cost};
pub use cost::{PER_CALL_LIMIT, STATIC_ESTIMATED_COST_LIMIT};

/// kube-apiserver's bound on a webhook's conditions.
pub const MAX_CONDITIONS: usize = 64;
/// cel-go's parser limit on an expression's length, in code points, which kube-apiserver keeps.
pub const MAX_EXPRESSION_CODE_POINTS: usize = 100_000;

/// How deep an expression may nest (its syntax tree's height): cel-go's parser recursion limit,
/// which kube-apiserver keeps. Deeper expressions are refused before anything walks them: the
/// load check, the cost estimate and the evaluation all recurse, and 250 levels of each fit a
/// 2 MiB thread stack many times over.
pub const MAX_NESTING_DEPTH: usize = 250;

/// The name of the one variable.
const REQUEST: &str = "request";

/// The CEL environment every condition is compiled and evaluated in: the standard library and
/// the strings extension (kube-apiserver's `ext.Strings`).
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    // The strings extension declares functions the standard library does not: adding it to a
    // fresh standard environment cannot conflict.
    env.add_extension(cel::extensions::strings)
        .expect("the strings extension adds to the standard library without conflict");
    Arc::new(env)
});

/// A webhook's compiled conditions; none (the default) means the webhook is always asked.
/// Cheap to clone: the programs are shared.
#[derive(Clone, Default)]
pub struct MatchConditions {
    conditions: Arc<[Condition]>,
}

struct Condition {
    expression: Arc<str>,
    program: Program,
    /// The cost of the largest review: when it is within [`PER_CALL_LIMIT`], no review can
    /// pass the limit and the cost of each is not computed.
    estimate: u64,
}

impl fmt::Debug for MatchConditions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.expressions()).finish()
    }
}

/// Two sets are equal when they have the same expressions in the same order: equal programs.
impl PartialEq for MatchConditions {
    fn eq(&self, other: &Self) -> bool {
        self.expressions().eq(other.expressions())
    }
}

impl Eq for MatchConditions {}

/// Why a webhook's `matchConditions` are refused at load.
#[derive(Debug, thiserror::Error)]
pub enum ConditionsError {
    /// More than [`MAX_CONDITIONS`].
    #[error("webhook.matchConditions: must have at most {MAX_CONDITIONS} items, has {0}")]
    TooMany(usize),
    /// An empty (or blank) expression.
    #[error("webhook.matchConditions[{index}].expression is required")]
    Empty {
        /// Its position.
        index: usize,
    },
    /// The same expression twice.
    #[error(
        "webhook.matchConditions[{index}].expression {} duplicates an earlier one",
        quoted(expression)
    )]
    Duplicate {
        /// Its position.
        index: usize,
        /// The expression.
        expression: String,
    },
    /// An expression that does not compile.
    #[error(
        "webhook.matchConditions[{index}].expression {}: {source}",
        quoted(expression)
    )]
    Invalid {
        /// Its position.
        index: usize,
        /// The expression.
        expression: String,
        /// Why.
        #[source]
        source: CompileError,
    },
}

/// An expression as an error quotes it: whole up to 200 code points; longer, its start and its
/// length, so that an error about a huge expression stays a readable line.
fn quoted(expression: &str) -> String {
    match expression.char_indices().nth(200) {
        None => format!("{expression:?}"),
        Some((end, _)) => format!(
            "{:?}… ({} code points)",
            &expression[..end],
            expression.chars().count()
        ),
    }
}

/// Why one expression does not compile. Every message is one line: it ends up in a configuration
/// error.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// Longer than [`MAX_EXPRESSION_CODE_POINTS`].
    #[error(
        "expression code point size exceeds limit: size: {0}, limit {MAX_EXPRESSION_CODE_POINTS}"
    )]
    TooLong(usize),
    /// Not CEL.
    #[error("compilation failed: {}", syntax_errors(.0))]
    Syntax(#[source] ParseErrors),
    /// Nested deeper than [`MAX_NESTING_DEPTH`].
    #[error(
        "compilation failed: expression nesting depth exceeds the limit of {MAX_NESTING_DEPTH} \
         (cel-go's parser recursion limit, which kube-apiserver keeps); a long chain of || or == \
         is one level each: test membership with `in [...]` instead"
    )]
    TooDeep,
    /// No thread could be started to compile on.
    #[error(
        "compilation failed: cannot start a thread with a {stack}-byte stack to compile on: {source}"
    )]
    Thread {
        /// The stack asked for.
        stack: usize,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The compiler panicked (a bug in it): the expression is refused.
    #[error("compilation failed: the CEL compiler failed on this expression")]
    Panicked,
    /// A name that is neither `request` nor a comprehension's variable nor a type.
    #[error("compilation failed: undeclared reference to '{0}' (the only variable is request)")]
    UndeclaredReference(String),
    /// A field `request` (or one of its parts) does not declare.
    #[error("compilation failed: undefined field '{field}' of {of}")]
    UndefinedField {
        /// The field.
        field: String,
        /// The type it was selected on.
        of: &'static str,
    },
    /// A field selected on a string, a list, a number…
    #[error("compilation failed: type '{0}' does not support field selection")]
    NoFields(&'static str),
    /// An expression whose result is known not to be a `bool`.
    #[error("must evaluate to bool but got {0}")]
    NotBool(&'static str),
    /// A literal pattern of `matches()` that is not a regular expression.
    #[error("compilation failed: invalid regular expression {pattern:?}: {}", last_line(.source))]
    Regex {
        /// The pattern.
        pattern: String,
        /// Why.
        #[source]
        source: regex::Error,
    },
    /// An expression whose worst case costs more than [`STATIC_ESTIMATED_COST_LIMIT`].
    #[error(
        "estimated cost {cost} exceeds the limit {STATIC_ESTIMATED_COST_LIMIT} for the largest \
         review (a user of {max_review_bytes} bytes from a TokenReview); iterate over \
         request.groups or request.extra once, not once per element, and match regular \
         expressions against literal patterns"
    )]
    Cost {
        /// The estimated cost.
        cost: u64,
        /// The size of the largest user, in bytes.
        max_review_bytes: usize,
    },
    /// A function kube-apiserver has and this proxy's CEL does not.
    #[error(
        "compilation failed: {0} is not supported by this proxy's CEL (see docs/COMPATIBILITY.md)"
    )]
    Unsupported(String),
}

/// One condition that could not be decided.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EvaluationError {
    /// The evaluation failed (a missing field, an overload that does not exist…).
    #[error("cel evaluation error: expression '{expression}' resulted in error: {source}")]
    Failed {
        /// The expression.
        expression: Arc<str>,
        /// Why.
        #[source]
        source: ExecutionError,
    },
    /// Evaluating it on this review would cost more than [`PER_CALL_LIMIT`]: it is not run.
    #[error(
        "cel evaluation error: expression '{expression}' resulted in error: {}",
        cost_exceeded(*.cost)
    )]
    CostLimit {
        /// The expression.
        expression: Arc<str>,
        /// Its cost on this review.
        cost: u64,
    },
    /// The result is not a `bool`.
    #[error(
        "cel evaluation error: expression '{expression}' eval result type should be bool but got {got}"
    )]
    NotBool {
        /// The expression.
        expression: Arc<str>,
        /// The result's type.
        got: String,
    },
}

impl EvaluationError {
    /// Why, without the expression: what `explain` shows beside it.
    pub fn cause(&self) -> String {
        match self {
            EvaluationError::Failed { source, .. } => source.to_string(),
            EvaluationError::CostLimit { cost, .. } => cost_exceeded(*cost),
            EvaluationError::NotBool { got, .. } => {
                format!("eval result type should be bool but got {got}")
            }
        }
    }
}

/// No condition was false and at least one could not be decided: every such error, in order,
/// shown as kube-apiserver aggregates them (one alone, several as `[a, b]`).
#[derive(Debug, Clone, thiserror::Error)]
pub struct MatchError {
    /// The conditions that could not be decided.
    pub errors: Vec<EvaluationError>,
}

impl fmt::Display for MatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let [only] = self.errors.as_slice() {
            return write!(f, "{only}");
        }
        f.write_str("[")?;
        for (i, error) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{error}")?;
        }
        f.write_str("]")
    }
}

/// What the conditions say about one review.
#[derive(Debug)]
pub enum Match {
    /// Every condition is true (or there is none): the webhook is asked.
    Matched,
    /// A condition is false: the webhook is skipped, with no opinion.
    Skipped,
    /// No condition is false and some could not be decided: the failure policy answers.
    Failed(MatchError),
}

/// One condition's result, as `explain` shows it.
#[derive(Debug)]
pub enum ConditionResult {
    /// True.
    True,
    /// False: the webhook is skipped.
    False,
    /// Could not be decided.
    Error(EvaluationError),
    /// Not evaluated: an earlier condition was false.
    NotEvaluated,
}

/// One condition and its result, handed to an observer as the conditions are evaluated.
#[derive(Debug, Clone, Copy)]
pub struct ConditionTrace<'a> {
    /// Its position in `matchConditions`.
    pub index: usize,
    /// The expression.
    pub expression: &'a str,
    /// Its result.
    pub result: &'a ConditionResult,
}

impl MatchConditions {
    /// Validates and compiles `expressions` as kube-apiserver does at load; the first problem is
    /// the error.
    pub fn compile<'a>(
        expressions: impl ExactSizeIterator<Item = &'a str>,
    ) -> Result<MatchConditions, ConditionsError> {
        if expressions.len() > MAX_CONDITIONS {
            return Err(ConditionsError::TooMany(expressions.len()));
        }
        let mut seen = HashSet::new();
        let mut conditions = Vec::with_capacity(expressions.len());
        for (index, expression) in expressions.enumerate() {
            if expression.trim().is_empty() {
                return Err(ConditionsError::Empty { index });
            }
            if !seen.insert(expression) {
                return Err(ConditionsError::Duplicate {
                    index,
                    expression: expression.to_owned(),
                });
            }
            let (program, estimate) =
                compile(expression).map_err(|source| ConditionsError::Invalid {
                    index,
                    expression: expression.to_owned(),
                    source,
                })?;
            conditions.push(Condition {
                expression: Arc::from(expression),
                program,
                estimate,
            });
        }
        Ok(MatchConditions {
            conditions: conditions.into(),
        })
    }

    /// Whether there are none: the webhook is always asked.
    pub fn is_empty(&self) -> bool {
        self.conditions.is_empty()
    }

    /// The expressions, in order.
    pub fn expressions(&self) -> impl Iterator<Item = &str> {
        self.conditions.iter().map(|c| &*c.expression)
    }

    /// Evaluates the conditions on `spec`, the review the webhook would receive, showing
    /// `observe` each condition's result in order (those after a false one as not evaluated).
    pub fn evaluate(
        &self,
        spec: &SubjectAccessReviewSpec,
        mut observe: impl FnMut(ConditionTrace<'_>),
    ) -> Match {
        // The CEL value of the review, built only if a condition is run; its sizes, measured
        // only if a condition could pass the limit.
        let context = LazyCell::new(|| {
            let mut context = Context::with_env(Arc::clone(&ENV));
            context.add_variable_as_val(REQUEST, Box::new(request_value(spec)));
            context
        });
        let inputs = LazyCell::new(|| Inputs::of(spec));
        let mut errors = Vec::new();
        let mut skipped = false;
        for (index, condition) in self.conditions.iter().enumerate() {
            let result = if skipped {
                ConditionResult::NotEvaluated
            } else {
                condition.evaluate(&context, &inputs)
            };
            observe(ConditionTrace {
                index,
                expression: &condition.expression,
                result: &result,
            });
            match result {
                ConditionResult::False => skipped = true,
                ConditionResult::Error(error) => errors.push(error),
                ConditionResult::True | ConditionResult::NotEvaluated => {}
            }
        }
        match (skipped, errors.is_empty()) {
            (true, _) => Match::Skipped,
            (false, true) => Match::Matched,
            (false, false) => Match::Failed(MatchError { errors }),
        }
    }
}

impl Condition {
    /// The result on the review in `context`, whose sizes `inputs` gives; not run when its cost
    /// on this review would pass [`PER_CALL_LIMIT`].
    fn evaluate<'c>(
        &self,
        context: &LazyCell<Context<'c, 'c>, impl FnOnce() -> Context<'c, 'c>>,
        inputs: &Inputs,
    ) -> ConditionResult {
        if self.estimate > PER_CALL_LIMIT {
            let cost = cost(self.program.expression(), inputs);
            if cost > PER_CALL_LIMIT {
                return ConditionResult::Error(EvaluationError::CostLimit {
                    expression: Arc::clone(&self.expression),
                    cost,
                });
            }
        }
        match self.program.execute(LazyCell::force(context)) {
            Ok(Value::Bool(true)) => ConditionResult::True,
            Ok(Value::Bool(false)) => ConditionResult::False,
            Ok(other) => ConditionResult::Error(EvaluationError::NotBool {
                expression: Arc::clone(&self.expression),
                got: other.type_of().to_string(),
            }),
            Err(source) => ConditionResult::Error(EvaluationError::Failed {
                expression: Arc::clone(&self.expression),
                source,
            }),
        }
    }
}

/// `spec` as the CEL value `request`, borrowing its strings (kube-apiserver v1.34
/// `convertObjectToUnstructured`): every user field present, empty or not; `resourceAttributes`
/// and `nonResourceAttributes` only when set, with all their string fields. The field and label
/// selectors of `resourceAttributes` are left out: the kubelet's reviews never carry them, and
/// kube-apiserver leaves them out when unset.
pub fn request_value(spec: &SubjectAccessReviewSpec) -> CelMap<'_> {
    fn string(value: &Option<String>) -> Box<dyn Val + '_> {
        Box::new(CelString::from(value.as_deref().unwrap_or_default()))
    }
    fn strings(values: &[String]) -> Box<dyn Val + '_> {
        let list: Vec<Box<dyn Val + '_>> = values
            .iter()
            .map(|v| Box::new(CelString::from(v.as_str())) as Box<dyn Val + '_>)
            .collect();
        Box::new(CelList::from(list))
    }
    fn map<'v>(entries: impl IntoIterator<Item = (&'v str, Box<dyn Val + 'v>)>) -> CelMap<'v> {
        let entries: HashMap<CelMapKey<'v>, Box<dyn Val + 'v>> = entries
            .into_iter()
            .map(|(key, value)| (CelMapKey::from(key), value))
            .collect();
        CelMap::from(entries)
    }
    let extra = spec.extra.iter().flatten().map(|(key, values)| {
        let values: &[String] = values;
        (key.as_str(), strings(values))
    });
    let mut request: Vec<(&str, Box<dyn Val + '_>)> = vec![
        ("user", string(&spec.user)),
        ("uid", string(&spec.uid)),
        (
            "groups",
            strings(spec.groups.as_deref().unwrap_or_default()),
        ),
        ("extra", Box::new(map(extra))),
    ];
    if let Some(attributes) = &spec.resource_attributes {
        let fields = [
            ("namespace", &attributes.namespace),
            ("verb", &attributes.verb),
            ("group", &attributes.group),
            ("version", &attributes.version),
            ("resource", &attributes.resource),
            ("subresource", &attributes.subresource),
            ("name", &attributes.name),
        ];
        let fields = fields
            .into_iter()
            .map(|(name, value)| (name, string(value)));
        request.push(("resourceAttributes", Box::new(map(fields))));
    }
    if let Some(attributes) = &spec.non_resource_attributes {
        let fields = [("path", &attributes.path), ("verb", &attributes.verb)];
        let fields = fields
            .into_iter()
            .map(|(name, value)| (name, string(value)));
        request.push(("nonResourceAttributes", Box::new(map(fields))));
    }
    map(request)
}

/// Stack for compiling an expression: a base, and more per code point of it.
const COMPILE_STACK_BASE: usize = 8 << 20;
/// cel-rust's parser recurses once per link of a chain, and a link can be two characters (`.a`,
/// `+1`); measured in a debug build it takes under 2 KiB of stack a character. Brackets, which
/// take more a level, are bounded before parsing ([`bracket_depth`]).
const COMPILE_STACK_PER_CODE_POINT: usize = 4 << 10;

/// Compiles one expression, checks what can be checked without a type checker and estimates its
/// worst-case cost, which must be within [`STATIC_ESTIMATED_COST_LIMIT`].
///
/// An expression within [`MAX_EXPRESSION_CODE_POINTS`] can nest tens of thousands of levels
/// deep, and cel-rust's parser recurses once per level: the parse runs on a thread of its own
/// whose stack grows with the expression's length (reserved, and touched only as deep as the
/// parser goes), and a syntax tree deeper than [`MAX_NESTING_DEPTH`] is refused, and dropped,
/// there too. What comes back is shallow enough for any thread.
fn compile(expression: &str) -> Result<(Program, u64), CompileError> {
    let size = expression.chars().count();
    if size > MAX_EXPRESSION_CODE_POINTS {
        return Err(CompileError::TooLong(size));
    }
    if bracket_depth(expression) > MAX_NESTING_DEPTH {
        return Err(CompileError::TooDeep);
    }
    let stack = COMPILE_STACK_BASE + size * COMPILE_STACK_PER_CODE_POINT;
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("cel-compile".to_owned())
            .stack_size(stack)
            .spawn_scoped(scope, || compile_here(expression))
            .map_err(|source| CompileError::Thread { stack, source })?
            .join()
            .map_err(|_| CompileError::Panicked)?
    })
}

/// [`compile`], on the thread it runs on.
fn compile_here(expression: &str) -> Result<(Program, u64), CompileError> {
    let program = ENV.compile(expression).map_err(CompileError::Syntax)?;
    if exceeds_depth(program.expression(), MAX_NESTING_DEPTH) {
        return Err(CompileError::TooDeep);
    }
    match check(program.expression(), &mut Vec::new())? {
        Shape::Bool | Shape::Dyn => {}
        other => return Err(CompileError::NotBool(other.name())),
    }
    let estimate = cost(program.expression(), &Inputs::worst_case());
    if estimate > STATIC_ESTIMATED_COST_LIMIT {
        return Err(CompileError::Cost {
            cost: estimate,
            max_review_bytes: crate::apiserver::MAX_RESPONSE_BYTES,
        });
    }
    Ok((program, estimate))
}

/// The deepest nesting of `()`, `[]` and `{}` in `expression`, outside string literals and
/// comments: levels the parser recurses through, known before it runs.
fn bracket_depth(expression: &str) -> usize {
    let text = expression.as_bytes();
    let (mut at, mut depth, mut deepest) = (0, 0usize, 0usize);
    while let Some(&byte) = text.get(at) {
        at += 1;
        match byte {
            b'(' | b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            b'/' if text.get(at) == Some(&b'/') => {
                at = text[at..]
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(text.len(), |end| at + end);
            }
            b'\'' | b'"' => {
                // A raw string (`r'...'`, `R"..."`) takes backslashes as they are.
                let raw = at >= 2 && matches!(text[at - 2], b'r' | b'R');
                let delimiter: &[u8] = if text[at..].starts_with(&[byte, byte]) {
                    at += 2;
                    &text[at - 3..at]
                } else {
                    &text[at - 1..at]
                };
                while at < text.len() && !text[at..].starts_with(delimiter) {
                    at += if text[at] == b'\\' && !raw { 2 } else { 1 };
                }
                at += delimiter.len();
            }
            _ => {}
        }
    }
    deepest
}

/// Whether `expr`'s syntax tree is more than `limit` levels high, found without recursion (an
/// explicit stack of the nodes still to visit, each with its level) and without visiting more
/// than one node beyond the limit on any path.
fn exceeds_depth(expr: &IdedExpr, limit: usize) -> bool {
    let mut pending = vec![(expr, 1)];
    while let Some((expr, level)) = pending.pop() {
        if level > limit {
            return true;
        }
        let mut child = |e| pending.push((e, level + 1));
        match &expr.expr {
            Expr::Unspecified | Expr::Ident(_) | Expr::Literal(_) => {}
            Expr::Select(select) => child(&select.operand),
            Expr::Call(call) => {
                call.target.iter().for_each(|t| child(t));
                call.args.iter().for_each(&mut child);
            }
            Expr::List(list) => list.elements.iter().for_each(child),
            Expr::Map(MapExpr { entries }) | Expr::Struct(StructExpr { entries, .. }) => {
                for entry in entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(entry) => {
                            child(&entry.key);
                            child(&entry.value);
                        }
                        EntryExpr::StructField(field) => child(&field.value),
                    }
                }
            }
            Expr::Comprehension(c) => {
                for part in [
                    &c.iter_range,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                ] {
                    child(part);
                }
            }
        }
    }
    false
}

/// kube-apiserver's message for an evaluation stopped by its cost limit (cel-go's), with the
/// cost and the limit.
fn cost_exceeded(cost: u64) -> String {
    format!("operation cancelled: actual cost limit exceeded (cost {cost}, limit {PER_CALL_LIMIT})")
}

/// The parser's errors on one line, each at its line and column (their own text adds the source
/// with a caret on lines of their own).
fn syntax_errors(errors: &ParseErrors) -> String {
    let errors: Vec<String> = errors
        .errors
        .iter()
        .map(|e| format!("{}:{}: {}", e.pos.0, e.pos.1, e.msg))
        .collect();
    errors.join("; ")
}

/// The last line of `error`'s message: the regex crate draws the pattern and a caret above it.
fn last_line(error: &regex::Error) -> String {
    error
        .to_string()
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests;

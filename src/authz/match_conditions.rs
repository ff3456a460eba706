//! A Webhook authorizer's `matchConditions`: CEL expressions over the SubjectAccessReview spec
//! that decide whether the webhook is asked at all, compiled when the configuration is loaded and
//! evaluated as kube-apiserver evaluates them (Kubernetes v1.34:
//! `staging/src/k8s.io/apiserver/pkg/authorization/cel/compile.go` and `matcher.go`,
//! `staging/src/k8s.io/apiserver/plugin/pkg/authorizer/webhook/webhook.go` `Authorize`, and
//! `staging/src/k8s.io/apiserver/pkg/apis/apiserver/validation/validation.go`
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
//!   configuration error naming the expression.
//!
//! CEL is the `cel` crate (cel-rust) with its standard library and its strings extension, the
//! part of kube-apiserver's CEL environment that applies to a SubjectAccessReview. cel-rust has no
//! type checker; `check` stands in for the part of kube-apiserver's that catches the usual
//! mistakes at load: a name other than `request`, a field `request` does not declare, a result
//! that cannot be a `bool`, a malformed regular expression literal, and the functions of
//! Kubernetes' own CEL libraries, which cel-rust does not provide.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, LazyLock};

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, operators};
use cel::common::types::{CelList, CelMap, CelMapKey, CelString};
use cel::common::value::Val;
use cel::{Context, Env, ExecutionError, ParseErrors, Program, Value};
use k8s_openapi::api::authorization::v1::SubjectAccessReviewSpec;

/// kube-apiserver's bound on a webhook's conditions.
pub const MAX_CONDITIONS: usize = 64;
/// cel-go's parser limit on an expression's length, in code points, which kube-apiserver keeps.
pub const MAX_EXPRESSION_CODE_POINTS: usize = 100_000;

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
    #[error("webhook.matchConditions[{index}].expression {expression:?} duplicates an earlier one")]
    Duplicate {
        /// Its position.
        index: usize,
        /// The expression.
        expression: String,
    },
    /// An expression that does not compile.
    #[error("webhook.matchConditions[{index}].expression {expression:?}: {source}")]
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
            let program = compile(expression).map_err(|source| ConditionsError::Invalid {
                index,
                expression: expression.to_owned(),
                source,
            })?;
            conditions.push(Condition {
                expression: Arc::from(expression),
                program,
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
        let mut context = Context::with_env(Arc::clone(&ENV));
        context.add_variable_as_val(REQUEST, Box::new(request_value(spec)));
        let mut errors = Vec::new();
        let mut skipped = false;
        for (index, condition) in self.conditions.iter().enumerate() {
            let result = if skipped {
                ConditionResult::NotEvaluated
            } else {
                condition.evaluate(&context)
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
    fn evaluate(&self, context: &Context<'_, '_>) -> ConditionResult {
        match self.program.execute(context) {
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

/// Compiles one expression and checks what can be checked without a type checker.
fn compile(expression: &str) -> Result<Program, CompileError> {
    let size = expression.chars().count();
    if size > MAX_EXPRESSION_CODE_POINTS {
        return Err(CompileError::TooLong(size));
    }
    let program = ENV.compile(expression).map_err(CompileError::Syntax)?;
    match check(program.expression(), &mut Vec::new())? {
        Shape::Bool | Shape::Dyn => Ok(program),
        other => Err(CompileError::NotBool(other.name())),
    }
}

/// What the load-time check knows of a value: the declared shape of `request` and its parts, a
/// literal's type, or nothing (`Dyn`: anything goes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Request,
    ResourceAttributes,
    NonResourceAttributes,
    FieldSelector,
    LabelSelector,
    String,
    StringList,
    Extra,
    Bool,
    Int,
    Uint,
    Double,
    Bytes,
    Null,
    List,
    Map,
    Dyn,
}

impl Shape {
    /// The CEL type name, as kube-apiserver's messages spell it.
    fn name(self) -> &'static str {
        match self {
            Shape::Request => "kubernetes.SubjectAccessReviewSpec",
            Shape::ResourceAttributes => "kubernetes.ResourceAttributes",
            Shape::NonResourceAttributes => "kubernetes.NonResourceAttributes",
            Shape::FieldSelector => "kubernetes.FieldSelectorAttributes",
            Shape::LabelSelector => "kubernetes.LabelSelectorAttributes",
            Shape::String => "string",
            Shape::StringList => "list(string)",
            Shape::Extra => "map(string, list(string))",
            Shape::Bool => "bool",
            Shape::Int => "int",
            Shape::Uint => "uint",
            Shape::Double => "double",
            Shape::Bytes => "bytes",
            Shape::Null => "null_type",
            Shape::List => "list(dyn)",
            Shape::Map => "map(dyn, dyn)",
            Shape::Dyn => "dyn",
        }
    }

    /// The shape of `self.field`, as kube-apiserver's `SubjectAccessReviewSpec` type declares it.
    fn field(self, field: &str) -> Result<Shape, CompileError> {
        let declared = match (self, field) {
            (Shape::Request, "user" | "uid") => Shape::String,
            (Shape::Request, "groups") => Shape::StringList,
            (Shape::Request, "extra") => Shape::Extra,
            (Shape::Request, "resourceAttributes") => Shape::ResourceAttributes,
            (Shape::Request, "nonResourceAttributes") => Shape::NonResourceAttributes,
            (
                Shape::ResourceAttributes,
                "namespace" | "verb" | "group" | "version" | "resource" | "subresource" | "name",
            )
            | (Shape::NonResourceAttributes, "path" | "verb")
            | (Shape::FieldSelector | Shape::LabelSelector, "rawSelector") => Shape::String,
            (Shape::ResourceAttributes, "fieldSelector") => Shape::FieldSelector,
            (Shape::ResourceAttributes, "labelSelector") => Shape::LabelSelector,
            (Shape::FieldSelector | Shape::LabelSelector, "requirements") => Shape::List,
            (Shape::Extra, _) => Shape::StringList,
            (Shape::Map | Shape::Dyn, _) => Shape::Dyn,
            (
                Shape::Request
                | Shape::ResourceAttributes
                | Shape::NonResourceAttributes
                | Shape::FieldSelector
                | Shape::LabelSelector,
                _,
            ) => {
                return Err(CompileError::UndefinedField {
                    field: field.to_owned(),
                    of: self.name(),
                });
            }
            (other, _) => return Err(CompileError::NoFields(other.name())),
        };
        Ok(declared)
    }

    /// The shape of an element of `self` when iterated by a comprehension.
    fn element(self) -> Shape {
        match self {
            Shape::StringList | Shape::Extra => Shape::String,
            _ => Shape::Dyn,
        }
    }
}

/// Type names an expression may use as values (`type(x) == string`).
const TYPE_NAMES: [&str; 12] = [
    "bool",
    "bytes",
    "double",
    "dyn",
    "google",
    "int",
    "list",
    "map",
    "null_type",
    "optional_type",
    "string",
    "type",
];

/// Namespaces of functions this CEL provides (`optional.of(x)`, `strings.quote(s)`).
const NAMESPACES: [&str; 2] = ["optional", "strings"];

/// Namespaces of kube-apiserver's CEL libraries this one lacks (`sets.contains`,
/// `format.dns1123Label()`).
const KUBERNETES_NAMESPACES: [&str; 2] = ["sets", "format"];

/// Functions of kube-apiserver's CEL environment that cel-rust does not provide (Kubernetes'
/// URL, regex, list, IP, CIDR, quantity, semver and image libraries; `duration` and `timestamp`,
/// left out with the `chrono` feature), by names no cel-rust function has: a call to one would
/// fail on every request.
const UNSUPPORTED_FUNCTIONS: [&str; 52] = [
    "add",
    "asApproximateFloat",
    "asInteger",
    "cidr",
    "compareTo",
    "containsCIDR",
    "containsDigest",
    "containsIP",
    "digest",
    "duration",
    "family",
    "find",
    "findAll",
    "getEscapedPath",
    "getHost",
    "getHostname",
    "getPort",
    "getQuery",
    "getScheme",
    "identifier",
    "image",
    "ip",
    "isCIDR",
    "isCanonical",
    "isGlobalUnicast",
    "isGreaterThan",
    "isIP",
    "isImage",
    "isInteger",
    "isLessThan",
    "isLinkLocalMulticast",
    "isLinkLocalUnicast",
    "isLoopback",
    "isQuantity",
    "isSemver",
    "isSorted",
    "isURL",
    "isUnspecified",
    "major",
    "masked",
    "max",
    "min",
    "minor",
    "patch",
    "prefixLength",
    "quantity",
    "registry",
    "repository",
    "semver",
    "sign",
    "sub",
    "sum",
];

/// Functions left as calls when the parser expands no macro for them: kube-apiserver's
/// two-variable comprehensions (`all(k, v, …)`, `transformMap`, …), which cel-rust lacks.
const UNEXPANDED_COMPREHENSIONS: [&str; 9] = [
    operators::ALL,
    operators::EXISTS,
    operators::EXISTS_ONE,
    "existsOne",
    operators::MAP,
    operators::FILTER,
    "transformList",
    "transformMap",
    "transformMapEntry",
];

/// Checks `expr` in `scope` (the comprehension variables around it, innermost last) and returns
/// its shape. Only what is certainly wrong in kube-apiserver too is an error.
fn check<'e>(expr: &'e IdedExpr, scope: &mut Vec<(&'e str, Shape)>) -> Result<Shape, CompileError> {
    Ok(match &expr.expr {
        Expr::Unspecified | Expr::Struct(_) => Shape::Dyn,
        Expr::Literal(literal) => match literal {
            LiteralValue::Boolean(_) => Shape::Bool,
            LiteralValue::Bytes(_) => Shape::Bytes,
            LiteralValue::Double(_) => Shape::Double,
            LiteralValue::Int(_) => Shape::Int,
            LiteralValue::Null => Shape::Null,
            LiteralValue::String(_) => Shape::String,
            LiteralValue::UInt(_) => Shape::Uint,
        },
        Expr::Ident(name) => ident(name, scope)?,
        Expr::Select(select) => {
            let field = check(&select.operand, scope)?.field(&select.field)?;
            if select.test { Shape::Bool } else { field }
        }
        Expr::List(list) => {
            for element in &list.elements {
                check(element, scope)?;
            }
            Shape::List
        }
        Expr::Map(map) => {
            for entry in &map.entries {
                match &entry.expr {
                    EntryExpr::MapEntry(entry) => {
                        check(&entry.key, scope)?;
                        check(&entry.value, scope)?;
                    }
                    EntryExpr::StructField(field) => {
                        check(&field.value, scope)?;
                    }
                }
            }
            Shape::Map
        }
        Expr::Comprehension(comprehension) => {
            let element = check(&comprehension.iter_range, scope)?.element();
            let accumulator = check(&comprehension.accu_init, scope)?;
            let depth = scope.len();
            scope.push((&comprehension.iter_var, element));
            if let Some(second) = &comprehension.iter_var2 {
                scope.push((second, Shape::Dyn));
            }
            scope.push((&comprehension.accu_var, accumulator));
            let checked = [
                &comprehension.loop_cond,
                &comprehension.loop_step,
                &comprehension.result,
            ]
            .map(|part| check(part, scope));
            scope.truncate(depth);
            let [condition, step, result] = checked;
            condition?;
            step?;
            result?
        }
        Expr::Call(call) => {
            let function = call.func_name.as_str();
            if let Some(namespace) = call.target.as_deref().and_then(|t| namespace(t, scope)) {
                if KUBERNETES_NAMESPACES.contains(&namespace) {
                    return Err(CompileError::Unsupported(format!(
                        "{namespace}.{function}(), of a Kubernetes CEL library,"
                    )));
                }
                if !NAMESPACES.contains(&namespace) {
                    return Err(CompileError::UndeclaredReference(namespace.to_owned()));
                }
                for arg in &call.args {
                    check(arg, scope)?;
                }
                return Ok(Shape::Dyn);
            }
            if UNSUPPORTED_FUNCTIONS.contains(&function) {
                return Err(CompileError::Unsupported(format!(
                    "{function}(), of a Kubernetes CEL library,"
                )));
            }
            if UNEXPANDED_COMPREHENSIONS.contains(&function) {
                return Err(CompileError::Unsupported(format!(
                    "{function}() with {} arguments (two-variable comprehensions)",
                    call.args.len()
                )));
            }
            let target = match &call.target {
                Some(target) => Some(check(target, scope)?),
                None => None,
            };
            let mut args = Vec::with_capacity(call.args.len());
            for arg in &call.args {
                args.push(check(arg, scope)?);
            }
            if function == "matches" {
                check_pattern(call.args.last())?;
            }
            call_shape(function, target, &args)
        }
    })
}

/// The shape of the identifier `name`: a comprehension variable, `request`, or a type name.
fn ident(name: &str, scope: &[(&str, Shape)]) -> Result<Shape, CompileError> {
    if let Some((_, shape)) = scope.iter().rev().find(|(n, _)| *n == name) {
        return Ok(*shape);
    }
    if name == REQUEST {
        return Ok(Shape::Request);
    }
    if TYPE_NAMES.contains(&name) {
        return Ok(Shape::Dyn);
    }
    Err(CompileError::UndeclaredReference(name.to_owned()))
}

/// The namespace a call's target names, when it is a bare identifier that is not a variable.
fn namespace<'e>(target: &'e IdedExpr, scope: &[(&str, Shape)]) -> Option<&'e str> {
    match &target.expr {
        Expr::Ident(name) if name != REQUEST && !scope.iter().any(|(n, _)| n == name) => Some(name),
        _ => None,
    }
}

/// A literal pattern of `matches()` must be a regular expression (kube-apiserver validates regex
/// literals at compile time).
fn check_pattern(pattern: Option<&IdedExpr>) -> Result<(), CompileError> {
    let Some(Expr::Literal(LiteralValue::String(pattern))) = pattern.map(|p| &p.expr) else {
        return Ok(());
    };
    regex::Regex::new(pattern.inner())
        .map(|_| ())
        .map_err(|source| CompileError::Regex {
            pattern: pattern.inner().to_owned(),
            source,
        })
}

/// The shape of a call's result, where the function says it.
fn call_shape(function: &str, target: Option<Shape>, args: &[Shape]) -> Shape {
    match function {
        operators::LOGICAL_AND
        | operators::LOGICAL_OR
        | operators::LOGICAL_NOT
        | operators::EQUALS
        | operators::NOT_EQUALS
        | operators::LESS
        | operators::LESS_EQUALS
        | operators::GREATER
        | operators::GREATER_EQUALS
        | operators::IN
        | operators::NOT_STRICTLY_FALSE
        | "startsWith"
        | "endsWith"
        | "contains"
        | "matches"
        | "hasValue" => Shape::Bool,
        "size" => Shape::Int,
        "lowerAscii" | "upperAscii" | "trim" | "replace" | "substring" | "charAt" | "join"
        | "format" | "reverse" => Shape::String,
        operators::INDEX => match args.first() {
            Some(Shape::StringList) => Shape::String,
            Some(Shape::Extra) => Shape::StringList,
            _ => Shape::Dyn,
        },
        operators::CONDITIONAL => match args {
            [_, then, otherwise] if then == otherwise => *then,
            _ => Shape::Dyn,
        },
        operators::ADD => match (target, args) {
            (None, [Shape::String, Shape::String]) => Shape::String,
            _ => Shape::Dyn,
        },
        _ => Shape::Dyn,
    }
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

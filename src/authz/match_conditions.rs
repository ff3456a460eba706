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
//!   [`MAX_EXPRESSION_CODE_POINTS`](crate::base::cel::MAX_EXPRESSION_CODE_POINTS) code points,
//!   each compiled at load: a compile error is a configuration error naming the expression;
//! - an evaluation that would cost more than [`PER_CALL_LIMIT`] (`celconfig.PerCallLimit`) is
//!   an error, as kube-apiserver's cost limit makes it.
//!
//! The CEL environment, the load check and the cost model are [`crate::base::cel`]'s; this module
//! declares `request` to them (its type here, its sizes in `sizes`) and refuses at load a
//! condition whose result is certainly not a `bool`. cel-rust counts no cost, so the cost model
//! prices the expression before it runs, from the sizes of the review at hand. Beyond
//! kube-apiserver, which estimates no cost for these expressions, an expression whose worst case
//! passes [`STATIC_ESTIMATED_COST_LIMIT`] (the limit it applies to a CRD's rules) is refused at
//! load, naming its cost.

mod sizes;

use std::cell::LazyCell;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use cel::common::types::{CelMap, CelMapKey, CelString};
use cel::common::value::Val;
use cel::{Context, ExecutionError, Program, Value};
use k8s_openapi::api::authorization::v1::SubjectAccessReviewSpec;

use crate::base::cel::{
    self as base_cel, Compiled, ENV, Object, PER_CALL_LIMIT, STATIC_ESTIMATED_COST_LIMIT, Sizes,
    Type, Variable, cost, cost_exceeded, quoted, string_list,
};

/// kube-apiserver's bound on a webhook's conditions.
pub const MAX_CONDITIONS: usize = 64;

/// The name of the one variable.
const REQUEST: &str = "request";

/// `request`, the v1 `SubjectAccessReviewSpec` as kube-apiserver declares it to CEL
/// (`buildRequestType`).
static VARIABLES: [Variable; 1] = [Variable {
    name: REQUEST,
    declared: Type::Object(&SUBJECT_ACCESS_REVIEW_SPEC),
}];

static SUBJECT_ACCESS_REVIEW_SPEC: Object = Object {
    name: "kubernetes.SubjectAccessReviewSpec",
    fields: &[
        ("user", Type::String),
        ("uid", Type::String),
        ("groups", Type::List(&Type::String)),
        (
            "extra",
            Type::Map(&Type::String, &Type::List(&Type::String)),
        ),
        ("resourceAttributes", Type::Object(&RESOURCE_ATTRIBUTES)),
        (
            "nonResourceAttributes",
            Type::Object(&NON_RESOURCE_ATTRIBUTES),
        ),
    ],
};

static RESOURCE_ATTRIBUTES: Object = Object {
    name: "kubernetes.ResourceAttributes",
    fields: &[
        ("namespace", Type::String),
        ("verb", Type::String),
        ("group", Type::String),
        ("version", Type::String),
        ("resource", Type::String),
        ("subresource", Type::String),
        ("name", Type::String),
        ("fieldSelector", Type::Object(&FIELD_SELECTOR)),
        ("labelSelector", Type::Object(&LABEL_SELECTOR)),
    ],
};

static NON_RESOURCE_ATTRIBUTES: Object = Object {
    name: "kubernetes.NonResourceAttributes",
    fields: &[("path", Type::String), ("verb", Type::String)],
};

static FIELD_SELECTOR: Object = Object {
    name: "kubernetes.FieldSelectorAttributes",
    fields: &[
        ("rawSelector", Type::String),
        ("requirements", Type::List(&Type::Dyn)),
    ],
};

static LABEL_SELECTOR: Object = Object {
    name: "kubernetes.LabelSelectorAttributes",
    fields: &[
        ("rawSelector", Type::String),
        ("requirements", Type::List(&Type::Dyn)),
    ],
};

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

/// Why one expression does not compile. Every message is one line: it ends up in a configuration
/// error.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// Not CEL, or not CEL this proxy evaluates, or naming what `request` does not declare.
    #[error(transparent)]
    Cel(#[from] base_cel::CompileError),
    /// An expression whose result is known not to be a `bool`.
    #[error("must evaluate to bool but got {0}")]
    NotBool(Type),
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
        let sizes = LazyCell::new(|| sizes::of(spec));
        let mut errors = Vec::new();
        let mut skipped = false;
        for (index, condition) in self.conditions.iter().enumerate() {
            let result = if skipped {
                ConditionResult::NotEvaluated
            } else {
                condition.evaluate(&context, &sizes)
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
    /// The result on the review in `context`, whose sizes `sizes` gives; not run when its cost
    /// on this review would pass [`PER_CALL_LIMIT`].
    fn evaluate<'c>(
        &self,
        context: &LazyCell<Context<'c, 'c>, impl FnOnce() -> Context<'c, 'c>>,
        sizes: &Sizes,
    ) -> ConditionResult {
        if self.estimate > PER_CALL_LIMIT {
            let cost = cost(self.program.expression(), sizes);
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
    fn map<'v>(entries: impl IntoIterator<Item = (&'v str, Box<dyn Val + 'v>)>) -> CelMap<'v> {
        let entries: HashMap<CelMapKey<'v>, Box<dyn Val + 'v>> = entries
            .into_iter()
            .map(|(key, value)| (CelMapKey::from(key), value))
            .collect();
        CelMap::from(entries)
    }
    let extra = spec.extra.iter().flatten().map(|(key, values)| {
        let values: &[String] = values;
        (key.as_str(), string_list(values))
    });
    let mut request: Vec<(&str, Box<dyn Val + '_>)> = vec![
        ("user", string(&spec.user)),
        ("uid", string(&spec.uid)),
        (
            "groups",
            string_list(spec.groups.as_deref().unwrap_or_default()),
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

/// Compiles one expression over `request`, which must be able to evaluate to a `bool`, and
/// estimates its worst-case cost, which must be within [`STATIC_ESTIMATED_COST_LIMIT`].
fn compile(expression: &str) -> Result<(Program, u64), CompileError> {
    let Compiled { program, output } = base_cel::compile(expression, &VARIABLES)?;
    match output {
        Type::Bool | Type::Dyn => {}
        other => return Err(CompileError::NotBool(other)),
    }
    let estimate = cost(program.expression(), sizes::worst_case());
    if estimate > STATIC_ESTIMATED_COST_LIMIT {
        return Err(CompileError::Cost {
            cost: estimate,
            max_review_bytes: crate::apiserver::MAX_RESPONSE_BYTES,
        });
    }
    Ok((program, estimate))
}

#[cfg(test)]
mod tests;

//! The CEL expressions of a JWT authenticator (claim validation rules, claim mappings, user
//! validation rules), compiled when the configuration is read and evaluated on each token as
//! kube-apiserver v1.36 evaluates them (`k8s.io/apiserver` `pkg/authentication/cel/compile.go`,
//! `mapper.go`, `plugin/pkg/authenticator/token/oidc/oidc.go`, and
//! `pkg/apis/apiserver/validation/validation.go`):
//!
//! - an expression sees one variable, by [`Scope`]: `claims`, declared `map(string, dyn)`, or
//!   `user`, a `kubernetes.UserInfo` with `username`, `uid`, `groups` and `extra`; any other name
//!   is an error at load, and so is a field `user` does not declare;
//! - one that must return a `bool` ([`Returns::Bool`]: validation rules) must have `bool` as its
//!   static type (`claims.admin` is `dyn` and refused; `claims.admin == true` passes); a mapping
//!   may return anything ([`Returns::Any`]), its value is checked by the caller;
//! - the claims are the token's payload as kube-apiserver hands it to CEL: every number a
//!   `double`, objects maps whose keys can be selected escaped (`claims.kubernetes__dot__io`);
//!   the user has its four fields even when empty (`values`);
//! - an evaluation that would cost more than [`PER_CALL_LIMIT`] (`celconfig.PerCallLimit`) is an
//!   error, as kube-apiserver's cost limit makes it; kube-apiserver estimates no cost for these
//!   expressions at load, and neither does this.
//!
//! The environment, the load check and the cost model are [`crate::base::cel`]'s. cel-rust counts
//! no cost, so an expression is priced before it runs, from the sizes of the token or user at
//! hand (`sizes`); one whose price for the largest possible value is within the limit (a
//! token is bounded by the largest request head the server reads) is not priced at all.

mod sizes;
mod values;

use std::fmt;
use std::sync::{Arc, OnceLock};

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, MapExpr, StructExpr, operators};
use cel::common::types::{CelBool, CelList, CelNull, CelString};
use cel::common::value::Val;
use cel::{Context, ExecutionError, Program, Value};
use serde_json::Map;

use crate::authn::User;
use crate::base::cel::{
    self as base_cel, ENV, Object, PER_CALL_LIMIT, Sizes, Type, Variable, cost, cost_exceeded,
};

/// Which variable an expression sees: claim validation rules and claim mappings see the token's
/// `claims`, user validation rules the `user` mapped from them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `claims`, the token's payload.
    Claims,
    /// `user`, the user mapped from the claims.
    User,
}

impl Scope {
    /// The one variable an expression of this scope may name.
    fn variables(self) -> &'static [Variable] {
        match self {
            Scope::Claims => &CLAIMS,
            Scope::User => &USER,
        }
    }
}

/// What an expression must return, checked at load against its static type: validation rules a
/// `bool`, claim mappings anything (kube-apiserver checks their values when it maps a token).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Returns {
    /// The static type must be `bool`: kube-apiserver compares the checked expression's output
    /// type with `bool`, so a `dyn` value does not pass.
    Bool,
    /// Any type.
    Any,
}

/// `claims`, as kube-apiserver declares it: a map from strings to anything.
static CLAIMS: [Variable; 1] = [Variable {
    name: "claims",
    declared: Type::Map(&Type::String, &Type::Dyn),
}];

/// `user`, as kube-apiserver declares it (`buildUserType`).
static USER: [Variable; 1] = [Variable {
    name: "user",
    declared: Type::Object(&USER_INFO),
}];

static USER_INFO: Object = Object {
    name: "kubernetes.UserInfo",
    fields: &[
        ("username", Type::String),
        ("uid", Type::String),
        ("groups", Type::List(&Type::String)),
        (
            "extra",
            Type::Map(&Type::String, &Type::List(&Type::String)),
        ),
    ],
};

/// A compiled expression. Cheap to clone: the program is shared.
#[derive(Clone)]
pub struct Expression(Arc<Shared>);

/// What an [`Expression`] shares.
struct Shared {
    /// The expression as written, which errors quote.
    text: Arc<str>,
    program: Program,
    /// The cost of the largest value its variable can have: when it is within
    /// [`PER_CALL_LIMIT`], no evaluation can pass the limit and none is priced.
    estimate: u64,
}

/// The expression's text.
impl fmt::Debug for Expression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Expression").field(&self.text()).finish()
    }
}

/// Why an expression does not compile: the detail kube-apiserver gives (its validation error
/// names the field and the expression around it), on one line.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// Not CEL, or not CEL this proxy evaluates, or naming what the scope does not declare.
    #[error(transparent)]
    Cel(#[from] base_cel::CompileError),
    /// [`Returns::Bool`], and the expression's static type is not `bool`.
    #[error("must evaluate to bool")]
    NotBool,
}

/// Compiles `expression` over the variable of `scope`, its result checked against `returns`.
pub fn compile(
    expression: &str,
    scope: Scope,
    returns: Returns,
) -> Result<Expression, CompileError> {
    let base_cel::Compiled { program, output } = base_cel::compile(expression, scope.variables())?;
    if returns == Returns::Bool && output != Type::Bool {
        return Err(CompileError::NotBool);
    }
    let estimate = cost(program.expression(), sizes::worst_case(scope));
    Ok(Expression(Arc::new(Shared {
        text: Arc::from(expression),
        program,
        estimate,
    })))
}

impl Expression {
    /// The expression as written.
    pub fn text(&self) -> &str {
        &self.0.text
    }

    /// kube-apiserver's `hasSelectExp`: whether the expression selects `field` directly on the
    /// identifier `operand` anywhere (`claims.email`, `has(claims.email)`, `claims.?email`; not
    /// `claims['email']`). Validation uses it for the rule that an expression mapping the
    /// username from `claims.email` needs `claims.email_verified` somewhere.
    pub fn selects(&self, operand: &str, field: &str) -> bool {
        !operand.is_empty()
            && !field.is_empty()
            && selects(self.0.program.expression(), operand, field)
    }

    /// Evaluates the expression on `input`, which must be of its scope (an expression over
    /// `claims` finds no `claims` in a user's input: an evaluation error). Not run when its cost
    /// on this input would pass [`PER_CALL_LIMIT`].
    pub fn evaluate(&self, input: &Input<'_>) -> Result<Output, EvaluationError> {
        let shared = &*self.0;
        if shared.estimate > PER_CALL_LIMIT {
            let cost = cost(shared.program.expression(), input.sizes());
            if cost > PER_CALL_LIMIT {
                return Err(EvaluationError::CostLimit {
                    expression: Arc::clone(&shared.text),
                    cost,
                });
            }
        }
        let value =
            Value::resolve_val(shared.program.expression(), &input.context).map_err(|source| {
                EvaluationError::Failed {
                    expression: Arc::clone(&shared.text),
                    source,
                }
            })?;
        Ok(Output::of(value.as_ref()))
    }
}

/// `hasSelectExp` over `expr`.
fn selects(expr: &IdedExpr, operand: &str, field: &str) -> bool {
    let is_operand = |e: &IdedExpr| matches!(&e.expr, Expr::Ident(name) if name == operand);
    let is_field = |e: &IdedExpr| match &e.expr {
        Expr::Literal(LiteralValue::String(name)) => name.inner() == field,
        _ => false,
    };
    let walk = |e: &IdedExpr| selects(e, operand, field);
    match &expr.expr {
        Expr::Unspecified | Expr::Ident(_) | Expr::Literal(_) => false,
        Expr::Select(select) => {
            (is_operand(&select.operand) && select.field == field) || walk(&select.operand)
        }
        Expr::Call(call) => {
            // `x.?f` is the call `_?._(x, 'f')`.
            let optional_select = call.target.is_none()
                && call.func_name == operators::OPT_SELECT
                && matches!(call.args.as_slice(), [on, name] if is_operand(on) && is_field(name));
            optional_select
                || call.args.iter().any(walk)
                || call.target.as_deref().is_some_and(walk)
        }
        Expr::List(list) => list.elements.iter().any(walk),
        Expr::Map(MapExpr { entries }) | Expr::Struct(StructExpr { entries, .. }) => {
            entries.iter().any(|entry| match &entry.expr {
                EntryExpr::MapEntry(entry) => walk(&entry.key) || walk(&entry.value),
                EntryExpr::StructField(field) => walk(&field.value),
            })
        }
        Expr::Comprehension(c) => [
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ]
        .into_iter()
        .any(walk),
    }
}

/// The value expressions run on: a token's claims or a user, made CEL once and shared by every
/// expression evaluated on it, borrowing the claims or the user rather than copying them.
pub struct Input<'a> {
    /// The one variable, bound in kube-apiserver's environment.
    context: Context<'a, 'a>,
    /// What the variable was made of, measured for the cost model.
    source: Source<'a>,
    /// The cost model's sizes of the variable, measured the first time an expression needs
    /// pricing.
    sizes: OnceLock<Sizes>,
}

/// What an [`Input`] was made of.
enum Source<'a> {
    Claims(&'a Map<String, serde_json::Value>),
    User(&'a User),
}

impl<'a> Input<'a> {
    /// A token's claims: the decoded JWT payload object.
    pub fn claims(claims: &'a Map<String, serde_json::Value>) -> Input<'a> {
        Input::new(
            CLAIMS[0].name,
            Box::new(values::claims(claims)),
            Source::Claims(claims),
        )
    }

    /// The user mapped from the claims, for user validation rules.
    pub fn user(user: &'a User) -> Input<'a> {
        Input::new(
            USER[0].name,
            Box::new(values::user(user)),
            Source::User(user),
        )
    }

    fn new(name: &'static str, value: Box<dyn Val + 'a>, source: Source<'a>) -> Input<'a> {
        let mut context = Context::with_env(Arc::clone(&ENV));
        context.add_variable_as_val(name, value);
        Input {
            context,
            source,
            sizes: OnceLock::new(),
        }
    }

    /// The sizes of the variable, measured once.
    fn sizes(&self) -> &Sizes {
        self.sizes.get_or_init(|| match self.source {
            Source::Claims(claims) => sizes::claims(claims),
            Source::User(user) => sizes::user(user),
        })
    }
}

/// An expression's result, reduced to what kube-apiserver's mapping code tells apart: a
/// username or uid must be a string, groups and extra values a string, a list of strings or
/// null, a validation rule's result a bool.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// A `bool`.
    Bool(bool),
    /// A `string`.
    String(String),
    /// `null`.
    Null,
    /// A list; elements that are not strings are `None`.
    List(Vec<Option<String>>),
    /// Anything else, by its CEL type name.
    Other(String),
}

impl Output {
    fn of(value: &dyn Val) -> Output {
        if let Some(b) = value.downcast_ref::<CelBool>() {
            Output::Bool(*b.inner())
        } else if let Some(s) = value.downcast_ref::<CelString>() {
            Output::String(s.inner().to_owned())
        } else if value.downcast_ref::<CelNull>().is_some() {
            Output::Null
        } else if let Some(list) = value.downcast_ref::<CelList>() {
            let elements = list.inner().iter().map(|element| {
                element
                    .downcast_ref::<CelString>()
                    .map(|s| s.inner().to_owned())
            });
            Output::List(elements.collect())
        } else {
            Output::Other(value.get_type().name().to_owned())
        }
    }
}

/// Why an expression could not be evaluated on an input, as kube-apiserver's mapper says it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EvaluationError {
    /// The evaluation failed (a missing claim, an overload that does not exist…).
    #[error("expression '{expression}' resulted in error: {source}")]
    Failed {
        /// The expression.
        expression: Arc<str>,
        /// Why.
        #[source]
        source: ExecutionError,
    },
    /// Evaluating it on this input would cost more than [`PER_CALL_LIMIT`]: it is not run.
    #[error("expression '{expression}' resulted in error: {}", cost_exceeded(*.cost))]
    CostLimit {
        /// The expression.
        expression: Arc<str>,
        /// Its cost on this input.
        cost: u64,
    },
}

#[cfg(test)]
mod tests;

//! The cost of an expression, in cel-go's cost units, since cel-rust counts none: kube-apiserver
//! stops any CEL evaluation whose cost passes `celconfig.PerCallLimit` (1,000,000, "roughly 0.1
//! second"), and refuses at load the expressions of a CRD whose estimated worst case passes
//! `StaticEstimatedCostLimit` (10,000,000).
//!
//! One model serves both: [`cost`] walks the expression with the [`Sizes`] its variables may
//! have — the largest its caller can be handed at load, those of the values at hand before it is
//! evaluated — and prices each step as cel-go's estimator (`checker/cost.go`) and Kubernetes'
//! library costs (`apiserver/pkg/cel/library/cost.go`) do: an identifier or a field selection 1,
//! a literal 0, most calls 1, string operations by the lengths they traverse (0.1 a byte),
//! `contains` by the product of the two lengths, `matches` by input length times pattern length
//! (0.25 a byte), a list or map literal 10 or 30, `x in list` by the list's length, and a
//! comprehension its range and initial value plus its loop (condition and step) once per
//! element. Every operation costs at least 1, which also covers cel-go's rounding up.
//!
//! Unlike cel-go, which prices `a && b` as both sides only at load, the cost before evaluation
//! is the worst case for the sizes at hand: no short-circuit is assumed.
//!
//! A comprehension outside any other, over a list of strings whose total length is known (a
//! user's groups, the keys of its extra), is priced with that total: the elements' lengths add
//! up to it, so the loop costs at most `n × loop(empty) + loop(total) − loop(empty)` (the costs
//! grow with a length at least linearly, so the sum over elements is at most the cost at the
//! sum). A `map()` or `filter()` accumulator grows by appending in place (cel-rust's
//! `AppendStep`), so that append costs 1, not a copy of the list.

use std::sync::Arc;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, operators};

use super::unescape;

/// kube-apiserver's `celconfig.PerCallLimit`: the most one evaluation of one expression may cost.
pub const PER_CALL_LIMIT: u64 = 1_000_000;
/// kube-apiserver's `StaticEstimatedCostLimit` (CRD validation rules): the most one expression's
/// worst case may cost for it to load.
pub const STATIC_ESTIMATED_COST_LIMIT: u64 = 10_000_000;

/// cel-go's `common.StringTraversalCostFactor`: the cost of reading one byte of a string.
const STRING_TRAVERSAL: f64 = 0.1;
/// cel-go's `common.RegexStringLengthCostFactor`: the cost of one byte of a pattern.
const REGEX_LENGTH: f64 = 0.25;
/// cel-go's `common.ListCreateBaseCost`.
const LIST_CREATE: f64 = 10.0;
/// cel-go's `common.MapCreateBaseCost`.
const MAP_CREATE: f64 = 30.0;
/// cel-go's `common.StructCreateBaseCost`.
const STRUCT_CREATE: f64 = 40.0;

/// What the cost model knows of a value's size: a string's length in bytes, a list's or a
/// map's number of elements and the size of each, the sizes of a record's fields.
#[derive(Debug, Clone, PartialEq)]
pub enum Size {
    /// An object with declared fields (a `check::Object`), each of its size: `.field` is that
    /// field's size; it counts as one element.
    Record(Arc<[(&'static str, Size)]>),
    /// A map whose entries are known one by one (a JSON object at hand): `.key` and `['key']`
    /// are that entry's size, under its name or under the name Kubernetes' escaping
    /// ([`unescape`]) makes of it; a key that is not there fails the evaluation, so it costs as
    /// a scalar. Iterated, an element is as large as its largest key or value.
    Entries(Arc<[(String, Size)]>),
    /// A bool, a number, null, a type: size 1.
    Scalar,
    /// A string or bytes of at most this many bytes.
    Str(f64),
    /// A list of at most `count` elements, each at most `elem`; `total`, when known, bounds the
    /// sum of their lengths (strings only).
    List {
        /// The most elements.
        count: f64,
        /// The largest element.
        elem: Box<Size>,
        /// The most their lengths add up to.
        total: Option<f64>,
    },
    /// A map of at most `count` entries, keys at most `key` (their lengths adding up to at most
    /// `key_total` when known), values at most `value`.
    Map {
        /// The most entries.
        count: f64,
        /// The largest key.
        key: Box<Size>,
        /// The most the keys' lengths add up to.
        key_total: Option<f64>,
        /// The largest value.
        value: Box<Size>,
    },
    /// Nothing known: as large as [`Sizes`]' ceiling.
    Unknown,
}

impl Size {
    /// A list of `count` strings, the longest of `longest` bytes, `total` bytes in all.
    pub fn list_of_strings(count: usize, longest: usize, total: usize) -> Size {
        Size::List {
            count: count as f64,
            elem: Box::new(Size::Str(longest as f64)),
            total: Some(total as f64),
        }
    }

    /// The larger of two sizes, for a value that may be either.
    pub fn max(self, other: Size) -> Size {
        match (self, other) {
            (a, b) if a == b => a,
            (Size::Str(a), Size::Str(b)) => Size::Str(a.max(b)),
            (
                Size::List {
                    count: a,
                    elem: ea,
                    total: ta,
                },
                Size::List {
                    count: b,
                    elem: eb,
                    total: tb,
                },
            ) => Size::List {
                count: a.max(b),
                elem: Box::new(ea.max(*eb)),
                total: ta.zip(tb).map(|(a, b)| a.max(b)),
            },
            (Size::Scalar, Size::Scalar) => Size::Scalar,
            _ => Size::Unknown,
        }
    }
}

/// The sizes of an expression's variables: the largest they can be (at load), or those of the
/// values at hand (before an evaluation).
#[derive(Debug, Clone)]
pub struct Sizes {
    variables: Vec<(&'static str, Size)>,
    /// The size of a value the model cannot follow (the result of `format()`, a value of unknown
    /// shape): as large as all the variables together.
    ceiling: f64,
}

impl Sizes {
    /// The sizes of `variables`; `ceiling` bounds any value computed from them whose size the
    /// model cannot follow: at least the largest string or list any of them holds.
    pub fn new(variables: Vec<(&'static str, Size)>, ceiling: f64) -> Sizes {
        Sizes { variables, ceiling }
    }

    /// The size of the variable `name`; anything else an identifier names (a type) is a scalar.
    fn variable(&self, name: &str) -> Size {
        self.variables
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(Size::Scalar, |(_, size)| size.clone())
    }

    /// The size of `record.field`.
    fn field(&self, record: &Size, field: &str) -> Size {
        match record {
            Size::Record(fields) => fields
                .iter()
                .find(|(name, _)| *name == field)
                .map_or(Size::Unknown, |(_, size)| size.clone()),
            Size::Entries(entries) => entry(entries, field),
            Size::Map { value, .. } => (**value).clone(),
            _ => Size::Unknown,
        }
    }

    /// A string's length, a list's or a map's number of elements.
    fn len(&self, size: &Size) -> f64 {
        match size {
            Size::Str(n) | Size::List { count: n, .. } | Size::Map { count: n, .. } => *n,
            Size::Entries(entries) => entries.len() as f64,
            Size::Record(_) | Size::Scalar => 1.0,
            Size::Unknown => self.ceiling,
        }
    }
}

/// The size of the entry `key` of a map known entry by entry: the larger of the entries named
/// `key` and named what `key` unescapes to (a lookup finds one of them); none is there: the
/// lookup fails, and its result is never used.
fn entry(entries: &[(String, Size)], key: &str) -> Size {
    let unescaped = unescape(key);
    entries
        .iter()
        .filter(|(name, _)| name == key || unescaped.as_deref() == Some(name.as_str()))
        .map(|(_, size)| size.clone())
        .reduce(Size::max)
        .unwrap_or(Size::Scalar)
}

/// The largest entry of a map known entry by entry: what a key known only at evaluation finds.
fn largest(entries: &[(String, Size)]) -> Size {
    entries
        .iter()
        .map(|(_, size)| size.clone())
        .reduce(Size::max)
        .unwrap_or(Size::Scalar)
}

/// The cost of `expr` for variables of the sizes `sizes` gives, rounded up to a whole number.
pub fn cost(expr: &IdedExpr, sizes: &Sizes) -> u64 {
    let (cost, _) = Model { sizes }.walk(expr, &mut Vec::new());
    if cost.is_nan() {
        // Not reachable by the arithmetic below (see `times`), and never a pass if it were.
        return u64::MAX;
    }
    // `as` saturates: an astronomical (or infinite) estimate is u64::MAX.
    cost.ceil() as u64
}

/// `n` iterations costing `each`: none cost nothing, even when each would cost an infinity
/// (deep nesting over the largest input overflows f64), so that no NaN arises.
fn times(n: f64, each: f64) -> f64 {
    if n == 0.0 { 0.0 } else { n * each }
}

/// The cost model walking one expression.
struct Model<'s> {
    sizes: &'s Sizes,
}

impl Model<'_> {
    /// The cost of `expr` in `scope` (comprehension variables, innermost last) and the size of
    /// its result.
    fn walk<'e>(&self, expr: &'e IdedExpr, scope: &mut Vec<(&'e str, Size)>) -> (f64, Size) {
        match &expr.expr {
            Expr::Unspecified => (0.0, Size::Unknown),
            Expr::Literal(literal) => (0.0, literal_size(literal)),
            Expr::Ident(name) => {
                let size = match scope.iter().rev().find(|(n, _)| n == name) {
                    Some((_, size)) => size.clone(),
                    None => self.sizes.variable(name),
                };
                (1.0, size)
            }
            Expr::Select(select) => {
                let (cost, operand) = self.walk(&select.operand, scope);
                if select.test {
                    // kube-apiserver prices `has()` as its operand only
                    // (`PresenceTestHasCost(false)`).
                    (cost, Size::Scalar)
                } else {
                    (cost + 1.0, self.sizes.field(&operand, &select.field))
                }
            }
            Expr::List(list) => {
                let mut cost = LIST_CREATE;
                let mut elem: Option<Size> = None;
                for element in &list.elements {
                    let (c, size) = self.walk(element, scope);
                    cost += c;
                    elem = Some(match elem {
                        Some(e) => e.max(size),
                        None => size,
                    });
                }
                let total = match &elem {
                    Some(Size::Str(n)) => Some(n * list.elements.len() as f64),
                    _ => None,
                };
                let size = Size::List {
                    count: list.elements.len() as f64,
                    elem: Box::new(elem.unwrap_or(Size::Unknown)),
                    total,
                };
                (cost, size)
            }
            Expr::Map(map) => {
                let mut cost = MAP_CREATE;
                let (mut key, mut value) = (Size::Str(0.0), None::<Size>);
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(entry) = &entry.expr {
                        let (kc, k) = self.walk(&entry.key, scope);
                        let (vc, v) = self.walk(&entry.value, scope);
                        cost += kc + vc;
                        key = key.max(k);
                        value = Some(match value {
                            Some(value) => value.max(v),
                            None => v,
                        });
                    }
                }
                let size = Size::Map {
                    count: map.entries.len() as f64,
                    key: Box::new(key),
                    key_total: None,
                    value: Box::new(value.unwrap_or(Size::Unknown)),
                };
                (cost, size)
            }
            Expr::Struct(object) => {
                let mut cost = STRUCT_CREATE;
                for field in &object.entries {
                    if let EntryExpr::StructField(field) = &field.expr {
                        cost += self.walk(&field.value, scope).0;
                    }
                }
                (cost, Size::Unknown)
            }
            Expr::Comprehension(c) => {
                let (range_cost, range) = self.walk(&c.iter_range, scope);
                let (init_cost, init) = self.walk(&c.accu_init, scope);
                let count = self.sizes.len(&range);
                let (elem, total, value) = match &range {
                    Size::List { elem, total, .. } => ((**elem).clone(), *total, Size::Unknown),
                    Size::Map {
                        key,
                        key_total,
                        value,
                        ..
                    } => ((**key).clone(), *key_total, (**value).clone()),
                    Size::Entries(entries) => {
                        let keys = entries.iter().map(|(key, _)| Size::Str(key.len() as f64));
                        let elem = keys.fold(largest(entries), Size::max);
                        (elem, None, largest(entries))
                    }
                    _ => (Size::Unknown, None, Size::Unknown),
                };
                // A list accumulator (`map()`, `filter()`) ends with at most one element per
                // iteration more than it starts with; its elements are the step's.
                let accumulator = match &init {
                    Size::List {
                        count: start, elem, ..
                    } => Size::List {
                        count: start + count,
                        elem: elem.clone(),
                        total: None,
                    },
                    other => other.clone(),
                };
                // Each walk of the loop: its cost and the size of the step's result.
                let iteration = |model: &Self, elem: Size, scope: &mut Vec<(&'e str, Size)>| {
                    let depth = scope.len();
                    scope.push((&c.iter_var, elem));
                    if let Some(second) = &c.iter_var2 {
                        scope.push((second, value.clone()));
                    }
                    scope.push((&c.accu_var, accumulator.clone()));
                    let (step_cost, step) = model.walk(&c.loop_step, scope);
                    let cost = model.walk(&c.loop_cond, scope).0 + step_cost;
                    scope.truncate(depth);
                    (cost, step)
                };
                // The bound by the total length walks the loop twice: only for a comprehension
                // outside any other, so that the walks stay linear in the expression's size.
                let (loop_cost, step) = match (total, &elem) {
                    (Some(total), Size::Str(_)) if scope.is_empty() => {
                        let (empty, _) = iteration(self, Size::Str(0.0), scope);
                        let (whole, step) = iteration(self, Size::Str(total), scope);
                        // `whole - empty` with both infinite would be NaN.
                        let growth = if whole.is_finite() {
                            (whole - empty).max(0.0)
                        } else {
                            f64::INFINITY
                        };
                        (times(count, empty) + growth, step)
                    }
                    _ => {
                        let (each, step) = iteration(self, elem, scope);
                        (times(count, each), step)
                    }
                };
                let accumulator = match (accumulator, step) {
                    (Size::List { count, elem, .. }, Size::List { elem: added, .. }) => {
                        Size::List {
                            count,
                            elem: Box::new(elem.max(*added)),
                            total: None,
                        }
                    }
                    (accumulator, _) => accumulator,
                };
                let depth = scope.len();
                scope.push((&c.accu_var, accumulator));
                let (result_cost, result) = self.walk(&c.result, scope);
                scope.truncate(depth);
                (range_cost + init_cost + loop_cost + result_cost, result)
            }
            Expr::Call(call) => {
                let mut cost = 0.0;
                let target = call.target.as_deref().map(|t| {
                    let (c, size) = self.walk(t, scope);
                    cost += c;
                    size
                });
                if call.func_name == operators::CONDITIONAL {
                    return self.conditional(&call.args, scope);
                }
                let mut args = Vec::with_capacity(call.args.len());
                for arg in &call.args {
                    let (c, size) = self.walk(arg, scope);
                    cost += c;
                    args.push(size);
                }
                let appends = call.func_name == operators::ADD
                    && matches!(call.args.as_slice(),
                        [lhs, rhs] if accumulator(lhs) && matches!(rhs.expr, Expr::List(_)));
                let (own, size) = match (call.func_name.as_str(), args.as_slice()) {
                    // `m['key']` on a map known entry by entry: that entry, as `m.key`.
                    (operators::INDEX, [Size::Entries(entries), _]) => {
                        let size = match call.args.get(1).map(|key| &key.expr) {
                            Some(Expr::Literal(LiteralValue::String(key))) => {
                                entry(entries, key.inner())
                            }
                            _ => largest(entries),
                        };
                        (1.0, size)
                    }
                    (function, _) => self.call(function, target, &args, appends),
                };
                (cost + own, size)
            }
        }
    }

    /// `c ? a : b`: the condition and the dearer branch.
    fn conditional<'e>(
        &self,
        args: &'e [IdedExpr],
        scope: &mut Vec<(&'e str, Size)>,
    ) -> (f64, Size) {
        let mut walked = args.iter().map(|arg| self.walk(arg, scope));
        let (condition, _) = walked.next().unwrap_or((0.0, Size::Scalar));
        let (then, then_size) = walked.next().unwrap_or((0.0, Size::Unknown));
        let (otherwise, otherwise_size) = walked.next().unwrap_or((0.0, Size::Unknown));
        (
            condition + then.max(otherwise),
            then_size.max(otherwise_size),
        )
    }

    /// A call's own cost (its arguments' aside) and the size of its result. A method's receiver
    /// is `target`; a global function's first argument stands for it.
    fn call(
        &self,
        function: &str,
        target: Option<Size>,
        args: &[Size],
        appends: bool,
    ) -> (f64, Size) {
        let len = |size: &Size| self.sizes.len(size);
        let (receiver, rest) = match target {
            Some(target) => (target, args),
            None => match args.split_first() {
                Some((first, rest)) => (first.clone(), rest),
                None => (Size::Unknown, args),
            },
        };
        let arg = |i: usize| rest.get(i).cloned().unwrap_or(Size::Str(0.0));
        let traverse = |n: f64| 1.0 + STRING_TRAVERSAL * n;
        match function {
            operators::LOGICAL_AND | operators::LOGICAL_OR => (0.0, Size::Scalar),
            operators::ADD if appends => {
                let elem = match arg(0) {
                    Size::List { elem, .. } => elem,
                    _ => Box::new(Size::Unknown),
                };
                let size = Size::List {
                    count: len(&receiver) + 1.0,
                    elem,
                    total: None,
                };
                (1.0, size)
            }
            operators::ADD => match (&receiver, &arg(0)) {
                (Size::Str(a), Size::Str(b)) => (traverse(a + b), Size::Str(a + b)),
                (Size::List { .. }, Size::List { .. }) => {
                    let size = receiver.clone().max(arg(0));
                    let count = len(&receiver) + len(&arg(0));
                    let size = match size {
                        Size::List { elem, .. } => Size::List {
                            count,
                            elem,
                            total: None,
                        },
                        other => other,
                    };
                    (traverse(count), size)
                }
                (Size::Unknown, _) | (_, Size::Unknown) => {
                    (traverse(len(&receiver) + len(&arg(0))), Size::Unknown)
                }
                _ => (1.0, Size::Scalar),
            },
            operators::EQUALS
            | operators::NOT_EQUALS
            | operators::LESS
            | operators::LESS_EQUALS
            | operators::GREATER
            | operators::GREATER_EQUALS => {
                (traverse(len(&receiver).min(len(&arg(0)))), Size::Scalar)
            }
            operators::IN => match arg(0) {
                Size::Map { .. } => (1.0, Size::Scalar),
                list => (1.0 + len(&list), Size::Scalar),
            },
            operators::INDEX => {
                let size = match receiver {
                    Size::List { elem, .. } => *elem,
                    Size::Map { value, .. } => *value,
                    _ => Size::Unknown,
                };
                (1.0, size)
            }
            "startsWith" | "endsWith" => (traverse(len(&arg(0))), Size::Scalar),
            "contains" => (traverse(len(&receiver) * len(&arg(0))), Size::Scalar),
            "indexOf" | "lastIndexOf" => (traverse(len(&receiver) * len(&arg(0))), Size::Scalar),
            "matches" => {
                let input = STRING_TRAVERSAL * (1.0 + len(&receiver));
                let pattern = REGEX_LENGTH * len(&arg(0));
                ((1.0 + input) * (1.0 + pattern), Size::Scalar)
            }
            "lowerAscii" | "upperAscii" | "trim" | "reverse" | "substring" => {
                (traverse(len(&receiver)), Size::Str(len(&receiver)))
            }
            "charAt" => (traverse(len(&receiver)), Size::Str(4.0)),
            "quote" => {
                let n = len(&receiver);
                (traverse(n), Size::Str(2.0 + 4.0 * n))
            }
            "replace" => {
                let (n, old, new) = (len(&receiver), len(&arg(0)), len(&arg(1)));
                // Each byte (or the gap before it, for an empty pattern) may become `new`.
                let out = (n + 1.0) * (new + 1.0);
                (traverse(n * old.max(1.0) + out), Size::Str(out))
            }
            "split" => {
                let n = len(&receiver);
                let size = Size::List {
                    count: n + 1.0,
                    elem: Box::new(Size::Str(n)),
                    total: Some(n),
                };
                (traverse(n * len(&arg(0)).max(1.0)), size)
            }
            "join" => {
                let count = len(&receiver);
                let bytes = match &receiver {
                    Size::List {
                        total: Some(total), ..
                    } => *total,
                    Size::List { elem, .. } => count * len(elem),
                    _ => self.sizes.ceiling,
                };
                let out = bytes + count * len(&arg(0));
                (traverse(out), Size::Str(out))
            }
            "format" => (traverse(len(&receiver) + len(&arg(0))), Size::Unknown),
            "string" | "bytes" => (
                traverse(len(&receiver)),
                Size::Str(len(&receiver).max(32.0)),
            ),
            _ => (1.0, scalar_or_unknown(function)),
        }
    }
}

/// Whether `expr` is a comprehension's accumulator: cel-rust names them with a leading `@`,
/// which no variable an expression declares can have.
fn accumulator(expr: &IdedExpr) -> bool {
    matches!(&expr.expr, Expr::Ident(name) if name.starts_with('@'))
}

fn literal_size(literal: &LiteralValue) -> Size {
    match literal {
        LiteralValue::String(s) => Size::Str(s.inner().len() as f64),
        LiteralValue::Bytes(b) => Size::Str(b.inner().len() as f64),
        _ => Size::Scalar,
    }
}

/// The result of a function the model does not price beyond 1: a bool or a number for those
/// known to return one, anything otherwise.
fn scalar_or_unknown(function: &str) -> Size {
    match function {
        operators::LOGICAL_NOT
        | operators::NOT_STRICTLY_FALSE
        | operators::NEGATE
        | operators::SUBSTRACT
        | operators::MULTIPLY
        | operators::DIVIDE
        | operators::MODULO
        | "size"
        | "int"
        | "uint"
        | "double"
        | "bool"
        | "type"
        | "hasValue" => Size::Scalar,
        _ => Size::Unknown,
    }
}

#[cfg(test)]
mod tests;

//! The load-time check standing in for kube-apiserver's CEL type checker, which cel-rust lacks:
//! the type of every sub-expression as far as the declared variables tell it, so that an
//! undeclared name, a field an object does not declare, a field of a string or a list, a
//! malformed regular expression literal or a Kubernetes-only function fails the load, and the
//! caller learns the type of the result.

use std::fmt;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, operators};

use super::CompileError;

/// A variable an expression may name, and its declared type.
#[derive(Debug)]
pub struct Variable {
    /// Its name.
    pub name: &'static str,
    /// Its type.
    pub declared: Type,
}

/// An object type: a record whose fields are declared, so that selecting any other is an error
/// at load, as kube-apiserver's `DeclType` objects make it.
#[derive(Debug, PartialEq, Eq)]
pub struct Object {
    /// The CEL type name, as kube-apiserver's messages spell it
    /// (`kubernetes.SubjectAccessReviewSpec`).
    pub name: &'static str,
    /// Its fields and their types.
    pub fields: &'static [(&'static str, Type)],
}

/// What the check knows of a value: a declared type or a literal's, or nothing (`Dyn`: anything
/// goes, as a value of a `dyn` map or the result of a function the check does not know).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// `bool`.
    Bool,
    /// `int`.
    Int,
    /// `uint`.
    Uint,
    /// `double`.
    Double,
    /// `string`.
    String,
    /// `bytes`.
    Bytes,
    /// `null_type`.
    Null,
    /// A list of elements of a type.
    List(&'static Type),
    /// A map from keys of the first type to values of the second.
    Map(&'static Type, &'static Type),
    /// An object with declared fields.
    Object(&'static Object),
    /// An optional value (`x.?f`, `m[?k]`) of a type, or of a type nothing has bound yet
    /// (`None`): cel-go's type variable, which the value `orValue()` falls back on binds, so
    /// that `claims[?'a']['b'].orValue(true)` is a `bool` where `claims.?a.orValue(true)` is
    /// `dyn`.
    Optional(Option<&'static Type>),
    /// Any type.
    Dyn,
}

/// The CEL type name, as kube-apiserver's messages spell it (`list(string)`,
/// `map(string, dyn)`).
impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Bool => f.write_str("bool"),
            Type::Int => f.write_str("int"),
            Type::Uint => f.write_str("uint"),
            Type::Double => f.write_str("double"),
            Type::String => f.write_str("string"),
            Type::Bytes => f.write_str("bytes"),
            Type::Null => f.write_str("null_type"),
            Type::List(element) => write!(f, "list({element})"),
            Type::Map(key, value) => write!(f, "map({key}, {value})"),
            Type::Object(object) => f.write_str(object.name),
            Type::Optional(value) => write!(f, "optional_type({})", value.unwrap_or(&Type::Dyn)),
            Type::Dyn => f.write_str("dyn"),
        }
    }
}

impl Type {
    /// The type of `self.field`: an object's declared field, a map's value; on an optional, the
    /// optional of its value's field, as cel-go's checker selects through an optional.
    fn select(self, field: &str) -> Result<Type, CompileError> {
        match self {
            Type::Optional(value) => {
                let value = value.unwrap_or(&Type::Dyn);
                Ok(Type::Optional(Some(value.field(field)?)))
            }
            other => other.field(field).copied(),
        }
    }

    /// The declared type of `self.field`.
    fn field(self, field: &str) -> Result<&'static Type, CompileError> {
        match self {
            Type::Object(object) => object
                .fields
                .iter()
                .find(|(name, _)| *name == field)
                .map(|(_, declared)| declared)
                .ok_or_else(|| CompileError::UndefinedField {
                    field: field.to_owned(),
                    of: object.name,
                }),
            Type::Map(_, value) => Ok(value),
            Type::Dyn => Ok(&Type::Dyn),
            other => Err(CompileError::NoFields(other)),
        }
    }

    /// The type of `self.?field`: the optional of the field's type.
    fn select_optional(self, field: &str) -> Result<Type, CompileError> {
        match self {
            Type::Optional(_) => self.select(field),
            other => Ok(Type::Optional(Some(other.field(field)?))),
        }
    }

    /// The type of an element of `self` when iterated by a comprehension: a list's elements, a
    /// map's keys.
    fn element(self) -> Type {
        match self {
            Type::List(element) | Type::Map(element, _) => *element,
            _ => Type::Dyn,
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
/// fail on every evaluation.
pub(super) const UNSUPPORTED_FUNCTIONS: [&str; 52] = [
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

/// Checks `expr`, in which `variables` are declared, and returns the type of its result. Only
/// what is certainly wrong in kube-apiserver too is an error.
pub(super) fn check(expr: &IdedExpr, variables: &'static [Variable]) -> Result<Type, CompileError> {
    Checker { variables }.check(expr, &mut Vec::new())
}

/// The check of one expression.
struct Checker {
    variables: &'static [Variable],
}

impl Checker {
    /// Checks `expr` in `scope` (the comprehension variables around it, innermost last) and
    /// returns its type.
    fn check<'e>(
        &self,
        expr: &'e IdedExpr,
        scope: &mut Vec<(&'e str, Type)>,
    ) -> Result<Type, CompileError> {
        Ok(match &expr.expr {
            Expr::Unspecified | Expr::Struct(_) => Type::Dyn,
            Expr::Literal(literal) => match literal {
                LiteralValue::Boolean(_) => Type::Bool,
                LiteralValue::Bytes(_) => Type::Bytes,
                LiteralValue::Double(_) => Type::Double,
                LiteralValue::Int(_) => Type::Int,
                LiteralValue::Null => Type::Null,
                LiteralValue::String(_) => Type::String,
                LiteralValue::UInt(_) => Type::Uint,
            },
            Expr::Ident(name) => self.ident(name, scope)?,
            Expr::Select(select) => {
                let field = self.check(&select.operand, scope)?.select(&select.field)?;
                if select.test { Type::Bool } else { field }
            }
            Expr::List(list) => {
                for element in &list.elements {
                    self.check(element, scope)?;
                }
                Type::List(&Type::Dyn)
            }
            Expr::Map(map) => {
                for entry in &map.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(entry) => {
                            self.check(&entry.key, scope)?;
                            self.check(&entry.value, scope)?;
                        }
                        EntryExpr::StructField(field) => {
                            self.check(&field.value, scope)?;
                        }
                    }
                }
                Type::Map(&Type::Dyn, &Type::Dyn)
            }
            Expr::Comprehension(comprehension) => {
                let element = self.check(&comprehension.iter_range, scope)?.element();
                let accumulator = self.check(&comprehension.accu_init, scope)?;
                let depth = scope.len();
                scope.push((&comprehension.iter_var, element));
                if let Some(second) = &comprehension.iter_var2 {
                    scope.push((second, Type::Dyn));
                }
                scope.push((&comprehension.accu_var, accumulator));
                let checked = [
                    &comprehension.loop_cond,
                    &comprehension.loop_step,
                    &comprehension.result,
                ]
                .map(|part| self.check(part, scope));
                scope.truncate(depth);
                let [condition, step, result] = checked;
                condition?;
                step?;
                result?
            }
            Expr::Call(call) => {
                let function = call.func_name.as_str();
                if let Some(namespace) = call
                    .target
                    .as_deref()
                    .and_then(|t| self.namespace(t, scope))
                {
                    if KUBERNETES_NAMESPACES.contains(&namespace) {
                        return Err(CompileError::Unsupported(format!(
                            "{namespace}.{function}(), of a Kubernetes CEL library,"
                        )));
                    }
                    if !NAMESPACES.contains(&namespace) {
                        return Err(self.undeclared(namespace));
                    }
                    for arg in &call.args {
                        self.check(arg, scope)?;
                    }
                    return Ok(Type::Dyn);
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
                    Some(target) => Some(self.check(target, scope)?),
                    None => None,
                };
                let mut args = Vec::with_capacity(call.args.len());
                for arg in &call.args {
                    args.push(self.check(arg, scope)?);
                }
                if function == "matches" {
                    check_pattern(call.args.last())?;
                }
                if let (operators::OPT_SELECT, [operand, _], [_, field]) =
                    (function, args.as_slice(), call.args.as_slice())
                    && let Expr::Literal(LiteralValue::String(field)) = &field.expr
                {
                    return operand.select_optional(field.inner());
                }
                call_type(function, target, &args)
            }
        })
    }

    /// The type of the identifier `name`: a comprehension variable, a declared variable, or a
    /// type name.
    fn ident(&self, name: &str, scope: &[(&str, Type)]) -> Result<Type, CompileError> {
        if let Some((_, declared)) = scope.iter().rev().find(|(n, _)| *n == name) {
            return Ok(*declared);
        }
        if let Some(variable) = self.variables.iter().find(|v| v.name == name) {
            return Ok(variable.declared);
        }
        if TYPE_NAMES.contains(&name) {
            return Ok(Type::Dyn);
        }
        Err(self.undeclared(name))
    }

    /// The namespace a call's target names, when it is a bare identifier that is not a
    /// variable.
    fn namespace<'e>(&self, target: &'e IdedExpr, scope: &[(&str, Type)]) -> Option<&'e str> {
        match &target.expr {
            Expr::Ident(name)
                if !self.variables.iter().any(|v| v.name == name)
                    && !scope.iter().any(|(n, _)| n == name) =>
            {
                Some(name)
            }
            _ => None,
        }
    }

    fn undeclared(&self, name: &str) -> CompileError {
        CompileError::UndeclaredReference {
            name: name.to_owned(),
            variables: self.variables,
        }
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

/// The type of a call's result, where the function says it.
fn call_type(function: &str, target: Option<Type>, args: &[Type]) -> Type {
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
        | "hasValue"
        | "bool" => Type::Bool,
        "size" => Type::Int,
        "lowerAscii" | "upperAscii" | "trim" | "replace" | "substring" | "charAt" | "join"
        | "format" | "reverse" => Type::String,
        // cel-go's overloads: a list's element, a map's value; through an optional, the
        // optional of it, and of a type yet unbound when the optional's value is `dyn`.
        operators::INDEX => match args.first() {
            Some(Type::List(element)) => **element,
            Some(Type::Map(_, value)) => **value,
            Some(Type::Optional(value)) => optional_element(*value),
            _ => Type::Dyn,
        },
        operators::OPT_INDEX => match args.first() {
            Some(Type::List(value) | Type::Map(_, value)) => Type::Optional(Some(value)),
            Some(Type::Optional(value)) => optional_element(*value),
            _ => Type::Dyn,
        },
        // `optional(T).orValue(T)`: the type both agree on, the argument's when the optional's
        // is unbound; `dyn` when either is.
        "orValue" => match (target, args) {
            (Some(Type::Optional(None)), [fallback]) => *fallback,
            (Some(Type::Optional(Some(value))), [fallback]) if *value == *fallback => *fallback,
            _ => Type::Dyn,
        },
        "value" => match target {
            Some(Type::Optional(Some(value))) => *value,
            _ => Type::Dyn,
        },
        operators::CONDITIONAL => match args {
            [_, then, otherwise] if then == otherwise => *then,
            _ => Type::Dyn,
        },
        operators::ADD => match (target, args) {
            (None, [Type::String, Type::String]) => Type::String,
            _ => Type::Dyn,
        },
        _ => Type::Dyn,
    }
}

/// The type of `optional[k]` where the optional's value is `value`: the optional of a list's
/// element or a map's value; of a type yet unbound for anything else, as cel-go's overloads on
/// an optional `dyn` leave it.
fn optional_element(value: Option<&'static Type>) -> Type {
    match value {
        Some(Type::List(element) | Type::Map(_, element)) => Type::Optional(Some(element)),
        _ => Type::Optional(None),
    }
}

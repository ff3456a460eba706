//! The load-time check standing in for kube-apiserver's CEL type checker, which cel-rust lacks:
//! the shape of every sub-expression, so that an undeclared name, a field `request` does not
//! declare, a result that cannot be a `bool` or a Kubernetes-only function fails the load.

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, operators};

use super::{CompileError, REQUEST};

/// What the load-time check knows of a value: the declared shape of `request` and its parts, a
/// literal's type, or nothing (`Dyn`: anything goes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
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
    pub(super) fn name(self) -> &'static str {
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

/// Checks `expr` in `scope` (the comprehension variables around it, innermost last) and returns
/// its shape. Only what is certainly wrong in kube-apiserver too is an error.
pub(super) fn check<'e>(
    expr: &'e IdedExpr,
    scope: &mut Vec<(&'e str, Shape)>,
) -> Result<Shape, CompileError> {
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

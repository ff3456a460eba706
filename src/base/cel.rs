//! CEL as kube-apiserver evaluates it, for every layer that takes expressions from its
//! configuration: the environment, compiling with kube-apiserver's limits, a load-time check
//! standing in for its type checker ([`check`]) and the cost model standing in for its cost
//! limits ([`cost`](mod@cost)). Each caller declares its own variables (their types for the
//! check, their sizes for the cost model) and keeps what is specific to it: what an expression
//! must return, how a result is read, which cost is too much at load.
//!
//! CEL is the `cel` crate (cel-rust) with its standard library and its strings extension, the
//! part of kube-apiserver's CEL environment (`k8s.io/apiserver` `pkg/cel/environment/base.go`)
//! that applies to the values this proxy hands to CEL. cel-rust has no type checker and counts
//! no cost: [`check`] catches at load the mistakes kube-apiserver's checker catches (an
//! undeclared name, a field an object does not declare, a malformed regular expression literal,
//! a function of Kubernetes' own CEL libraries, which cel-rust does not provide) and says which
//! type an expression has where it can; [`cost`](mod@cost) prices an expression in cel-go's
//! units from the sizes its variables may have.
//!
//! An expression within [`MAX_EXPRESSION_CODE_POINTS`] can nest tens of thousands of levels
//! deep, and every walk of it (the parser, the check, the cost model, the evaluation) recurses:
//! [`compile`] parses on a thread of its own sized to the expression and refuses one nested
//! deeper than [`MAX_NESTING_DEPTH`] there, so what it returns is shallow enough for any thread.

pub mod check;
pub mod cost;
mod escaping;

use std::sync::{Arc, LazyLock};

use cel::common::ast::{EntryExpr, Expr, IdedExpr, MapExpr, StructExpr};
use cel::common::types::{CelList, CelString};
use cel::common::value::Val;
use cel::{Env, ParseErrors, Program};

pub use check::{Object, Type, Variable};
pub use cost::{PER_CALL_LIMIT, STATIC_ESTIMATED_COST_LIMIT, Size, Sizes, cost};
pub use escaping::unescape;

/// cel-go's parser limit on an expression's length, in code points, which kube-apiserver keeps.
pub const MAX_EXPRESSION_CODE_POINTS: usize = 100_000;

/// How deep an expression may nest (its syntax tree's height): cel-go's parser recursion limit,
/// which kube-apiserver keeps. Deeper expressions are refused before anything walks them: the
/// load check, the cost estimate and the evaluation all recurse, and 250 levels of each fit a
/// 2 MiB thread stack many times over.
pub const MAX_NESTING_DEPTH: usize = 250;

/// The CEL environment every expression is compiled and evaluated in: the standard library and
/// the strings extension (kube-apiserver's `ext.Strings`). An evaluation's `Context` is built on
/// it.
pub static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    // The strings extension declares functions the standard library does not: adding it to a
    // fresh standard environment cannot conflict.
    env.add_extension(cel::extensions::strings)
        .expect("the strings extension adds to the standard library without conflict");
    Arc::new(env)
});

/// An expression that compiled and passed the load check.
#[derive(Debug)]
pub struct Compiled {
    /// The program, shallow enough (at most [`MAX_NESTING_DEPTH`] levels) for any thread to
    /// walk, evaluate and drop.
    pub program: Program,
    /// The type of its result as the check knows it (cel-go's `OutputType`), [`Type::Dyn`]
    /// where it cannot tell: what a caller checks its result against.
    pub output: Type,
}

/// Why an expression does not compile. Every message is one line: it ends up in a configuration
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
    /// A name that is neither a declared variable nor a comprehension's variable nor a type.
    #[error("compilation failed: undeclared reference to '{name}' ({})", declared(.variables))]
    UndeclaredReference {
        /// The name.
        name: String,
        /// The variables the expression may name.
        variables: &'static [Variable],
    },
    /// A field an object type does not declare.
    #[error("compilation failed: undefined field '{field}' of {of}")]
    UndefinedField {
        /// The field.
        field: String,
        /// The object type it was selected on.
        of: &'static str,
    },
    /// A field selected on a string, a list, a number…
    #[error("compilation failed: type '{0}' does not support field selection")]
    NoFields(Type),
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

/// The variables an undeclared name could have been, as an error says them.
fn declared(variables: &[Variable]) -> String {
    match variables {
        [] => "no variable is declared".to_owned(),
        [only] => format!("the only variable is {}", only.name),
        several => {
            let names: Vec<&str> = several.iter().map(|v| v.name).collect();
            format!("the variables are {}", names.join(", "))
        }
    }
}

/// A list of strings as a CEL value, borrowing them: a user's groups and extra values, for the
/// variables that carry one (`request` of a match condition, `user` of an authentication rule).
pub fn string_list(values: &[String]) -> Box<dyn Val + '_> {
    let list: Vec<Box<dyn Val + '_>> = values
        .iter()
        .map(|v| Box::new(CelString::from(v.as_str())) as Box<dyn Val + '_>)
        .collect();
    Box::new(CelList::from(list))
}

/// An expression as an error quotes it: whole up to 200 code points; longer, its start and its
/// length, so that an error about a huge expression stays a readable line.
pub fn quoted(expression: &str) -> String {
    match expression.char_indices().nth(200) {
        None => format!("{expression:?}"),
        Some((end, _)) => format!(
            "{:?}… ({} code points)",
            &expression[..end],
            expression.chars().count()
        ),
    }
}

/// kube-apiserver's message for an evaluation stopped by its cost limit (cel-go's), with the
/// cost and the limit.
pub fn cost_exceeded(cost: u64) -> String {
    format!("operation cancelled: actual cost limit exceeded (cost {cost}, limit {PER_CALL_LIMIT})")
}

/// Stack for compiling an expression: a base, and more per code point of it.
const COMPILE_STACK_BASE: usize = 8 << 20;
/// cel-rust's parser recurses once per link of a chain, and a link can be two characters (`.a`,
/// `+1`); measured in a debug build it takes under 2 KiB of stack a character. Brackets, which
/// take more a level, are bounded before parsing ([`bracket_depth`]).
const COMPILE_STACK_PER_CODE_POINT: usize = 4 << 10;

/// Compiles one expression in which `variables` are declared, checks what can be checked
/// without a type checker and says the type of its result.
///
/// cel-rust's parser recurses once per level of nesting: the parse runs on a thread of its own
/// whose stack grows with the expression's length (reserved, and touched only as deep as the
/// parser goes), and a syntax tree deeper than [`MAX_NESTING_DEPTH`] is refused, and dropped,
/// there too.
pub fn compile(expression: &str, variables: &'static [Variable]) -> Result<Compiled, CompileError> {
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
            .spawn_scoped(scope, || compile_here(expression, variables))
            .map_err(|source| CompileError::Thread { stack, source })?
            .join()
            .map_err(|_| CompileError::Panicked)?
    })
}

/// [`compile`], on the thread it runs on.
fn compile_here(
    expression: &str,
    variables: &'static [Variable],
) -> Result<Compiled, CompileError> {
    let program = ENV.compile(expression).map_err(CompileError::Syntax)?;
    if exceeds_depth(program.expression(), MAX_NESTING_DEPTH) {
        return Err(CompileError::TooDeep);
    }
    let output = check::check(program.expression(), variables)?;
    Ok(Compiled { program, output })
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

//! Kubernetes' escaping of names CEL cannot spell as identifiers: `kubernetes.io` is selected as
//! `kubernetes__dot__io` (`k8s.io/apiserver` `pkg/cel/escaping.go`, `Escape` and `Unescape`).

use std::borrow::Cow;

/// The words CEL reserves, which Kubernetes escapes as `__{word}__` when they are a whole name.
const RESERVED: [&str; 21] = [
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// The name `escaped` stands for, as kube-apiserver's `Unescape` reads it: each
/// `__underscores__`, `__dot__`, `__dash__` and `__slash__` becomes `__`, `.`, `-` and `/`; a
/// whole name `__{reserved word}__` is that word; any other `__x__` makes the name invalid
/// (`None`). Sequences are found left to right without overlapping, as Go's regular expression
/// `__[^_]+__` finds them. A name without `__` is itself, not copied.
pub fn unescape(escaped: &str) -> Option<Cow<'_, str>> {
    if !escaped.contains("__") {
        return Some(Cow::Borrowed(escaped));
    }
    let bytes = escaped.as_bytes();
    let mut unescaped = String::with_capacity(escaped.len());
    let (mut copied, mut at) = (0, 0);
    while at + 1 < bytes.len() {
        // `_` is ASCII: no byte of a multi-byte character is one, so these are char boundaries.
        if bytes[at..].starts_with(b"__") {
            let start = at + 2;
            let end = start + bytes[start..].iter().take_while(|&&b| b != b'_').count();
            if end > start && bytes[end..].starts_with(b"__") {
                let replacement = match &escaped[start..end] {
                    "underscores" => "__",
                    "dot" => ".",
                    "dash" => "-",
                    "slash" => "/",
                    word if RESERVED.contains(&word) && at == 0 && end + 2 == bytes.len() => word,
                    _ => return None,
                };
                unescaped.push_str(&escaped[copied..at]);
                unescaped.push_str(replacement);
                at = end + 2;
                copied = at;
                continue;
            }
        }
        at += 1;
    }
    unescaped.push_str(&escaped[copied..]);
    Some(Cow::Owned(unescaped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_unescape_as_kube_apiserver_reads_them() {
        for (escaped, name) in [
            ("sub", Some("sub")),
            ("kubernetes__dot__io", Some("kubernetes.io")),
            (
                "authentication__dot__x__dash__kubernetes__dot__io__slash__node__dash__name",
                Some("authentication.x-kubernetes.io/node-name"),
            ),
            ("a__underscores__b", Some("a__b")),
            ("__namespace__", Some("namespace")),
            ("__in__", Some("in")),
            // A reserved word is escaped only as a whole name.
            ("x__in__", None),
            ("__foo__", None),
            ("a__dot__b__bar__", None),
            // No closing `__`, or nothing between: not an escape.
            ("a__b", Some("a__b")),
            ("a____b", Some("a____b")),
            // Leftmost first, without overlapping: `___dot__` is `_` then `__dot__`.
            ("a___dot__b", Some("a_.b")),
            ("é__dot__ü", Some("é.ü")),
        ] {
            assert_eq!(unescape(escaped).as_deref(), name, "{escaped}");
        }
        assert!(matches!(unescape("plain.name"), Some(Cow::Borrowed(_))));
    }
}

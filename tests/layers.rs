//! The folders of `src/` are layers. The map at the top of `src/lib.rs` lists them from the ground
//! up, one bullet each; a module may name (`crate::<module>`) only the modules listed before it,
//! so each layer can be read, changed and tested with only what is below it in mind.
//!
//! The source is read as text, as a reviewer reads it: comment lines are skipped, and so are
//! tests (files named `tests.rs` or `*_tests.rs`, and everything after a `#[cfg(test)]` line),
//! which may reach anywhere. Both `crate::module::Item` paths and `use crate::{module::Item, ..}`
//! groups count.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The repository's `src/`.
fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The layers in the order `src/lib.rs`'s map lists them: each bullet of the map opens with the
/// module it describes, as in ``//! - [`base`]: ...``.
fn map_order(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|line| line.strip_prefix("//! - [`"))
        .filter_map(|rest| rest.split_once("`]"))
        .map(|(name, _)| name.to_owned())
        .collect()
}

/// The top-level modules `src/lib.rs` declares, but those declared for tests only.
fn declared_modules(lib: &str) -> BTreeSet<String> {
    let mut modules = BTreeSet::new();
    let mut test_only = false;
    for line in lib.lines().map(str::trim) {
        let declared = line
            .strip_prefix("pub mod ")
            .or_else(|| line.strip_prefix("mod "))
            .and_then(|rest| rest.strip_suffix(';'));
        if let Some(name) = declared
            && !test_only
        {
            modules.insert(name.to_owned());
        }
        test_only = line == "#[cfg(test)]";
    }
    modules
}

/// The code of a file as far as the layers go: no comment lines, nothing from the first
/// `#[cfg(test)]` on.
fn code_of(text: &str) -> String {
    let mut code = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            break;
        }
        if !trimmed.starts_with("//") {
            code.push_str(line);
            code.push('\n');
        }
    }
    code
}

/// An identifier at the start of `text`.
fn identifier(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The top-level modules `code` names: after `crate::`, and at the head of each path of a
/// `use crate::{...}` group.
fn named_modules(code: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        named.insert(identifier(&group[i..]).to_owned());
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            named.insert(identifier(rest).to_owned());
        }
    }
    named
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether a file holds tests only.
fn is_test_file(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n == "tests.rs" || n.ends_with("_tests.rs"))
}

#[test]
fn the_map_lists_every_module_once() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("src/lib.rs");
    let order = map_order(&lib);
    let listed: BTreeSet<String> = order.iter().cloned().collect();
    assert_eq!(
        listed.len(),
        order.len(),
        "a module listed twice: {order:?}"
    );
    assert_eq!(
        listed,
        declared_modules(&lib),
        "src/lib.rs's map must list every top-level module (and only those), from the ground up"
    );
}

#[test]
fn each_module_names_only_the_layers_below_it() {
    let src = src();
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs");
    let order = map_order(&lib);
    let layer = |module: &str| order.iter().position(|m| m == module);
    let mut upward = Vec::new();
    for (index, module) in order.iter().enumerate() {
        let mut files = Vec::new();
        let folder = src.join(module);
        if folder.is_dir() {
            rust_files(&folder, &mut files);
        } else {
            files.push(src.join(format!("{module}.rs")));
        }
        for file in files.iter().filter(|f| !is_test_file(f)) {
            let text = std::fs::read_to_string(file).expect("a source file");
            for named in named_modules(&code_of(&text)) {
                if let Some(other) = layer(&named)
                    && other >= index
                    && named != *module
                {
                    upward.push(format!(
                        "{}: names crate::{named}, which is not below {module} in src/lib.rs's map",
                        file.strip_prefix(&src).unwrap_or(file).display()
                    ));
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "modules naming a layer above (or beside) their own:\n{}",
        upward.join("\n")
    );
}

/// The reader finds what the layer check relies on, so that a check finding nothing means
/// nothing is there.
#[test]
fn the_reader_finds_paths_groups_and_skips_comments_and_tests() {
    let code = code_of(
        "use crate::base::wire;\n\
         use crate::{authn::User, forward::{Forwarder, cause}};\n\
         // crate::server is only in a comment\n\
         fn f() { crate::request::pipeline::run() }\n\
         #[cfg(test)]\n\
         mod tests { use crate::tools::demo; }\n",
    );
    let named: Vec<String> = named_modules(&code).into_iter().collect();
    assert_eq!(named, ["authn", "base", "forward", "request"]);
    let lib = "//! - [`base`]: ground\n//! - [`tls`]: next\n\
               pub mod base;\n#[cfg(test)]\nmod test_data;\npub mod tls;\n";
    assert_eq!(map_order(lib), ["base", "tls"]);
    assert_eq!(
        declared_modules(lib).into_iter().collect::<Vec<_>>(),
        ["base", "tls"]
    );
}

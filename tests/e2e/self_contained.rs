//! The repository stands on its own: no tracked file refers to a path outside it. A test that reads
//! a file beside the checkout passes on a developer's machine and fails for everyone who clones
//! the repository alone, so `cargo test` refuses such references before they land.
//!
//! A reference is a path with a `..` segment. Where it is resolved from:
//! - a relative path (`../x` in a Markdown link, a `#[path]`, a shell script, a Cargo manifest,
//!   a shell default such as `${DIR:-../x}`): the directory of the file that holds it, and for a
//!   script (`#!`) the root as well, where the repository's scripts run;
//! - a path appended to the manifest directory (in `concat!` or `join`), or its parent: the
//!   repository root;
//! - a path appended to a shell expansion (`$here/../x`, `$(dirname "$0")/..`): the directory of
//!   the script, which is where this repository's scripts point their variables.
//!
//! Any other absolute path with `..` (`/stats/../exec`) is a request path under test, not a file.

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The name of the manifest directory's variable, spelled in two pieces so that this file's own
/// mentions of it do not make its neighbouring examples look like references.
const MANIFEST_DIR: &str = concat!("CARGO_MANIFEST", "_DIR");

/// How far back a path's text is searched for [`MANIFEST_DIR`]: a `concat!` or `join` that
/// rustfmt split over a few lines.
const MANIFEST_DIR_WINDOW: usize = 200;

/// The one reference allowed to leave: CI's script may start the real API server beside the
/// checkout when there is one (its suites skip without it, so a lone clone still passes).
const ALLOWED: &[(&str, &str)] = &[(".ci/run", "shared/k8s")];

/// Whether `escape` in `file` is one of [`ALLOWED`].
fn allowed(file: &Path, escape: &Escape) -> bool {
    ALLOWED
        .iter()
        .any(|(f, target)| file == Path::new(f) && escape.reference.contains(target))
}

/// One reference that leaves the repository.
#[derive(Debug, PartialEq)]
struct Escape {
    line: usize,
    reference: String,
}

/// The tracked files, relative to the root: `git ls-files`, or, outside a git checkout (a source
/// tarball), every file below the root but build output and hidden directories.
fn tracked_files(root: &Path) -> Vec<PathBuf> {
    let listed = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root)
        .output();
    if let Ok(output) = listed
        && output.status.success()
    {
        return output
            .stdout
            .split(|b| *b == 0)
            .filter(|name| !name.is_empty())
            .map(|name| PathBuf::from(String::from_utf8_lossy(name).into_owned()))
            .collect();
    }
    let mut files = Vec::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(root.join(&dir))
            .unwrap_or_else(|e| panic!("listing {}: {e}", root.join(&dir).display()));
        for entry in entries {
            let entry = entry.unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
            let name = entry.file_name();
            let relative = dir.join(&name);
            let hidden_or_built = name.to_string_lossy().starts_with('.') || name == "target";
            match entry.file_type() {
                Ok(kind) if kind.is_dir() && !hidden_or_built => dirs.push(relative),
                Ok(kind) if kind.is_file() => files.push(relative),
                _ => {}
            }
        }
    }
    files
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '~' | '/')
}

/// Resolves `segments` from `base` (both relative to the root); `None` when they climb above it.
fn resolve(base: &Path, segments: &str) -> Option<()> {
    let mut depth = base.components().count();
    for segment in segments.split('/') {
        match segment {
            "" | "." => {}
            ".." => depth = depth.checked_sub(1)?,
            _ => depth += 1,
        }
    }
    Some(())
}

/// Every reference in `text` (the contents of the file at `file`, relative to the root) that
/// leaves the repository.
fn escapes(file: &Path, text: &str) -> Vec<Escape> {
    let dir = file.parent().unwrap_or(Path::new(""));
    let script = text.starts_with("#!");
    let mut found = Vec::new();
    // The end of the last path looked at: its other `..` segments are part of the same reference.
    let mut looked_at = 0;
    for (at, _) in text.match_indices("..") {
        if at < looked_at {
            continue;
        }
        let before = &text[..at];
        let after = &text[at + 2..];
        // Only a whole `..` segment: not `...`, `a..b` or a range. A shell default
        // (`${DIR:-../x}`) starts one too.
        let default_value = before.ends_with(":-");
        let segment_start = before.is_empty()
            || default_value
            || before.ends_with(|c: char| !is_path_char(c) || c == '/');
        let segment_end =
            after.is_empty() || after.starts_with(|c: char| !is_path_char(c) || c == '/');
        if !segment_start || !segment_end || before.ends_with('.') || after.starts_with('.') {
            continue;
        }
        let start = if default_value {
            at
        } else {
            before
                .char_indices()
                .rev()
                .take_while(|(_, c)| is_path_char(*c))
                .last()
                .map_or(at, |(i, _)| i)
        };
        let end = at
            + 2
            + after
                .find(|c: char| !is_path_char(c))
                .unwrap_or(after.len());
        let token = &text[start..end];
        looked_at = end;
        let lead = text[..start].chars().next_back();
        let window = &text[start.saturating_sub(MANIFEST_DIR_WINDOW)..start];
        let (base, segments) = if window.contains(MANIFEST_DIR) {
            (Path::new(""), token)
        } else if lead == Some('$') {
            // `$here/../x`: the variable's name is the first segment, the rest follows the script.
            (dir, token.split_once('/').map_or("", |(_, rest)| rest))
        } else if token.starts_with("..")
            || (token.starts_with('/') && matches!(lead, Some(')' | '}')))
        {
            // Relative to the file, or to a `$(…)`/`${…}` expansion in the script's directory.
            (dir, token)
        } else {
            continue;
        };
        // A script's relative paths follow its working directory, which this repository's
        // scripts set to the root (`cd "$(dirname "$0")/.."`): from there too they must stay.
        let from_root =
            script && token.starts_with("..") && resolve(Path::new(""), segments).is_none();
        if resolve(base, segments).is_none() || from_root {
            found.push(Escape {
                line: before.matches('\n').count() + 1,
                reference: token.to_owned(),
            });
        }
    }
    for (at, _) in text.match_indices(MANIFEST_DIR) {
        let next = &text[at..(at + MANIFEST_DIR_WINDOW).min(text.len())];
        if next.contains(".parent()") || next.contains(".ancestors()") {
            found.push(Escape {
                line: text[..at].matches('\n').count() + 1,
                reference: format!("the parent of {MANIFEST_DIR}"),
            });
        }
    }
    found
}

#[test]
fn no_tracked_file_refers_to_a_path_outside_the_repository() {
    let root = Path::new(ROOT);
    let files = tracked_files(root);
    assert!(
        files.iter().any(|f| f == Path::new("Cargo.toml")),
        "the file list of {ROOT} has no Cargo.toml: {} files",
        files.len()
    );
    let mut problems = Vec::new();
    for file in &files {
        // Binary files (fuzz corpora, DER fixtures) hold no paths to follow.
        let Ok(text) = std::fs::read_to_string(root.join(file)) else {
            continue;
        };
        for escape in escapes(file, &text) {
            if allowed(file, &escape) {
                continue;
            }
            problems.push(format!(
                "{}:{}: {}",
                file.display(),
                escape.line,
                escape.reference
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "files refer to paths outside the repository (a clone with nothing beside it cannot \
         follow them; make the data the project's own, e.g. under tests/data/):\n{}",
        problems.join("\n")
    );
}

/// The checker finds what the repository once had and leaves request paths and in-tree
/// references alone. The escaping paths are built at run time so this file passes its own check.
#[test]
fn the_checker_tells_references_that_leave_from_those_that_stay() {
    let up = |n: usize| "../".repeat(n);
    let leaving = [
        (
            "src/a.rs",
            format!(
                "concat!(\n    env!(\"{MANIFEST_DIR}\"),\n    \"/{}x/v.json\"\n)",
                up(1)
            ),
        ),
        ("README.md", format!("every vector of `{}x/v.json`", up(1))),
        ("docs/A.md", format!("[v]({}x/v.json)", up(2))),
        ("tests/e2e/a.rs", format!("#[path = \"{}x.rs\"]", up(3))),
        ("bench/run", format!("cat \"$here/{}x\"", up(2))),
        (
            ".ci/run",
            format!("#!/usr/bin/env bash\nk8s=${{K8S_DIR:-{}shared/k8s}}", up(1)),
        ),
        ("fuzz/Cargo.toml", format!("p = {{ path = \"{}\" }}", up(2))),
        (
            "tests/a.rs",
            format!("Path::new(env!(\"{MANIFEST_DIR}\")).parent().unwrap()"),
        ),
    ];
    for (file, text) in &leaving {
        let found = escapes(Path::new(file), text);
        assert_eq!(found.len(), 1, "{file}: {text:?} → {found:?}");
    }
    let staying = [
        ("tests/e2e/main.rs", "#[path = \"../support/mod.rs\"]"),
        ("docs/A.md", "[r](../bench/results/latest.json)"),
        ("fuzz/Cargo.toml", "p = { path = \"..\" }"),
        ("systemd/verify.sh", "x=${T:-$here/../target}"),
        (".ci/run", "cd \"$(dirname \"$0\")/..\""),
        (
            "tests/e2e/paths.rs",
            "h.get(\"/stats/../exec/a\"); (\"/../..//\", \"/\")",
        ),
        ("src/a.rs", "for i in 0..n { x[1..] } ... \"a..b\""),
    ];
    for (file, text) in staying {
        assert_eq!(escapes(Path::new(file), text), vec![], "{file}: {text:?}");
    }
}

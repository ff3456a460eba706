//! Records the commit the binary is built from, for `--version`: operators and bug reports need to
//! know exactly which code is running. `KUBELET_AUTH_PROXY_COMMIT` in the build environment wins
//! (builds from a source tree without `.git`, such as a container build); otherwise
//! `git rev-parse --short=12 HEAD`; `unknown` outside a git checkout.

use std::path::{Path, PathBuf};
use std::process::Command;

const VARIABLE: &str = "KUBELET_AUTH_PROXY_COMMIT";

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed={VARIABLE}");
    let commit = match std::env::var(VARIABLE) {
        Ok(given) if !given.trim().is_empty() => {
            let given = given.trim().to_owned();
            // The value lands in `--version` output and in rustc's environment: keep it to what a
            // commit name can be, so a stray newline or quote cannot garble either.
            if !given.chars().all(|c| c.is_ascii_alphanumeric()) {
                panic!("{VARIABLE}={given:?}: only letters and digits are allowed");
            }
            given
        }
        _ => from_git().unwrap_or_else(|| "unknown".to_owned()),
    };
    println!("cargo::rustc-env={VARIABLE}={commit}");
}

/// The short commit of HEAD, and re-run requests for the files that change when HEAD moves: HEAD
/// itself (checkouts), the branch it points to (commits) and packed-refs (`git gc`). In a worktree
/// these live in different directories, which `git rev-parse --git-path` resolves.
fn from_git() -> Option<String> {
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    let mut watched = vec![git_path("HEAD")?, git_path("packed-refs")?];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.extend(git_path(&branch));
    }
    // A path that does not exist would make cargo re-run this script on every build.
    for path in watched.iter().filter(|path| path.exists()) {
        println!("cargo::rerun-if-changed={}", path.display());
    }
    Some(commit)
}

fn git_path(name: &str) -> Option<PathBuf> {
    let path = PathBuf::from(git(&["rev-parse", "--git-path", name])?);
    // `--git-path` answers relative to the current directory (the manifest directory, where cargo
    // runs build scripts) unless it is elsewhere.
    Some(if path.is_absolute() {
        path
    } else {
        Path::new(&std::env::var_os("CARGO_MANIFEST_DIR")?).join(path)
    })
}

/// Runs git in the manifest directory; `None` when git is missing, fails, or says nothing.
fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}

//! Replays the checked-in fuzz corpus (`fuzz/corpus/<target>/`) and every past crasher
//! (`fuzz/regressions/<target>/`) through the fuzz targets' own bodies, on stable: the
//! invariants the fuzzers checked keep holding without nightly or cargo-fuzz.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

#[path = "../../fuzz/targets.rs"]
mod targets;

const FUZZ_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz");

/// Every input kept for `target`: its corpus, which must not be empty, then its regressions.
fn inputs(target: &str) -> Vec<PathBuf> {
    let list = |dir: &Path| -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = entries
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.is_file())
            .collect();
        files.sort();
        files
    };
    let corpus = list(&Path::new(FUZZ_DIR).join("corpus").join(target));
    assert!(!corpus.is_empty(), "no corpus for fuzz target {target}");
    let mut all = corpus;
    all.extend(list(&Path::new(FUZZ_DIR).join("regressions").join(target)));
    all
}

/// Runs every input of `target` through `body`, naming the input that fails.
fn replay(target: &str, body: fn(&[u8])) {
    for path in inputs(target) {
        let data = std::fs::read(&path).unwrap();
        if catch_unwind(AssertUnwindSafe(|| body(&data))).is_err() {
            panic!("fuzz target {target} fails on {}", path.display());
        }
    }
}

#[test]
fn path_to_attributes_corpus() {
    replay("path_to_attributes", targets::path_to_attributes);
}

#[test]
fn rbac_manifest_corpus() {
    replay("rbac_manifest", targets::rbac_manifest);
}

#[test]
fn config_files_corpus() {
    replay("config_files", targets::config_files);
}

#[test]
fn client_certificate_corpus() {
    replay("client_certificate", targets::client_certificate);
}

#[test]
fn token_review_response_corpus() {
    replay("token_review_response", targets::token_review_response);
}

#[test]
fn subject_access_review_response_corpus() {
    replay(
        "subject_access_review_response",
        targets::subject_access_review_response,
    );
}

//! The project's own test data under `tests/data/`, for unit tests: one loader, so a file that is
//! missing or malformed fails every test that needs it with the file named, never a bare
//! `NotFound`. The end-to-end tests load the same files through `tests/support`.

use std::path::PathBuf;

use serde::de::DeserializeOwned;

/// The kubelet attribute, RBAC rule and binding subject vectors (see the file's `about`).
pub(crate) const KUBELET_VECTORS: &str = "kubelet-vectors.json";

/// A cluster's RBAC as `kubectl get clusterrole,clusterrolebinding -o yaml` prints it (see the
/// file's header).
pub(crate) const RBAC_DUMP: &str = "rbac-dump.yaml";

/// A Policy authorizer file with several bindings, for the request decision and `explain` (see
/// the file's header).
pub(crate) const MONITORING_POLICY: &str = "monitoring-policy.yaml";

/// One `kubeletAttributes` case of [`KUBELET_VECTORS`]: what the kubelet derives for a request.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AttributeCase {
    pub(crate) method: String,
    pub(crate) path: String,
    /// The `KubeletFineGrainedAuthz` gate.
    pub(crate) fine_grained_authz: bool,
    /// The `--standalone-statusz-flagz` table.
    pub(crate) standalone_statusz_flagz: bool,
    pub(crate) verb: String,
    /// Tried in order.
    pub(crate) subresources: Vec<String>,
}

/// The `cases` of `group` in `tests/data/<file>`, each deserialized as `T`.
///
/// Panics naming the file (and the case) when it cannot be read or a case does not parse; a group
/// with no cases is a failure too, so an emptied file cannot make the tests pass vacuously.
pub(crate) fn cases<T: DeserializeOwned>(file: &str, group: &str) -> Vec<T> {
    let (path, text) = read(file);
    let shown = path.display();
    let all: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("test data {shown}: not JSON: {e}"));
    let rows = all[group]["cases"]
        .as_array()
        .unwrap_or_else(|| panic!("test data {shown}: no `{group}.cases` array"));
    assert!(
        !rows.is_empty(),
        "test data {shown}: `{group}` has no cases"
    );
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            T::deserialize(row)
                .unwrap_or_else(|e| panic!("test data {shown}: {group} case {i} ({row}): {e}"))
        })
        .collect()
}

/// The text of `tests/data/<file>`; panics naming the file when it cannot be read.
pub(crate) fn text(file: &str) -> String {
    read(file).1
}

/// The path and text of `tests/data/<file>`.
fn read(file: &str) -> (PathBuf, String) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("test data {}: cannot read it: {e}", path.display()));
    (path, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "tests/data/no-such-file.json: cannot read it")]
    fn a_missing_file_is_named() {
        cases::<serde_json::Value>("no-such-file.json", "anything");
    }

    #[test]
    #[should_panic(expected = "kubelet-vectors.json: no `noSuchGroup.cases` array")]
    fn a_missing_group_is_named() {
        cases::<serde_json::Value>(KUBELET_VECTORS, "noSuchGroup");
    }
}

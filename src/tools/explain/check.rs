//! `explain --check FILE`: a table of requests and the answers a policy must give them, checked in
//! one run, so a repository of policies can gate every change in CI. Each row is decided exactly
//! as `explain` decides one request (the server's own decision code); a row passes when the
//! request would be forwarded and `expect: allow`, or refused (403, 301, 400) and `expect: deny`.
//!
//! The file is YAML (or JSON), one mapping per row:
//!
//! ```yaml
//! apiVersion: kubelet-auth-proxy/v1alpha1
//! kind: PolicyCheck
//! rows:
//! - {user: prometheus, groups: [monitoring], method: GET, path: /metrics, expect: allow}
//! - {anonymous: true, method: GET, path: /pods, expect: deny}
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use http::Method;
use serde::{Deserialize, Serialize};

use super::render::printable;
use super::{EXIT_ALLOWED, EXIT_ERROR, EXIT_NOT_ALLOWED, OutputFormat, caller, explain, print};
use crate::config::file::read_text;
use crate::request::decision::Decider;
use crate::request::outcome::Outcome;

/// The flag the table comes from, for errors.
const FLAG: &str = "--check";
/// `kind` of the table.
const TABLE_KIND: &str = "PolicyCheck";
/// `kind` of the JSON report.
const REPORT_KIND: &str = "PolicyCheckReport";

/// The table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Table {
    api_version: String,
    kind: String,
    rows: Vec<Row>,
}

/// One row as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Row {
    /// A label for the report; the request is shown either way.
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    extra: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    anonymous: bool,
    method: String,
    path: String,
    expect: Expect,
}

/// The answer a row must get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
enum Expect {
    /// Forwarded to the kubelet.
    Allow,
    /// Refused by the proxy: 403, or 301/400 for a path the gate answers.
    Deny,
}

/// What one row got.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Checked {
    /// 1-based, in file order.
    row: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    user: String,
    method: String,
    path: String,
    expected: Expect,
    /// `forwarded`, `forbidden`, `redirect`, `badRequest` or `authorizationError`.
    outcome: Outcome,
    passed: bool,
    /// Who allowed, or the proxy's status code when refused.
    detail: String,
}

/// The JSON report.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    api_version: &'static str,
    kind: &'static str,
    passed: usize,
    failed: usize,
    errors: usize,
    rows: Vec<Checked>,
}

/// Reads `table`, decides every row with `decider`, prints the report and returns the exit
/// status: [`EXIT_ALLOWED`] when every row matched, [`EXIT_NOT_ALLOWED`] on any mismatch,
/// [`EXIT_ERROR`] for a bad table or when an authorizer could not decide a row.
pub(super) async fn run(decider: &Decider, table: &Path, output: OutputFormat) -> u8 {
    let rows = match read_rows(table) {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("kubelet-auth-proxy: {e}");
            return EXIT_ERROR;
        }
    };
    let mut checked = Vec::with_capacity(rows.len());
    let mut warned = false;
    for (index, (row, method)) in rows.into_iter().enumerate() {
        let user = caller(
            row.anonymous,
            row.user.as_deref().unwrap_or_default(),
            row.uid.as_deref().unwrap_or_default(),
            &row.groups,
            row.extra,
        );
        let explanation = explain(decider, &method, &row.path, &user).await;
        if !warned && output == OutputFormat::Text {
            explanation.print_warnings();
            warned = true;
        }
        let result = &explanation.result;
        let detail = match (result.status, explanation.attributes.last()) {
            (None, Some(trial)) => format!(
                "allowed on nodes/{} by {}",
                trial.subresource,
                trial.decided_by.unwrap_or_default()
            ),
            (None, None) => "allowed".to_owned(),
            (Some(status), _) => format!("{status}"),
        };
        let passed = match row.expect {
            Expect::Allow => result.allowed,
            Expect::Deny => !result.allowed && result.outcome != Outcome::AuthorizationError,
        };
        checked.push(Checked {
            row: index + 1,
            name: row.name,
            user: user.name,
            method: method.to_string(),
            path: row.path,
            expected: row.expect,
            outcome: result.outcome,
            passed,
            detail,
        });
    }
    let errors = checked
        .iter()
        .filter(|c| c.outcome == Outcome::AuthorizationError)
        .count();
    let failed = checked.iter().filter(|c| !c.passed).count();
    let report = Report {
        api_version: super::API_VERSION,
        kind: REPORT_KIND,
        passed: checked.len() - failed,
        failed,
        errors,
        rows: checked,
    };
    let status = if errors > 0 {
        EXIT_ERROR
    } else if failed > 0 {
        EXIT_NOT_ALLOWED
    } else {
        EXIT_ALLOWED
    };
    let document = match output {
        OutputFormat::Text => render_text(&report),
        // Strings, numbers and booleans only: serializing cannot fail.
        OutputFormat::Json => serde_json::to_string_pretty(&report).unwrap_or_default() + "\n",
    };
    print(&document, status)
}

/// The rows of `table`, each with its method parsed; a row that cannot be asked is an error
/// naming the file and the row.
fn read_rows(table: &Path) -> Result<Vec<(Row, Method)>, crate::ConfigError> {
    let text = read_text(FLAG, table)?;
    let options = serde_saphyr::options! { with_snippet: false };
    let table_doc: Table = serde_saphyr::from_str_with_options(&text, options).map_err(|e| {
        crate::ConfigError::File {
            flag: FLAG,
            path: table.to_owned(),
            // The first line: some errors carry a source snippet whatever the options say.
            reason: e.to_string().lines().next().unwrap_or_default().to_owned(),
            source: Some(Box::new(e)),
        }
    })?;
    if table_doc.api_version != super::API_VERSION || table_doc.kind != TABLE_KIND {
        return Err(crate::config::file_error(
            FLAG,
            table,
            format!(
                "expected apiVersion {:?} and kind {TABLE_KIND:?}, found {:?} and {:?}",
                super::API_VERSION,
                table_doc.api_version,
                table_doc.kind
            ),
        ));
    }
    let rows = table_doc.rows;
    if rows.is_empty() {
        return Err(crate::config::file_error(
            FLAG,
            table,
            "the table has no rows",
        ));
    }
    let mut parsed = Vec::with_capacity(rows.len());
    for (index, row) in rows.into_iter().enumerate() {
        let at = |reason: String| {
            crate::config::file_error(FLAG, table, format!("row {}: {reason}", index + 1))
        };
        match (&row.user, row.anonymous) {
            (Some(_), true) => return Err(at("give either `user` or `anonymous: true`".into())),
            (None, false) => return Err(at("`user` is required (or `anonymous: true`)".into())),
            _ => {}
        }
        if row.anonymous && (!row.groups.is_empty() || row.uid.is_some() || !row.extra.is_empty()) {
            return Err(at("`anonymous: true` takes no groups, uid or extra".into()));
        }
        let method = super::parse_method(&row.method).map_err(at)?;
        parsed.push((row, method));
    }
    Ok(parsed)
}

/// One line per row, then the totals.
fn render_text(report: &Report) -> String {
    let mut out = String::new();
    for row in &report.rows {
        let verdict = if row.passed { "PASS" } else { "FAIL" };
        let expected = match row.expected {
            Expect::Allow => "allow",
            Expect::Deny => "deny",
        };
        let got = if row.outcome == Outcome::Allowed {
            "allow"
        } else {
            "deny"
        };
        let got = match (row.outcome, row.passed) {
            (Outcome::AuthorizationError, _) => "error".to_owned(),
            (_, true) => got.to_owned(),
            (_, false) => format!("{got}, expected {expected}"),
        };
        let name = row
            .name
            .as_deref()
            .map(|n| format!(" ({})", printable(n)))
            .unwrap_or_default();
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "{verdict}  row {}{name}: {} {} {}: {got} ({})",
            row.row,
            printable(&row.user),
            row.method,
            printable(&row.path),
            row.detail
        );
    }
    let _ = writeln!(
        out,
        "{} rows: {} passed, {} failed{}",
        report.rows.len(),
        report.passed,
        report.failed,
        if report.errors > 0 {
            format!(
                " ({} could not be decided: an authorizer failed)",
                report.errors
            )
        } else {
            String::new()
        }
    );
    out
}

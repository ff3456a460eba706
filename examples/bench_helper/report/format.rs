//! How figures are written in the report: units, ratios against the reference, thousands
//! separators, and temporary directories named instead of spelled.

use std::path::Path;

use super::records::ratio;
use super::{CASES, Load, REFERENCE, Run};

pub(super) fn or_dash(value: Option<String>) -> String {
    value.unwrap_or_else(|| "–".to_owned())
}

pub(super) fn fmt_rps(v: Option<f64>) -> String {
    or_dash(v.map(|v| format!("{v:.0}")))
}

pub(super) fn fmt_ms(v: Option<f64>) -> String {
    or_dash(v.map(|ms| {
        if ms < 1.0 {
            format!("{:.0} µs", ms * 1e3)
        } else if ms < 100.0 {
            format!("{ms:.2} ms")
        } else {
            format!("{ms:.0} ms")
        }
    }))
}

pub(super) fn fmt_pct(v: Option<f64>) -> String {
    or_dash(v.map(|r| format!("{:.0}%", r * 100.0)))
}

pub(super) fn fmt_us(v: Option<f64>) -> String {
    or_dash(v.map(|us| format!("{us:.1} µs")))
}

pub(super) fn fmt_kib(v: Option<u64>) -> String {
    or_dash(v.map(|k| {
        if k >= 10 * 1024 {
            format!("{:.1} MiB", k as f64 / 1024.0)
        } else {
            format!("{k} KiB")
        }
    }))
}

/// One figure of `proxy` against the nginx reference in every load case a–e: the figures, and
/// whether `met` holds for the ratio in every case.
pub(super) fn against_reference(
    run: &Run,
    proxy: &str,
    figure: fn(&Load) -> Option<f64>,
    fmt: fn(Option<f64>) -> String,
    met: fn(f64) -> bool,
) -> (String, Option<bool>) {
    let mut figures = Vec::new();
    let mut all = Some(true);
    for (case, _, _) in &CASES[..5] {
        let value = |t: &str| run.load(case, t).and_then(figure);
        let r = ratio(value(proxy), value(REFERENCE));
        figures.push(format!(
            "{}: {} vs {} ({})",
            &case[..1],
            fmt(value(proxy)),
            fmt(value(REFERENCE)),
            fmt_times(r)
        ));
        all = all_of(all, r.map(met));
    }
    (figures.join("; "), all)
}

/// A ratio as `0.87×`.
pub(super) fn fmt_times(r: Option<f64>) -> String {
    or_dash(r.map(|r| format!("{r:.2}×")))
}

/// Whether a target met so far stays met with one more figure; unknown once a figure is.
pub(super) fn all_of(so_far: Option<bool>, this: Option<bool>) -> Option<bool> {
    so_far.zip(this).map(|(a, b)| a && b)
}

pub(super) fn yes_no(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "not measured",
    }
}

/// Figures with a thousands separator: 152,340.
pub(super) fn fmt_count(v: Option<f64>) -> String {
    or_dash(v.map(|v| {
        let digits = format!("{:.0}", v.round());
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    }))
}

pub(super) fn fmt_per_request(v: Option<f64>) -> String {
    or_dash(v.map(|v| format!("{v:.2}")))
}

/// `s` with the run's temporary directories named, not spelled: the work directory as `$WORK`,
/// the stand-in API server's (where its kubeconfig lies) as `$APISERVER`, so the report holds no
/// path of the machine it ran on.
pub(super) fn hide_paths(s: &str, work_dir: &Path) -> String {
    const APISERVER_DIR: &str = "/kap-e2e-";
    let mut out = s.replace(&work_dir.display().to_string(), "$WORK");
    while let Some(start) = out.find(APISERVER_DIR) {
        let dir_start = out[..start].rfind(['=', ' ']).map_or(0, |i| i + 1);
        let dir_end = out[start + 1..]
            .find('/')
            .map_or(out.len(), |i| start + 1 + i);
        out.replace_range(dir_start..dir_end, "$APISERVER");
    }
    out
}

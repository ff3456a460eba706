//! Section 5 of the report: instructions (callgrind), context switches and syscalls per
//! request, per open connection and per connection, against the nginx reference.

use std::fmt::Write as _;

use super::format::{fmt_count, fmt_per_request, fmt_times, or_dash};
use super::records::ratio;
use super::{Det, REFERENCE, Run};

/// Section 5: instructions, context switches and syscalls per request.
pub(super) fn deterministic_markdown(w: &mut String, run: &Run, meta: &dyn Fn(&str) -> String) {
    let _ = writeln!(
        w,
        "## 5. Counted per request: instructions, context switches, syscalls\n"
    );
    let _ = writeln!(
        w,
        "Counts that do not depend on how busy the machine is, for the requests of cases (a) \
         (x509) and (b) (warm token): `GET /healthz`, 1 KiB, keep-alive, HTTP/1.1, with oha \
         `-n {n} -c C`, after an unmeasured `-n {warm} -c C` on a freshly started target \
         (section run: {secs} s). Each figure is a total over the {n} measured requests divided \
         by the responses.\n\n\
         - **Instructions** (Ir): the target runs under `valgrind --tool=callgrind` ({valgrind}); \
         after the warm-up `callgrind_control -z` zeroes its counters, the measured requests \
         run, `callgrind_control -d` dumps, and the dump's `totals:` is divided by the \
         responses. All threads are counted (callgrind runs them one at a time). The C TLS \
         handshakes of the measured run are included (oha opens its connections anew), so \
         per-request figures at 64 connections carry 64 handshakes spread over {n} requests.\n\
         - **Context switches**: the target started again without valgrind, warmed up the same \
         way; `voluntary_ctxt_switches` and `nonvoluntary_ctxt_switches` summed over \
         `/proc/<pid>/task/*/status` before and after {n} requests. Threads that end in between \
         take their counts with them (none should: the proxy's runtime threads live as long as \
         it does).\n\
         - **Syscalls**: on that same process, a further {n} requests with {tool} attached to \
         every thread (`{how}`); counted from attaching to detaching, so the idle second around \
         the run is included.\n\
         - **The nginx reference** runs as one process here (`master_process off; \
         worker_processes 1;`, otherwise the configuration below): the process that serves is \
         the one callgrind runs and the one counted, without a fork to follow \
         (`--trace-children`) or a master's counts to add. The proxy runs as it always does \
         (one process: a serving thread per core, each with its own event loop and kubelet \
         connections, and the main runtime that accepts and hands connections to them).\n",
        n = meta("det_requests"),
        warm = meta("det_warmup"),
        secs = meta("det_wall_s"),
        valgrind = meta("valgrind"),
        tool = meta("syscall_tool_version"),
        how = match meta("syscall_tool").as_str() {
            "perf" => "perf stat -e raw_syscalls:sys_enter -p PID",
            _ => "strace -c -f -p PID",
        },
    );
    let setups = [("x509", "x509"), ("token", "warm token")];
    let mut connections: Vec<u64> = run.dets.iter().map(|d| d.connections).collect();
    connections.sort_unstable();
    connections.dedup();
    let proxies = run.proxies();
    let targets: Vec<&str> = proxies.iter().copied().chain([REFERENCE]).collect();
    // A row for each case and connection count `row` has cells for, in the order of `setups` and
    // `connections`.
    let rows = |w: &mut String, row: &dyn Fn(&str, u64) -> Option<String>| {
        for (setup, title) in setups {
            for c in &connections {
                if let Some(cells) = row(setup, *c) {
                    let _ = writeln!(w, "| {title} | {c} |{cells}");
                }
            }
        }
    };
    let named = |names: &[&str], suffix: &str| -> Vec<String> {
        names.iter().map(|t| format!("{t}{suffix}")).collect()
    };

    let _ = writeln!(w, "### Instructions per request\n");
    table_head(
        w,
        &[named(&targets, ""), named(&proxies, " ÷ nginx")].concat(),
    );
    rows(w, &|setup, c| {
        let nginx = run.det(setup, c, REFERENCE)?.instructions_per_request();
        let ir = |p: &str| run.det(setup, c, p).and_then(Det::instructions_per_request);
        let figures = proxies.iter().map(|p| fmt_count(ir(p)));
        let ratios = proxies.iter().map(|p| fmt_times(ratio(ir(p), nginx)));
        Some(cells(figures.chain([fmt_count(nginx)]).chain(ratios)))
    });

    let _ = writeln!(
        w,
        "\n### Instructions per request on an open connection, and per connection\n\n\
         The figures above, split: *per request* is (Ir of the {n}-request run − Ir of a \
         {short}-request run just before it, same process, same connection count, counters \
         zeroed in between) ÷ the difference in responses, so the handshakes, equal in both, \
         cancel out. *Per connection* is what is left of the {n}-request run's Ir per connection \
         opened: the TLS handshake with client certificate, accepting and closing.\n",
        n = meta("det_requests"),
        short = meta("det_requests")
            .parse::<u64>()
            .map(|n| (n / 5).to_string())
            .unwrap_or_default(),
    );
    let columns = [
        named(&targets, ": per request"),
        named(&proxies, " ÷ nginx"),
        named(&targets, ": per connection"),
    ];
    table_head(w, &columns.concat());
    rows(w, &|setup, c| {
        let nginx = run
            .det(setup, c, REFERENCE)?
            .marginal_instructions_per_request();
        let ir = |t: &str| {
            run.det(setup, c, t)
                .and_then(Det::marginal_instructions_per_request)
        };
        let per_connection = |t: &str| {
            run.det(setup, c, t)
                .and_then(Det::instructions_per_connection)
        };
        let figures = targets.iter().map(|t| fmt_count(ir(t)));
        let ratios = proxies.iter().map(|p| fmt_times(ratio(ir(p), nginx)));
        let per_connections = targets.iter().map(|t| fmt_count(per_connection(t)));
        Some(cells(figures.chain(ratios).chain(per_connections)))
    });

    let _ = writeln!(
        w,
        "\n### Context switches and syscalls per request\n\n\
         *Switches*: voluntary + nonvoluntary, per request.\n"
    );
    let columns: Vec<[String; 2]> = targets
        .iter()
        .map(|t| [format!("{t}: switches"), format!("{t}: syscalls")])
        .collect();
    table_head(w, &columns.concat());
    rows(w, &|setup, c| {
        let dets: Vec<Option<&Det>> = targets.iter().map(|t| run.det(setup, c, t)).collect();
        dets.iter().any(Option::is_some).then(|| {
            dets.iter()
                .map(|det| match det {
                    Some(d) => format!(
                        " {} + {} | {} |",
                        fmt_per_request(d.voluntary_per_request()),
                        fmt_per_request(d.nonvoluntary_per_request()),
                        fmt_per_request(d.syscalls_per_request())
                    ),
                    None => " | |".to_owned(),
                })
                .collect()
        })
    });

    let mut notes = Vec::new();
    for d in &run.dets {
        let label = format!("{}, {}, {} connection(s)", d.target, d.setup, d.connections);
        if d.status != "ok" {
            notes.push(format!("{label}: {}", d.status));
        }
        for (what, a) in [
            ("callgrind", d.cg),
            ("short callgrind", d.cg_short),
            ("switches", d.ctx),
            ("syscalls", d.sys),
        ] {
            if a.failed > 0 || a.responses == 0 {
                notes.push(format!(
                    "{label}, {what} run: {} responses, {} failed",
                    a.responses, a.failed
                ));
            }
        }
        if d.setup == "token" && d.target != REFERENCE {
            match (d.token_reviews, d.access_reviews) {
                (Some(0), Some(0)) => {}
                (t, s) => notes.push(format!(
                    "{label}: the stand-in API server got {} TokenReviews and {} SARs during \
                     the run under callgrind (expected none: warm caches)",
                    or_dash(t.map(|v| v.to_string())),
                    or_dash(s.map(|v| v.to_string()))
                )),
            }
        }
    }
    if notes.is_empty() {
        let _ = writeln!(
            w,
            "\nEvery measured request got a 200, and in the token case the stand-in API server \
             received no review during the measured requests: the token and the decision came \
             from the caches.\n"
        );
    } else {
        let _ = writeln!(w, "\nNotes:\n");
        for n in notes {
            let _ = writeln!(w, "- {n}");
        }
        let _ = writeln!(w);
    }
}

/// The head of a table whose rows are a case and a connection count, then `columns` of figures.
fn table_head(w: &mut String, columns: &[String]) {
    let rule = "---:|".repeat(columns.len());
    let _ = writeln!(
        w,
        "| Case | Connections |{}\n|---|---:|{rule}",
        cells(columns.iter())
    );
}

/// Table cells after the first, each ` value |`.
fn cells(values: impl IntoIterator<Item = impl std::fmt::Display>) -> String {
    values.into_iter().map(|v| format!(" {v} |")).collect()
}

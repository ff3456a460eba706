//! `bench/results/latest.json`: every figure of the run in machine-readable form, with the
//! temporary directories named as in the report.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use super::format::hide_paths;
use super::goals::goals;
use super::records::ratio;
use super::streams::streams_json;
use super::{DIRECT, Det, REFERENCE, Run};

pub(super) fn results_json(run: &Run, work_dir: &Path) -> Value {
    let hide = |s: &str| hide_paths(s, work_dir);
    let loads: Vec<Value> = run
        .loads
        .iter()
        .map(|l| {
            let direct = run.load(&l.case, DIRECT).and_then(|d| d.rps);
            json!({
                "case": l.case,
                "target": l.target,
                "status": l.status,
                "requests": l.requests,
                "failed": l.errors,
                "requestsPerSec": l.rps,
                "p50Ms": l.p50_ms,
                "p99Ms": l.p99_ms,
                "ratioToDirect": ratio(l.rps, direct),
                "cpuMicrosPerRequest": l.cpu_us_per_request,
                "peakRssKib": l.peak_rss_kib,
                "upstreamConnectionsOpened": l.upstream_connections,
                "rounds": l.rounds,
            })
        })
        .collect();
    let streams = streams_json(run);
    let conns: Vec<Value> = run
        .targets()
        .iter()
        .filter(|t| !run.conn_steps(t).is_empty())
        .map(|t| {
            let steps: Vec<Value> = run
                .conn_steps(t)
                .iter()
                .map(|c| {
                    json!({
                        "idleConnections": c.idle,
                        "status": c.status,
                        "established": c.established,
                        "rssKib": c.rss_kib,
                        "peakRssKib": c.hwm_kib,
                    })
                })
                .collect();
            json!({
                "target": t,
                "perConnectionKib": run.per_connection_kib(t),
                "steps": steps,
            })
        })
        .collect();
    let bursts: Vec<Value> = run
        .bursts
        .iter()
        .map(|b| {
            json!({
                "target": b.target,
                "tokens": b.kind,
                "status": b.status,
                "tokenReviews": b.token_reviews,
                "subjectAccessReviews": b.access_reviews,
                "summary": b.summary,
            })
        })
        .collect();
    let dets: Vec<Value> = run
        .dets
        .iter()
        .map(|d| {
            let nginx = run
                .det(&d.setup, d.connections, REFERENCE)
                .and_then(Det::instructions_per_request);
            json!({
                "case": d.setup,
                "connections": d.connections,
                "target": d.target,
                "status": d.status,
                "instructionsPerRequest": d.instructions_per_request(),
                "ratioToReference": ratio(d.instructions_per_request(), nginx),
                "instructionsPerRequestOnOpenConnection": d.marginal_instructions_per_request(),
                "instructionsPerConnection": d.instructions_per_connection(),
                "voluntarySwitchesPerRequest": d.voluntary_per_request(),
                "nonvoluntarySwitchesPerRequest": d.nonvoluntary_per_request(),
                "syscallsPerRequest": d.syscalls_per_request(),
                "callgrind": {
                    "instructions": d.instructions,
                    "responses": d.cg.responses,
                    "failed": d.cg.failed,
                    "shortRunInstructions": d.instructions_short,
                    "shortRunResponses": d.cg_short.responses,
                    "shortRunFailed": d.cg_short.failed,
                    "tokenReviews": d.token_reviews,
                    "subjectAccessReviews": d.access_reviews,
                },
                "switches": {
                    "voluntary": d.voluntary,
                    "nonvoluntary": d.nonvoluntary,
                    "responses": d.ctx.responses,
                    "failed": d.ctx.failed,
                },
                "syscalls": {
                    "calls": d.syscalls,
                    "responses": d.sys.responses,
                    "failed": d.sys.failed,
                },
            })
        })
        .collect();
    let goals: Vec<Value> = goals(run)
        .into_iter()
        .map(|g| json!({"proxy": g.proxy, "target": g.target, "figure": g.figure, "met": g.met}))
        .collect();
    let proxies: BTreeMap<&str, String> = run
        .proxies
        .iter()
        .map(|(l, t)| (l.as_str(), hide(t)))
        .collect();
    let meta: BTreeMap<&str, String> = run
        .meta
        .iter()
        .map(|(k, v)| (k.as_str(), hide(v)))
        .collect();
    json!({
        "meta": meta,
        "proxies": proxies,
        "targets": goals,
        "requests": loads,
        "streaming": streams,
        "connections": conns,
        "bursts": bursts,
        "deterministic": dets,
    })
}

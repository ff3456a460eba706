//! The promise of one admission point for audit bytes, as a property over every class of audit
//! traffic known: whatever one identity sends (refused, allowed, acting, oversized or
//! unauthenticated requests, 15 KB each or more), an exec another identity made before stays in
//! the kept files, and the flooder's own reads of node logs are never invisible: at least one is
//! written (refused before authentication, nothing is read: its events are summarized). An identity that floods acts is refused with 429 and `Retry-After` before the kubelet
//! sees them, counted and summarized, while an identity acting at an ordinary rate meanwhile is
//! served. A new class of traffic is one line in [`CLASSES`].

use std::path::Path;

use http::StatusCode;

use crate::audit_bounds::events;
use crate::support::TempDir;
use crate::support::client::{Client, empty, request};
use crate::support::eventually;
use crate::support::harness::{Harness, ProxySpec, Subject, grant};
use crate::support::streams::{EXEC_PROTOCOL, ExecSession};

const ACTS_REFUSED: &str = "kubelet_auth_proxy_audit_acts_refused_total";
/// Requests of the flooding identity.
const FLOOD: usize = 120;

/// What the flooder sends: the path (with its query) and whether it authenticates.
struct Class {
    name: &'static str,
    target: fn() -> String,
    /// The flooder's certificate (`false`: no credential, refused before authentication).
    authenticated: bool,
    /// The requests act, so past the flooder's share they are refused with 429.
    acts: bool,
}

fn long_query() -> String {
    "a".repeat(15_000)
}

/// Every class of audit traffic known, one identity sending each.
const CLASSES: &[Class] = &[
    Class {
        name: "refused (403), long URIs",
        target: || format!("/configz?q={}", long_query()),
        authenticated: true,
        acts: false,
    },
    Class {
        name: "allowed reads, long URIs",
        target: || format!("/pods?q={}", long_query()),
        authenticated: true,
        acts: false,
    },
    Class {
        name: "allowed acts without an upgrade, 15 KB commands",
        target: || format!("/exec/tenant/pod/ctr?command={}", long_query()),
        authenticated: true,
        acts: true,
    },
    Class {
        name: "oversized reads (cut to the event bound)",
        target: || format!("/pods?q={}", "b".repeat(60_000)),
        authenticated: true,
        acts: false,
    },
    Class {
        name: "unauthenticated, long URIs",
        target: || format!("/pods?q={}", long_query()),
        authenticated: false,
        acts: false,
    },
];

/// A proxy keeping 1 MiB of audit files for an hour under any flood; the admin and the tenant
/// may exec, read logs and pods; nobody may read `configz`.
async fn proxy(dir: &Path) -> Harness {
    let log = dir.join("audit.log");
    ProxySpec::new(&[
        "--authorization-mode=Policy",
        &format!("--audit-log-path={}", log.display()),
        "--audit-log-maxsize=1",
        "--audit-log-maxbackup=1",
        "--audit-log-flood-retention=1h",
    ])
    .policy(&grant(
        "everyone",
        &["nodes/proxy", "nodes/log"],
        &["get", "create"],
        &[
            Subject::User("admin"),
            Subject::User("tenant"),
            Subject::User("bob"),
        ],
    ))
    .start()
    .await
}

/// Opens an exec as `client` and closes it; returns its audit ID.
async fn exec(client: &Client) -> String {
    let session = ExecSession::open(client, EXEC_PROTOCOL).await;
    let id = session.headers["audit-id"].to_str().unwrap().to_owned();
    session.close().await;
    id
}

#[tokio::test]
async fn no_identity_erases_another_ones_record_or_hides_its_own() {
    for class in CLASSES {
        let name = class.name;
        let dir = TempDir::new("audit-admission");
        let h = proxy(dir.path()).await;
        let admin = h.http1_user("admin");
        let id = exec(&admin).await;
        eventually("the admin's exec written", || async {
            (events(dir.path())
                .iter()
                .filter(|e| e["auditID"] == id.as_str())
                .count()
                == 2)
                .then_some(())
        })
        .await;

        let tenant = if class.authenticated {
            h.user("tenant", &[])
        } else {
            h.anonymous()
        };
        let mut conn = tenant.connect().await.unwrap();
        let mut throttled = 0;
        for _ in 0..FLOOD {
            let response = conn
                .send(request("GET", &(class.target)()).body(empty()).unwrap())
                .await
                .unwrap();
            if response.status() == StatusCode::TOO_MANY_REQUESTS {
                let retry_after: u64 = response.headers()["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!(retry_after >= 1, "{name}");
                throttled += 1;
            }
        }
        if class.acts {
            assert!(throttled > 0, "{name}: acts past the share are refused");
            assert_eq!(
                h.metric(ACTS_REFUSED, &[]).await,
                throttled as f64,
                "{name}"
            );
            // Another identity acting at an ordinary rate is served meanwhile.
            let bob = h.http1_user("bob");
            let session = ExecSession::open(&bob, EXEC_PROTOCOL).await;
            session.close().await;
        } else {
            assert_eq!(
                throttled, 0,
                "{name}: reads are never refused, only not written"
            );
        }
        // The flooder's reads of logs are never invisible.
        for _ in 0..6 {
            let reply = tenant.get("/logs/messages").await;
            assert_ne!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{name}");
        }
        h.shutdown().await;

        let all = events(dir.path());
        assert_eq!(
            all.iter().filter(|e| e["auditID"] == id.as_str()).count(),
            2,
            "{name}: the admin's exec is still in the kept files"
        );
        let logs = all
            .iter()
            .filter(|e| e["requestURI"] == "/logs/messages")
            .count();
        if class.authenticated {
            assert!(logs >= 1, "{name}: the flooder's reads of logs are seen");
        } else {
            // Refused before authentication, nothing was read; what was not written is
            // summarized for the unauthenticated identity.
            assert!(
                all.iter().any(|e| {
                    e["annotations"]["kubelet-auth-proxy.io/suppressed-identity"]
                        == "(unauthenticated)"
                }),
                "{name}: summarized"
            );
        }
        if class.acts {
            let summarized: u64 = all
                .iter()
                .filter_map(|e| e["annotations"]["kubelet-auth-proxy.io/acts-refused"].as_str())
                .map(|n| n.parse::<u64>().unwrap())
                .sum();
            assert_eq!(
                summarized, throttled as u64,
                "{name}: every refused act summarized"
            );
        }
    }
}

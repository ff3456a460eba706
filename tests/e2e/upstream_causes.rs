//! When the kubelet cannot be reached, the proxy says why: each cause (unknown CA, name mismatch,
//! the kubelet rejecting the proxy's client certificate, connection refused) is logged at the
//! default level with a hint naming the flag, and counted by cause. Real TLS on loopback against
//! the stand-in kubelet, the binary run as operators run it.

use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use kubelet_auth_proxy::tools::demo::kubelet::StandInKubelet;

use crate::support::client::{H2_AND_HTTP1, plain_get};
use crate::support::harness::{NODE_NAME, kubelet_tls};
use crate::support::pki::{Authority, CertSpec};
use crate::support::process::{ProcessSpec, run};
use crate::support::{eventually, within};

/// Starts a stand-in kubelet serving HTTPS with a certificate of `ca` for `spec`, and requiring
/// client certificates of `client_ca` when given; returns it with its `https://` URL.
async fn https_kubelet(
    ca: &Authority,
    spec: &CertSpec,
    client_ca: Option<&Authority>,
) -> (StandInKubelet, String) {
    let tls = kubelet_tls(&ca.issue(spec), client_ca);
    let kubelet = within(
        "starting the stand-in kubelet",
        StandInKubelet::start(Some(tls)),
    )
    .await
    .unwrap();
    let url = format!("https://{}", kubelet.addr().unwrap());
    (kubelet, url)
}

/// Starts the binary from `spec`, sends one request, and returns its status, the log and the
/// metrics.
async fn one_request(spec: ProcessSpec) -> Outcome {
    let site = spec.prepare().await;
    let proxy = site.start("proxy", &[]).await;
    let alice = site.client(proxy.addr(), "alice", H2_AND_HTTP1);
    let status = alice.get("/pods").await.status;
    let metrics = plain_get(proxy.admin_addr(), "/metrics").await.text();
    let log = eventually("the cause in the log", || {
        let log = proxy.stderr();
        let found = log.contains("cannot reach the kubelet");
        async move { found.then_some(log) }
    })
    .await;
    Outcome {
        status,
        log,
        metrics,
    }
}

/// `spec` trusting `kubelet_ca` for the kubelet and presenting a client certificate of
/// `client_ca` (`proxy-client.crt` and `.key`) to it.
fn with_upstream_client(
    spec: ProcessSpec,
    kubelet_ca: &Authority,
    client_ca: &Authority,
) -> ProcessSpec {
    let client = client_ca.issue(&CertSpec::client("proxy"));
    spec.config_file("upstreamCaFile", "upstream-ca.crt", kubelet_ca.pem())
        .config_file(
            "upstreamClientCertFile",
            "proxy-client.crt",
            client.chain_pem(),
        )
        .config_file(
            "upstreamClientKeyFile",
            "proxy-client.key",
            client.key_pem(),
        )
}

struct Outcome {
    status: StatusCode,
    log: String,
    metrics: String,
}

impl Outcome {
    fn assert_cause(&self, label: &str, words: &[&str]) {
        assert_eq!(self.status, StatusCode::BAD_GATEWAY);
        for word in words {
            assert!(
                self.log.contains(word),
                "{word:?} not in the log:\n{}",
                self.log
            );
        }
        let counter = format!("kubelet_auth_proxy_upstream_errors_total{{cause=\"{label}\"}} 1");
        assert!(
            self.metrics.contains(&counter),
            "{counter} not in:\n{}",
            self.metrics
        );
    }
}

#[tokio::test]
async fn each_upstream_failure_is_logged_with_its_cause_and_a_hint() {
    let kubelet_ca = Authority::root("kubelet CA");
    let other_ca = Authority::root("other CA");
    let (_kubelet, https) = https_kubelet(&kubelet_ca, &CertSpec::server(), None).await;

    let outcome = one_request(ProcessSpec::new("unknown-ca").upstream(&https).config_file(
        "upstreamCaFile",
        "upstream-ca.crt",
        other_ca.pem(),
    ))
    .await;
    outcome.assert_cause(
        "unknown_ca",
        &[
            "unknown CA",
            "--upstream-ca-file",
            "\"cause\":\"unknown_ca\"",
        ],
    );

    let outcome = one_request(
        ProcessSpec::new("name-mismatch")
            .upstream(&https)
            .config_file("upstreamCaFile", "upstream-ca.crt", kubelet_ca.pem())
            .config("upstreamServerName: kubelet.example\n"),
    )
    .await;
    outcome.assert_cause(
        "name_mismatch",
        &[
            "name mismatch",
            "want kubelet.example",
            "127.0.0.1",
            "--upstream-server-name",
        ],
    );

    let (_strict, strict_https) =
        https_kubelet(&kubelet_ca, &CertSpec::server(), Some(&kubelet_ca)).await;
    let outcome = one_request(with_upstream_client(
        ProcessSpec::new("client-rejected").upstream(&strict_https),
        &kubelet_ca,
        &other_ca,
    ))
    .await;
    outcome.assert_cause(
        "client_certificate_rejected",
        &[
            "the kubelet rejected our client certificate",
            "clientCAFile",
        ],
    );

    let outcome = one_request(ProcessSpec::new("refused").upstream("http://127.0.0.1:1")).await;
    outcome.assert_cause("connection_refused", &["connection refused", "--upstream"]);
}

/// The kubelet's own certificate names the node, not 127.0.0.1: without
/// `--upstream-server-name`, a loopback upstream is also accepted for the node's name, and only
/// for it.
/// A kubelet response head that does not fit the proxy's upstream read buffer (64 KiB) is a 502
/// whose logged cause says so. The head is 200 KiB: hyper checks the size when a head is still
/// incomplete after a read, and one read cannot take a head that large past the limit at once.
#[tokio::test]
async fn a_response_head_over_64_kib_is_named() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buffer = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let big = "a".repeat(200 * 1024);
                let answer =
                    format!("HTTP/1.1 200 OK\r\ncontent-length: 0\r\nx-big: {big}\r\n\r\n");
                let _ = tcp.write_all(answer.as_bytes()).await;
                // Held open until the proxy gives up on it.
                let _ = tcp.read(&mut buffer).await;
            });
        }
    });
    let outcome = one_request(ProcessSpec::new("head-too-large").upstream(&upstream)).await;
    outcome.assert_cause(
        "protocol",
        &[
            "response head is larger than 64 KiB",
            "\"cause\":\"protocol\"",
        ],
    );
}

#[tokio::test]
async fn a_loopback_kubelet_certified_for_the_node_name_needs_no_server_name() {
    let kubelet_ca = Authority::root("node name CA");
    for (names, node_name) in [(&["other-node"][..], false), (&[NODE_NAME][..], true)] {
        let (_kubelet, upstream) =
            https_kubelet(&kubelet_ca, &CertSpec::server().names(names), None).await;
        let site = ProcessSpec::new("node-name")
            .upstream(&upstream)
            .config_file("upstreamCaFile", "upstream-ca.crt", kubelet_ca.pem())
            .prepare()
            .await;
        let proxy = site.start("proxy", &[]).await;
        let alice = site.client(proxy.addr(), "alice", H2_AND_HTTP1);
        let status = alice.get("/pods").await.status;
        if node_name {
            assert_eq!(status, StatusCode::OK, "{}", proxy.stderr());
        } else {
            assert_eq!(status, StatusCode::BAD_GATEWAY);
            let log = eventually("the cause in the log", || {
                let log = proxy.stderr();
                let found = log.contains("name mismatch");
                async move { found.then_some(log) }
            })
            .await;
            assert!(log.contains(&format!("want {NODE_NAME}")), "{log}");
        }
    }
}

/// `check-config --probe` reaches the kubelet as the proxy would and names the cause when it
/// cannot: here a kubelet that answers, and one whose certificate another CA issued.
#[tokio::test]
async fn check_config_probe_reaches_the_kubelet_or_names_the_cause() {
    let kubelet_ca = Authority::root("probe kubelet CA");
    let other_ca = Authority::root("probe other CA");
    let (_kubelet, https) = https_kubelet(&kubelet_ca, &CertSpec::server(), None).await;
    for (label, ca, status, words) in [
        (
            "good",
            &kubelet_ca,
            0,
            "the kubelet answered GET /healthz with 200",
        ),
        ("unknown-ca", &other_ca, 2, "--upstream: probe: unknown CA"),
    ] {
        let site = ProcessSpec::new(&format!("probe-{label}"))
            .upstream(&https)
            .config_file("upstreamCaFile", "upstream-ca.crt", ca.pem())
            .prepare()
            .await;
        let check = ["check-config".to_owned(), "--probe".to_owned()];
        let done = run(
            &site.dir,
            "probe",
            &[&check[..], &site.command_line(&[])].concat(),
        )
        .await;
        assert_eq!(done.status.code(), Some(status), "{label}: {}", done.stderr);
        let output = format!("{}{}", done.stdout, done.stderr);
        assert!(output.contains(words), "{label}: {output}");
    }
}

/// The proxy's client certificate towards the kubelet is reloaded like the serving certificate:
/// an operator who gave it a certificate the kubelet rejects fixes the files, and the next
/// connection to the kubelet uses the new pair, without a restart.
#[tokio::test]
async fn a_replaced_upstream_client_certificate_is_used_for_new_kubelet_connections() {
    let kubelet_ca = Authority::root("kubelet CA");
    let other_ca = Authority::root("some other CA");
    let (_kubelet, upstream) =
        https_kubelet(&kubelet_ca, &CertSpec::server(), Some(&kubelet_ca)).await;
    let site = with_upstream_client(
        ProcessSpec::new("upstream-client-reload").upstream(&upstream),
        &kubelet_ca,
        &other_ca,
    )
    .prepare()
    .await;
    let (cert, key) = (
        site.dir.path().join("proxy-client.crt"),
        site.dir.path().join("proxy-client.key"),
    );
    let proxy = site.start("proxy", &[]).await;
    let alice = site.client(proxy.addr(), "alice", H2_AND_HTTP1);
    assert_eq!(alice.get("/pods").await.status, StatusCode::BAD_GATEWAY);

    // The key first, then the certificate, each renamed into place.
    let right = kubelet_ca.issue(&CertSpec::client("proxy"));
    for (path, contents) in [(&key, right.key_pem()), (&cert, right.chain_pem())] {
        let staged = path.with_extension("new");
        std::fs::write(&staged, contents).unwrap();
        std::fs::rename(&staged, path).unwrap();
    }
    let reloaded =
        "kubelet_auth_proxy_config_reloads_total{target=\"upstream_tls\",result=\"applied\"} 1";
    eventually("the new client certificate is loaded", || async {
        let metrics = plain_get(proxy.admin_addr(), "/metrics").await.text();
        metrics.contains(reloaded).then_some(())
    })
    .await;
    assert_eq!(alice.get("/pods").await.status, StatusCode::OK);
}

//! Configuration files through the real binary: `check-config` accepts a valid set and refuses a
//! broken ProxyConfiguration, KubeletConfiguration or AuthorizationConfiguration with status 2 and
//! one line naming the flag and the file; flags override `--config`, which overrides
//! `--kubelet-config` (seen in check-config's summary line, and by serving); the shipped examples
//! under `config/` pass check-config together, with generated certificates in place of theirs.

use std::path::Path;

use http::StatusCode;
use serde_json::Value;

use kubelet_auth_proxy::tools::demo::kubelet::StandInKubelet;

use crate::support::apiserver::{ApiServer, Flavour};
use crate::support::assert_contains;
use crate::support::client::{Client, Identity};
use crate::support::harness::{Subject, grant};
use crate::support::pki::{Authority, CertSpec};
use crate::support::process::{Finished, ProxyProcess, run};
use crate::support::{TempDir, within};

const PROXY_HEADER: &str = "apiVersion: kubelet-auth-proxy/v1alpha1\nkind: ProxyConfiguration\n";
const KUBELET_HEADER: &str =
    "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
const AUTHORIZATION_HEADER: &str =
    "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthorizationConfiguration\n";

/// A directory with what configuration files name: a CA, a serving certificate and key, a policy,
/// and a stand-in API server's kubeconfig.
struct Files {
    dir: TempDir,
    ca: Authority,
    api: ApiServer,
}

impl Files {
    async fn new(label: &str) -> Files {
        let dir = TempDir::new(label);
        let ca = Authority::root("config files CA");
        let serving = ca.issue(&CertSpec::server());
        dir.write("serving.crt", serving.chain_pem());
        dir.write("serving.key", serving.key_pem());
        dir.write("ca.crt", ca.pem());
        dir.write(
            "policy.yaml",
            grant(
                "pods-reader",
                &["nodes/pods"],
                &["get"],
                &[Subject::User("alice")],
            ),
        );
        Files {
            dir,
            ca,
            api: ApiServer::start().await,
        }
    }

    /// Writes `name` in the directory and returns its path as text.
    fn write(&self, name: &str, contents: &str) -> String {
        self.dir.write(name, contents).display().to_string()
    }

    /// A KubeletConfiguration naming the files by relative paths, with `authorization` and
    /// `extra` lines.
    fn kubelet_config(&self, name: &str, authorization: &str, extra: &str) -> String {
        self.write(
            name,
            &format!(
                "{KUBELET_HEADER}address: 127.0.0.1
port: 10250
tlsCertFile: serving.crt
tlsPrivateKeyFile: serving.key
authentication:
  x509: {{clientCAFile: ca.crt}}
  webhook: {{enabled: false}}
  anonymous: {{enabled: false}}
authorization:
{authorization}
{extra}"
            ),
        )
    }

    /// A Webhook authorizer entry of an AuthorizationConfiguration with this `timeout` and
    /// `extra` lines (indented for the `webhook` mapping).
    fn webhook(&self, timeout: &str, extra: &str) -> String {
        format!(
            "  - type: Webhook
    name: apiserver
    webhook:
      timeout: {timeout}
      subjectAccessReviewVersion: v1
      failurePolicy: NoOpinion
      connectionInfo:
        type: KubeConfigFile
        kubeConfigFile: {kubeconfig}
{extra}",
            kubeconfig = self.api.kubeconfig(Flavour::ClientCertificate).display(),
        )
    }

    /// `--tls-cert-file`, `--tls-private-key-file` and `--client-ca-file` naming the directory's
    /// files: what a command line needs besides the file under test.
    fn file_flags(&self) -> Vec<String> {
        [
            ("--tls-cert-file", "serving.crt"),
            ("--tls-private-key-file", "serving.key"),
            ("--client-ca-file", "ca.crt"),
        ]
        .iter()
        .map(|(flag, name)| format!("{flag}={}", self.dir.path().join(name).display()))
        .collect()
    }

    /// Runs `kubelet-auth-proxy check-config args…`.
    async fn check(&self, name: &str, args: &[String]) -> Finished {
        let mut command = vec!["check-config".to_owned()];
        command.extend_from_slice(args);
        run(&self.dir, name, &command).await
    }
}

/// The one stdout line of a successful check-config.
fn summary(done: &Finished, what: &str) -> String {
    assert_eq!(done.status.code(), Some(0), "{what}: {}", done.stderr);
    let lines: Vec<&str> = done.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: {}", done.stdout);
    lines[0].to_owned()
}

fn valid_line(listen: &str, node: &str, authorizers: &str) -> String {
    format!(
        "kubelet-auth-proxy: configuration is valid: serving {listen} for node {node:?}, authorizers {authorizers}"
    )
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|a| (*a).to_owned()).collect()
}

#[tokio::test]
async fn check_config_accepts_a_valid_set_of_files() {
    let files = Files::new("valid").await;
    let authorization = files.write(
        "authorization.yaml",
        &format!(
            "{AUTHORIZATION_HEADER}authorizers:
  - type: Node
    name: node
  - type: Policy
    name: local
    policy:
      files: [policy.yaml]
{}",
            files.webhook(
                "3s",
                "      authorizedTTL: 1m\n      unauthorizedTTL: 10s\n      \
                 matchConditionSubjectAccessReviewVersion: v1\n      matchConditions:\n        \
                 - expression: \"!('system:nodes' in request.groups)\"\n        \
                 - expression: request.user.startsWith('system:serviceaccount:')\n"
            )
        ),
    );
    let config = files.write(
        "proxy.yaml",
        &format!(
            "{PROXY_HEADER}upstream: https://127.0.0.1:10250
upstreamCaFile: ca.crt
tlsCertFile: serving.crt
tlsPrivateKeyFile: serving.key
clientCaFile: ca.crt
authorizationConfig: authorization.yaml
nodeName: node-from-config
listenAddress: 127.0.0.1:10999
shutdownGracePeriod: 45s
auditLogPath: logs/audit.log
"
        ),
    );
    // Only the config file's directory has a logs/ directory: resolved anywhere else, the audit
    // log's place would be refused.
    std::fs::create_dir(files.dir.path().join("logs")).unwrap();
    let done = files
        .check("valid-config", &[format!("--config={config}")])
        .await;
    assert_eq!(
        summary(&done, "ProxyConfiguration + AuthorizationConfiguration"),
        valid_line("127.0.0.1:10999", "node-from-config", "Node,Policy,Webhook")
    );
    assert!(Path::new(&authorization).is_file());
    assert!(
        !files.dir.path().join("logs/audit.log").exists(),
        "check-config creates nothing"
    );

    // A kubelet's own configuration, with the kubelet's defaults (Webhook, token webhook on).
    let kubelet = files.write(
        "kubelet.yaml",
        &format!(
            "{KUBELET_HEADER}address: 127.0.0.1
tlsCertFile: serving.crt
tlsPrivateKeyFile: serving.key
authentication:
  x509: {{clientCAFile: ca.crt}}
evictionHard: {{memory.available: 100Mi}}
cgroupDriver: systemd
"
        ),
    );
    let kubeconfig = files.api.kubeconfig(Flavour::ClientCertificate);
    let done = files
        .check(
            "valid-kubelet",
            &[
                format!("--kubelet-config={kubelet}"),
                "--upstream=http://127.0.0.1:10255".to_owned(),
                format!("--kubeconfig={}", kubeconfig.display()),
                "--node-name=node-from-flag".to_owned(),
            ],
        )
        .await;
    assert_eq!(
        summary(&done, "KubeletConfiguration"),
        valid_line("0.0.0.0:10250, [::]:10250", "node-from-flag", "Webhook")
    );
}

#[tokio::test]
async fn broken_configuration_files_exit_2_with_one_line_naming_the_flag_and_file() {
    let files = Files::new("broken").await;
    let base = args(&["--upstream=http://127.0.0.1:10255", "--node-name=node-a"]);
    let kubelet_base = |path: &str| {
        let mut args = base.clone();
        args.push(format!("--kubelet-config={path}"));
        args
    };
    let proxy_base = |path: &str| {
        let mut args = files.file_flags();
        args.push("--authorization-mode=AlwaysAllow".to_owned());
        args.push(format!("--config={path}"));
        args
    };
    let authorization_base = |path: &str| {
        let mut args = vec!["--upstream=http://127.0.0.1:10255".to_owned()];
        args.extend(files.file_flags());
        args.push(format!("--authorization-config={path}"));
        args
    };
    let node_and_webhook = |webhook: String| {
        format!("{AUTHORIZATION_HEADER}authorizers:\n  - type: Node\n    name: node\n{webhook}")
    };

    let unknown_field = files.write(
        "unknown-field.yaml",
        &format!("{PROXY_HEADER}upstream: http://127.0.0.1:10255\nnodeNmae: node-a\n"),
    );
    let wrong_kind = files.write(
        "wrong-kind.yaml",
        "apiVersion: kubelet-auth-proxy/v1alpha1\nkind: KubeletConfiguration\nnodeName: node-a\n",
    );
    let misspelt = files.kubelet_config(
        "misspelt.yaml",
        "  mode: AlwaysAllow",
        "authentcation:\n  anonymous: {enabled: true}\n",
    );
    let misspelt_nested = files.write(
        "misspelt-nested.yaml",
        &format!(
            "{KUBELET_HEADER}authentication:\n  x509: {{clientCAfile: ca.crt}}\n  webhook: {{enabled: false}}\nauthorization: {{mode: AlwaysAllow}}\n"
        ),
    );
    let cel = files.write(
        "cel.yaml",
        &node_and_webhook(files.webhook(
            "3s",
            "      matchConditionSubjectAccessReviewVersion: v1\n      matchConditions:\n        \
             - expression: \"request.userInfo.username == 'alice'\"\n",
        )),
    );
    let slow = files.write("slow.yaml", &node_and_webhook(files.webhook("31s", "")));
    let unknown_type = files.write(
        "unknown-type.yaml",
        &format!("{AUTHORIZATION_HEADER}authorizers:\n  - type: Magic\n    name: magic\n"),
    );

    let cases: Vec<(Vec<String>, &str, &str, &str)> = vec![
        (
            proxy_base(&unknown_field),
            "--config",
            &unknown_field,
            "nodeNmae",
        ),
        (
            proxy_base(&wrong_kind),
            "--config",
            &wrong_kind,
            "KubeletConfiguration",
        ),
        (
            kubelet_base(&misspelt),
            "--kubelet-config",
            &misspelt,
            "authentcation",
        ),
        (
            kubelet_base(&misspelt_nested),
            "--kubelet-config",
            &misspelt_nested,
            "clientCAfile",
        ),
        (
            authorization_base(&cel),
            "--authorization-config",
            &cel,
            "webhook.matchConditions[0].expression \"request.userInfo.username == 'alice'\": \
             compilation failed: undefined field 'userInfo'",
        ),
        (
            authorization_base(&slow),
            "--authorization-config",
            &slow,
            "timeout",
        ),
        (
            authorization_base(&unknown_type),
            "--authorization-config",
            &unknown_type,
            "Magic",
        ),
    ];
    for (i, (args, flag, path, word)) in cases.iter().enumerate() {
        let done = files.check(&format!("case{i}"), args).await;
        assert_eq!(done.status.code(), Some(2), "{path}: {}", done.stderr);
        assert!(done.stdout.is_empty(), "{path}: {}", done.stdout);
        let lines: Vec<&str> = done.stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "{path}: one line expected:\n{}",
            done.stderr
        );
        for expected in [*flag, *path, *word] {
            assert!(
                lines[0].contains(expected),
                "{expected:?} not in {:?}",
                lines[0]
            );
        }
    }
}

#[tokio::test]
async fn flags_override_the_config_file_which_overrides_the_kubelet_config() {
    let files = Files::new("precedence").await;
    let kubelet = files.kubelet_config("kubelet.yaml", "  mode: AlwaysAllow", "");
    let config = files.write(
        "proxy.yaml",
        &format!(
            "{PROXY_HEADER}upstream: http://127.0.0.1:10255
nodeName: node-from-config
listenAddress: 127.0.0.1:10999
authorizationMode: [Node, AlwaysAllow]
"
        ),
    );
    let cases = [
        (
            args(&[
                &format!("--kubelet-config={kubelet}"),
                "--upstream=http://127.0.0.1:10255",
                "--node-name=node-from-flag",
            ]),
            valid_line("0.0.0.0:10250, [::]:10250", "node-from-flag", "AlwaysAllow"),
        ),
        (
            args(&[
                &format!("--kubelet-config={kubelet}"),
                &format!("--config={config}"),
            ]),
            valid_line("127.0.0.1:10999", "node-from-config", "Node,AlwaysAllow"),
        ),
        (
            // Flags win wherever they are on the command line.
            args(&[
                "--node-name=node-from-flag",
                &format!("--kubelet-config={kubelet}"),
                &format!("--config={config}"),
                "--listen-address=127.0.0.1:10888",
                "--authorization-mode=AlwaysDeny,AlwaysAllow",
            ]),
            valid_line(
                "127.0.0.1:10888",
                "node-from-flag",
                "AlwaysDeny,AlwaysAllow",
            ),
        ),
    ];
    for (i, (args, expected)) in cases.iter().enumerate() {
        let done = files.check(&format!("precedence{i}"), args).await;
        assert_eq!(&summary(&done, &format!("{args:?}")), expected, "{args:?}");
    }
}

#[tokio::test]
async fn the_config_file_overrides_the_kubelet_config_when_serving() {
    let kubelet = within("starting the stand-in kubelet", StandInKubelet::start(None))
        .await
        .unwrap();
    let files = Files::new("serving-precedence").await;
    // The kubelet's configuration and the proxy's in two directories: each file's relative paths
    // are its own directory's.
    let kubelet_dir = files.dir.path().join("kubelet");
    std::fs::create_dir(&kubelet_dir).unwrap();
    for name in ["serving.crt", "serving.key", "ca.crt"] {
        std::fs::rename(files.dir.path().join(name), kubelet_dir.join(name)).unwrap();
    }
    let kubelet_config = files.kubelet_config("kubelet/kubelet.yaml", "  mode: AlwaysAllow", "");
    let config = files.write(
        "proxy.yaml",
        &format!(
            "{PROXY_HEADER}upstream: http://{}
anonymousAuth: true
listenAddress: 127.0.0.1:0
adminListenAddress: 127.0.0.1:0
nodeName: node-a
",
            kubelet.addr().unwrap()
        ),
    );
    let alice = |proxy: &ProxyProcess| {
        Client::new(
            files.ca.cert(),
            proxy.addr(),
            Identity::of(&files.ca.issue(&CertSpec::client("alice"))),
        )
    };
    let anonymous =
        |proxy: &ProxyProcess| Client::new(files.ca.cert(), proxy.addr(), Identity::None);
    let command_line = |extra: &[&str]| {
        let mut list = args(&[
            &format!("--kubelet-config={kubelet_config}"),
            &format!("--config={config}"),
        ]);
        list.extend(args(extra));
        list
    };
    // The ProxyConfiguration turns on what the KubeletConfiguration has off.
    let mut proxy = ProxyProcess::start(&files.dir, "config-wins", &command_line(&[]), &[]).await;
    assert_eq!(alice(&proxy).get("/pods").await.status, StatusCode::OK);
    assert_eq!(anonymous(&proxy).get("/pods").await.status, StatusCode::OK);
    proxy.terminate();
    assert_eq!(proxy.wait().await.code(), Some(0), "{}", proxy.stderr());

    // A flag turns it off again.
    let mut proxy = ProxyProcess::start(
        &files.dir,
        "flag-wins",
        &command_line(&["--anonymous-auth=false"]),
        &[],
    )
    .await;
    assert_eq!(alice(&proxy).get("/pods").await.status, StatusCode::OK);
    assert_eq!(
        anonymous(&proxy).get("/pods").await.status,
        StatusCode::UNAUTHORIZED
    );
    proxy.terminate();
    assert_eq!(proxy.wait().await.code(), Some(0), "{}", proxy.stderr());
}

#[tokio::test]
async fn the_authorization_config_overrides_the_kubelet_configs_authorization_mode() {
    let files = Files::new("authorization-over-kubelet").await;
    let kubelet = files.kubelet_config("kubelet.yaml", "  mode: AlwaysAllow", "");
    let authorization = files.write(
        "authorization.yaml",
        &format!(
            "{AUTHORIZATION_HEADER}authorizers:\n  - type: Node\n    name: node\n  - type: AlwaysAllow\n    name: allow\n"
        ),
    );
    let done = files
        .check(
            "authorization-over-kubelet",
            &args(&[
                &format!("--kubelet-config={kubelet}"),
                &format!("--authorization-config={authorization}"),
                "--upstream=http://127.0.0.1:10255",
                "--node-name=node-a",
            ]),
        )
        .await;
    assert_eq!(
        summary(&done, "--kubelet-config with --authorization-config"),
        valid_line("0.0.0.0:10250, [::]:10250", "node-a", "Node,AlwaysAllow")
    );
}

/// A shipped example, read as a JSON mapping.
fn example(relative: &str) -> serde_json::Map<String, Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    let text = std::fs::read_to_string(&path).unwrap();
    match serde_saphyr::from_str::<Value>(&text).unwrap() {
        Value::Object(map) => map,
        other => panic!("{relative} is not a mapping: {other}"),
    }
}

#[tokio::test]
async fn the_shipped_proxy_and_kubelet_configurations_pass_check_config_together() {
    let files = Files::new("examples").await;
    let identity = files.ca.issue(&CertSpec::client("kubelet-auth-proxy"));
    files.write("upstream-client.crt", &identity.chain_pem());
    files.write("upstream-client.key", &identity.key_pem());
    let generated = |name: &str| files.dir.path().join(name).display().to_string();
    let kubeconfig = files.api.kubeconfig(Flavour::ClientCertificate);

    // config/proxy.yaml with every file it names replaced by a generated one, and the kubeconfig
    // it leaves to the DaemonSet's service account given, as under systemd.
    let mut proxy = example("config/proxy.yaml");
    for (key, replacement) in [
        ("upstreamCaFile", generated("ca.crt")),
        ("upstreamClientCertFile", generated("upstream-client.crt")),
        ("upstreamClientKeyFile", generated("upstream-client.key")),
        ("tlsCertFile", generated("serving.crt")),
        ("tlsPrivateKeyFile", generated("serving.key")),
        ("clientCaFile", generated("ca.crt")),
        ("auditLogPath", generated("audit.log")),
    ] {
        assert!(proxy.contains_key(key), "config/proxy.yaml sets {key}");
        proxy.insert(key.to_owned(), Value::String(replacement));
    }
    assert!(!proxy.contains_key("kubeconfig"));
    proxy.insert(
        "kubeconfig".to_owned(),
        Value::String(kubeconfig.display().to_string()),
    );
    let proxy_path = files.write("proxy.yaml", &Value::Object(proxy.clone()).to_string());

    // config/kubelet-config.yaml with its client CA generated.
    let mut kubelet = example("config/kubelet-config.yaml");
    kubelet["authentication"]["x509"]["clientCAFile"] = Value::String(generated("ca.crt"));
    let kubelet_path = files.write("kubelet-config.yaml", &Value::Object(kubelet).to_string());

    let done = files
        .check(
            "examples",
            &[
                format!("--kubelet-config={kubelet_path}"),
                format!("--config={proxy_path}"),
                "--node-name=node-1".to_owned(),
            ],
        )
        .await;
    // The shipped `:10250` beside the shipped kubelet on [::1]: every IPv4 address.
    assert_eq!(proxy["listenAddress"], ":10250");
    assert_eq!(
        summary(&done, "config/proxy.yaml with config/kubelet-config.yaml"),
        valid_line("0.0.0.0:10250", "node-1", "Node,RBAC,Webhook")
    );
}

/// An error about a value taken from a configuration file names that file and field (and the
/// flag it stands for); the same value given on the command line names the flag.
#[tokio::test]
async fn an_error_in_a_file_names_the_file_and_the_field() {
    let files = Files::new("origins").await;
    let missing = files.dir.path().join("missing-ca.crt");
    let missing = missing.display();
    let config = files.write(
        "proxy.yaml",
        &format!(
            "{PROXY_HEADER}upstream: https://127.0.0.1:1\nupstreamCaFile: missing-ca.crt\n\
             tlsCertFile: serving.crt\ntlsPrivateKeyFile: serving.key\nclientCaFile: ca.crt\n\
             authorizationMode: [AlwaysAllow]\nnodeName: node-a\n"
        ),
    );
    let done = files
        .check("from-config", &args(&[&format!("--config={config}")]))
        .await;
    done.assert_code(2);
    assert_eq!(
        done.stderr.trim_end(),
        format!(
            "kubelet-auth-proxy: --config {config}: field upstreamCaFile: {missing}: cannot read: \
             No such file or directory (os error 2) (--upstream-ca-file)"
        )
    );
    let done = files
        .check(
            "from-flag",
            &args(&[
                &format!("--config={config}"),
                &format!("--upstream-ca-file={missing}"),
            ]),
        )
        .await;
    done.assert_code(2);
    assert!(
        done.stderr.starts_with(&format!(
            "kubelet-auth-proxy: --upstream-ca-file {missing}:"
        )),
        "{}",
        done.stderr
    );

    let kubelet = files.kubelet_config(
        "kubelet.yaml",
        "  mode: AlwaysAllow",
        "tlsMinVersion: VersionTLS10",
    );
    let done = files
        .check(
            "from-kubelet-config",
            &args(&[
                &format!("--kubelet-config={kubelet}"),
                "--upstream=http://127.0.0.1:1",
                "--node-name=node-a",
            ]),
        )
        .await;
    done.assert_code(2);
    assert!(
        done.stderr.starts_with(&format!(
            "kubelet-auth-proxy: --kubelet-config {kubelet}: field tlsMinVersion: "
        )),
        "{}",
        done.stderr
    );
    assert_contains(&done.stderr, "(--tls-min-version)");
}

/// A condition the proxy cannot run safely is refused at load by the server and by check-config
/// alike, on one line naming the file, the field and the cause: one whose worst case (the largest
/// review the proxy can build) costs more than kube-apiserver's static limit, 10,000,000, and one
/// nested deeper than cel-go's parser allows (it aborted the process with a stack overflow
/// before), quoted by its start and length.
#[tokio::test]
async fn a_condition_over_the_estimated_cost_limit_is_refused_at_load() {
    let quadratic = "request.groups.all(g, request.groups.exists(h, h == g))".to_owned();
    let deep = format!("request{}", ".a".repeat(14_000));
    let cases = [
        (
            "cel-cost",
            quadratic.clone(),
            vec![
                format!("webhook.matchConditions[0].expression \"{quadratic}\": estimated cost "),
                "exceeds the limit 10000000 for the largest review".to_owned(),
                "iterate over request.groups or request.extra once".to_owned(),
            ],
        ),
        (
            "cel-deep",
            deep,
            vec![
                "webhook.matchConditions[0].expression \"request.a.a.a".to_owned(),
                "… (28007 code points): compilation failed: expression nesting depth exceeds the \
                 limit of 250"
                    .to_owned(),
            ],
        ),
    ];
    for (name, expression, expectations) in cases {
        let files = Files::new(name).await;
        let path = files.write(
            "refused.yaml",
            &format!(
                "{AUTHORIZATION_HEADER}authorizers:\n{}",
                files.webhook(
                    "3s",
                    &format!(
                        "      matchConditionSubjectAccessReviewVersion: v1\n      matchConditions:\n        \
                         - expression: \"{expression}\"\n"
                    ),
                )
            ),
        );
        let mut flags = vec!["--upstream=http://127.0.0.1:10255".to_owned()];
        flags.extend(files.file_flags());
        flags.push(format!("--authorization-config={path}"));

        let checked = files.check("check-config", &flags).await;
        let served = run(&files.dir, "serve", &flags).await;
        for (what, done) in [("check-config", checked), ("server", served)] {
            assert_eq!(
                done.status.code(),
                Some(2),
                "{name}, {what}: {}",
                done.stderr
            );
            let line = done.stderr.trim_end();
            assert!(
                !line.contains('\n'),
                "{name}, {what}: one line expected:\n{line}"
            );
            let file = ["--authorization-config".to_owned(), path.clone()];
            for expected in file.iter().chain(&expectations) {
                assert!(
                    line.contains(expected.as_str()),
                    "{name}, {what}: {expected:?} not in {line:?}"
                );
            }
        }
    }
}

//! Command-line flags, named as the kubelet names them wherever the kubelet has the setting, so an
//! operator can carry values over from a kubelet unit file unchanged.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, ValueEnum};

use super::duration::parse_go_duration;
use super::listen::ListenAddress;

/// Everything the proxy needs to serve, as given on the command line.
///
/// Boolean flags follow Go's pflag form: `--anonymous-auth` means true and `--anonymous-auth=false`
/// turns it off (a separate `false` word is not taken as the value, as in Go).
#[derive(Debug, Clone, Args)]
pub struct ProxyFlags {
    /// The kubelet to forward to: `https://127.0.0.1:10250`, `http://127.0.0.1:10255` or
    /// `unix:///path/to/socket`.
    #[arg(long, value_name = "URL", help_heading = "Upstream kubelet")]
    pub upstream: Option<String>,

    /// PEM bundle of CAs that sign the kubelet's serving certificate. Required for an https
    /// upstream: there are no built-in roots, and the kubelet's certificate is always verified.
    #[arg(long, value_name = "FILE", help_heading = "Upstream kubelet")]
    pub upstream_ca_file: Option<PathBuf>,

    /// Client certificate (PEM) the proxy presents to the kubelet.
    #[arg(long, value_name = "FILE", help_heading = "Upstream kubelet")]
    pub upstream_client_cert_file: Option<PathBuf>,

    /// Private key (PEM) for --upstream-client-cert-file.
    #[arg(long, value_name = "FILE", help_heading = "Upstream kubelet")]
    pub upstream_client_key_file: Option<PathBuf>,

    /// Name to verify the kubelet's certificate against, when it differs from the --upstream host.
    #[arg(long, value_name = "NAME", help_heading = "Upstream kubelet")]
    pub upstream_server_name: Option<String>,

    /// Time allowed to connect to the kubelet (including the TLS handshake).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_go_duration, help_heading = "Upstream kubelet")]
    pub upstream_connect_timeout: Duration,

    /// Most requests in flight to the kubelet at once, each holding one upstream connection until
    /// its response ends (an exec/attach/portForward session for its life). A request beyond
    /// waits up to --upstream-connect-timeout for a place, then gets 503.
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..), help_heading = "Upstream kubelet")]
    pub upstream_max_requests_inflight: u32,

    /// Of those, most for one user: a request beyond gets 429 at once, so one identity cannot
    /// take every upstream connection from the others. At most --upstream-max-requests-inflight.
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..), help_heading = "Upstream kubelet")]
    pub upstream_max_requests_inflight_per_user: u32,

    /// Address and port to serve the kubelet API on; repeat it to serve on several (an IPv4 and
    /// an IPv6 address of a dual-stack node, the IPv6 one in brackets). A port alone, `:PORT`,
    /// is every address of the families the kubelet does not listen on with that port: 0.0.0.0
    /// beside a kubelet on `[::1]:PORT`, `[::]` beside one on 127.0.0.1:PORT, both otherwise.
    #[arg(
        long,
        value_name = "ADDR:PORT",
        default_value = ":10250",
        help_heading = "Serving"
    )]
    pub listen_address: Vec<ListenAddress>,

    /// How long to keep trying a --listen-address another process holds (the kubelet, until it
    /// is moved to loopback) before giving up. Meanwhile the admin listener answers /healthz
    /// 200 and /readyz 503. Set it past the kubelet's move when the proxy is rolled out first.
    #[arg(long, value_name = "DURATION", default_value = "1m0s", value_parser = parse_go_duration, help_heading = "Serving")]
    pub listen_retry_timeout: Duration,

    /// Serving certificate chain (PEM).
    #[arg(long, value_name = "FILE", help_heading = "Serving")]
    pub tls_cert_file: Option<PathBuf>,

    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1) for --tls-cert-file.
    #[arg(long, value_name = "FILE", help_heading = "Serving")]
    pub tls_private_key_file: Option<PathBuf>,

    /// Minimum TLS version: VersionTLS12 or VersionTLS13 (VersionTLS10/11 are refused).
    #[arg(
        long,
        value_name = "VERSION",
        default_value = "VersionTLS12",
        help_heading = "Serving"
    )]
    pub tls_min_version: String,

    /// Comma-separated TLS 1.2 cipher suites by their Go names (e.g.
    /// TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256). Default: all suites rustls offers. As in Go, TLS
    /// 1.3 suites are always enabled.
    #[arg(
        long,
        value_name = "NAMES",
        value_delimiter = ',',
        help_heading = "Serving"
    )]
    pub tls_cipher_suites: Vec<String>,

    /// Time a client has to send its request headers, and to complete the TLS handshake.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_go_duration, help_heading = "Serving")]
    pub header_read_timeout: Duration,

    /// Time a connection may stay open with no request in flight after its last response, for
    /// HTTP/1.1 keep-alive and HTTP/2 alike; then it is closed (gracefully: HTTP/2 GOAWAY).
    #[arg(long, value_name = "DURATION", default_value = "90s", value_parser = parse_go_duration, help_heading = "Serving")]
    pub idle_connection_timeout: Duration,

    /// Time an upgraded exec, attach or portForward session may pass no data in either direction
    /// before both its connections are closed; the kubelet's streamingConnectionIdleTimeout.
    #[arg(long, value_name = "DURATION", default_value = "4h0m0s", value_parser = parse_go_duration, help_heading = "Serving")]
    pub streaming_connection_idle_timeout: Duration,

    /// Most client connections served at once, upgraded sessions included; further ones wait in
    /// the listen queue.
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..), help_heading = "Serving")]
    pub max_connections: u32,

    /// Threads that serve client connections, each with its own event loop and its own pool of
    /// connections to the kubelet, so that a connection, its requests and their upstream
    /// connections are handled on one thread (no hand-off between threads per request). 0: one per
    /// CPU the process may use (its CPU affinity and cgroup CPU quota), at most 8.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=256), help_heading = "Serving")]
    pub serving_threads: u16,

    /// On SIGTERM/SIGINT, time given to in-flight requests before connections are closed.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_go_duration, help_heading = "Serving")]
    pub shutdown_grace_period: Duration,

    /// Once another proxy serves on the sockets this one handed over (a surge rollout over
    /// --handover-socket, or SIGUSR2), how long after the stop the exec, attach and port-forward
    /// sessions and followed logs still open at the end of --shutdown-grace-period are served on
    /// before they are closed; they end sooner by themselves. Sized to the kubelet's own 4h
    /// streamingConnectionIdleTimeout. 0: they are closed with the grace period, as on a stop
    /// without a successor. A second SIGTERM, or SIGQUIT, closes them at once.
    #[arg(long, value_name = "DURATION", default_value = "4h0m0s", value_parser = parse_go_duration, help_heading = "Serving")]
    pub session_drain_timeout: Duration,

    /// NAMESPACE/NAME of the pod this proxy runs in (from the downward API). When it drains
    /// sessions after a surge rollout, it labels its own pod kubelet-auth-proxy/draining=true,
    /// which the shipped DaemonSet's selector excludes: the DaemonSet releases the pod and its
    /// rollout goes on while the sessions drain. If the label cannot be set within the grace
    /// period, the sessions are closed with it instead of holding the rollout. Uses the API
    /// server credentials of --kubeconfig (or the pod's service account).
    #[arg(long, value_name = "NAMESPACE/NAME", help_heading = "Serving")]
    pub drain_release_pod: Option<String>,

    /// PEM bundle of CAs for x509 client-certificate authentication. A client certificate is
    /// requested, never required, at the handshake; an invalid one is answered with 401.
    #[arg(long, value_name = "FILE", help_heading = "Authentication")]
    pub client_ca_file: Option<PathBuf>,

    /// Serve requests that carry no credential as system:anonymous. The kubelet's flag defaults
    /// to true; ours is off by default.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", help_heading = "Authentication")]
    pub anonymous_auth: bool,

    /// Check bearer tokens (Authorization header, WebSocket subprotocol) with TokenReview.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", help_heading = "Authentication")]
    pub authentication_token_webhook: bool,

    /// How long TokenReview answers (users and rejections) are cached.
    #[arg(long, value_name = "DURATION", default_value = "2m0s", value_parser = parse_go_duration, help_heading = "Authentication")]
    pub authentication_token_webhook_cache_ttl: Duration,

    /// Comma-separated audiences sent in TokenReviews; a token must be valid for one of them.
    /// Default: none (the API server's own audiences), as the kubelet.
    #[arg(
        long,
        value_name = "AUDIENCES",
        value_delimiter = ',',
        help_heading = "Authentication"
    )]
    pub authentication_token_audiences: Vec<String>,

    /// The cluster's service-account token issuer (as kube-apiserver's flag; repeat for several).
    /// Tokens naming it are checked on the node against the issuer's published keys before any
    /// TokenReview, so a forged one costs the API server nothing. Default: the issuer the API
    /// server publishes (/.well-known/openid-configuration).
    #[arg(long, value_name = "ISSUER", help_heading = "Authentication")]
    pub service_account_issuer: Vec<String>,

    /// An AuthenticationConfiguration (apiserver.config.k8s.io/v1, the file kube-apiserver's
    /// --authentication-config reads): bearer tokens of its JWT issuers are verified and mapped
    /// to users on the node, never sent to TokenReview; its `anonymous` section limits
    /// anonymous access to the paths it lists. Read again when it changes.
    #[arg(long, value_name = "FILE", help_heading = "Authentication")]
    pub authentication_config: Option<PathBuf>,

    /// Comma-separated audiences the API server accepts (as kube-apiserver's flag): a
    /// service-account token for none of them is refused on the node. Default: not checked on
    /// the node (TokenReview checks them); --authentication-token-audiences, when given, is used.
    #[arg(
        long,
        value_name = "AUDIENCES",
        value_delimiter = ',',
        help_heading = "Authentication"
    )]
    pub api_audiences: Vec<String>,

    /// Comma-separated authorizers tried in order; the first Allow or Deny wins: AlwaysAllow,
    /// AlwaysDeny, Node, Policy, RBAC, Webhook. Default: Webhook.
    #[arg(
        long,
        value_name = "MODES",
        value_delimiter = ',',
        help_heading = "Authorization"
    )]
    pub authorization_mode: Vec<AuthorizationMode>,

    /// An AuthorizationConfiguration (apiserver.config.k8s.io/v1) describing the authorizer chain,
    /// instead of --authorization-mode and the --authorization-webhook-* flags.
    #[arg(long, value_name = "FILE", help_heading = "Authorization")]
    pub authorization_config: Option<PathBuf>,

    /// How long allowed SubjectAccessReview answers are cached.
    #[arg(long, value_name = "DURATION", default_value = "5m0s", value_parser = parse_go_duration, help_heading = "Authorization")]
    pub authorization_webhook_cache_authorized_ttl: Duration,

    /// How long denied and no-opinion SubjectAccessReview answers are cached.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_go_duration, help_heading = "Authorization")]
    pub authorization_webhook_cache_unauthorized_ttl: Duration,

    /// RBAC manifests (ClusterRole, ClusterRoleBinding, List; multi-document YAML) for the Policy
    /// authorizer. Repeatable.
    #[arg(long, value_name = "FILE", help_heading = "Authorization")]
    pub authorization_policy_file: Vec<PathBuf>,

    /// How long the RBAC authorizer goes on deciding from the roles and bindings it last saw
    /// while its watches of the API server are broken; after that it has no opinion (later
    /// authorizers decide) until they resume. 0 stops deciding at the first failure.
    #[arg(long, value_name = "DURATION", default_value = "10m0s", value_parser = parse_go_duration, help_heading = "Authorization")]
    pub rbac_max_staleness: Duration,

    /// The RBAC authorizer's first lists wait a random part of this, so that nodes started
    /// together do not list together.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_go_duration, help_heading = "Authorization")]
    pub rbac_start_jitter: Duration,

    /// The Node name of the kubelet behind the proxy, used as the `name` of every attribute.
    /// Default: this machine's hostname, lowercased, as the kubelet does.
    #[arg(
        long,
        visible_alias = "hostname-override",
        value_name = "NAME",
        help_heading = "Authorization"
    )]
    pub node_name: Option<String>,

    /// Authorize /exec, /attach, /portForward and /run with verb `create` whatever the HTTP method,
    /// so a WebSocket GET cannot run commands with only `get nodes/proxy`. `=false` restores the
    /// kubelet's behaviour.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", help_heading = "Authorization")]
    pub exec_requires_create: bool,

    /// Ask for the fine-grained subresources (nodes/pods, nodes/healthz, nodes/configz, …) before
    /// falling back to nodes/proxy, as kubelets 1.33+ do. `=false` gives the older single attribute.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", help_heading = "Authorization")]
    pub fine_grained_authz: bool,

    /// Also authorize container paths (/containerLogs, /exec, /attach, /portForward, /run) as the
    /// API server does the same operation: `get pods/log`, `create pods/exec`, … on the pod named
    /// in the path, in its namespace; allowed if either the kubelet's nodes/… check or this one
    /// allows. Off by default: namespace grants such as `edit` then reach the kubelet.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", help_heading = "Authorization")]
    pub pod_scoped_authz: bool,

    /// Use the path table of recent kubelet master: /statusz needs nodes/statusz and /flagz needs
    /// nodes/configz, with no nodes/proxy fallback. Off: the 1.33–1.35 table.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", help_heading = "Authorization")]
    pub standalone_statusz_flagz: bool,

    /// Set X-Remote-User, X-Remote-Uid, X-Remote-Group and X-Remote-Extra-* on forwarded requests
    /// (client-sent ones are always removed).
    #[arg(long, value_name = "BOOL", default_value_t = false, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", help_heading = "Upstream kubelet")]
    pub forward_identity_headers: bool,

    /// kubeconfig of the API server for TokenReview and SubjectAccessReview (client certificate or
    /// token credentials). Default: the in-cluster service account.
    #[arg(long, value_name = "FILE", help_heading = "API server")]
    pub kubeconfig: Option<PathBuf>,

    /// Time allowed for one TokenReview or SubjectAccessReview attempt (connect, send, read the
    /// answer). Transient failures are retried up to 5 attempts, as the kubelet does.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_go_duration, help_heading = "API server")]
    pub apiserver_request_timeout: Duration,

    /// Most TokenReviews, and separately SubjectAccessReviews, made at once to one API server
    /// (retries included). Others wait up to --apiserver-request-timeout, then fail closed
    /// (401 for a token, 500 for an authorization); identical reviews share one call.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096), help_heading = "API server")]
    pub apiserver_max_reviews_inflight: u32,

    /// Write an audit.k8s.io/v1 Event (level Metadata) per request to this file; `-` for stdout.
    #[arg(long, value_name = "FILE", help_heading = "Operations")]
    pub audit_log_path: Option<PathBuf>,

    /// Rotate the audit log when it reaches this many megabytes; 0 never rotates (warned about:
    /// the log can then fill its disk).
    #[arg(
        long,
        value_name = "MB",
        default_value_t = 100,
        help_heading = "Operations"
    )]
    pub audit_log_maxsize: u64,

    /// Keep at most this many rotated audit log files; 0 keeps them all. With the default size,
    /// the audit log takes at most 500 MB.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 4,
        help_heading = "Operations"
    )]
    pub audit_log_maxbackup: u32,

    /// Bound the size of each audit event: a longer requestURI is cut and the event annotated
    /// audit.k8s.io/truncated, as kube-apiserver's truncating backend does.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", help_heading = "Operations")]
    pub audit_log_truncate_enabled: bool,

    /// Largest audit event written, in bytes, when --audit-log-truncate-enabled.
    #[arg(long, value_name = "BYTES", default_value_t = 16384, value_parser = clap::value_parser!(u64).range(4096..=104_857_600), help_heading = "Operations")]
    pub audit_log_truncate_max_event_size: u64,

    /// Refuse exec, attach and portForward (503) while their audit event cannot be written (the
    /// writer's last write failed or its queue is full), instead of serving them unaudited.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", help_heading = "Operations")]
    pub audit_log_require_for_streams: bool,

    /// Which audit events are written: an audit.k8s.io/v1 Policy as kube-apiserver reads it
    /// (levels None and Metadata, omitStages); requests no rule matches are not recorded, acts
    /// (exec, attach, portForward, run, checkpoint, writes) always are. Default: every request.
    #[arg(long, value_name = "FILE", help_heading = "Operations")]
    pub audit_policy_file: Option<PathBuf>,
    /// How long the kept audit files must reach back under the worst flood: audit bytes of each
    /// identity and of all together are budgeted so that --audit-log-maxsize ×
    /// --audit-log-maxbackup bytes last this long; events beyond are counted and summarized, never
    /// those of exec, attach, portForward or writes. 0 turns the budget off (warned about).
    #[arg(long, value_name = "DURATION", default_value = "12h0m0s", value_parser = parse_go_duration, help_heading = "Operations")]
    pub audit_log_flood_retention: Duration,

    /// The proxy's configuration file (kind ProxyConfiguration): every flag as a camelCase field.
    /// Flags given on the command line override it.
    #[arg(long, value_name = "FILE", help_heading = "Operations")]
    pub config: Option<PathBuf>,

    /// Take authentication, authorization and TLS settings from a KubeletConfiguration file
    /// (kubelet.config.k8s.io/v1beta1), with its config-file defaults. --config and flags override it.
    #[arg(long, value_name = "FILE", help_heading = "Operations")]
    pub kubelet_config: Option<PathBuf>,

    /// Address for /healthz, /readyz and /metrics (plain HTTP; keep it on loopback).
    #[arg(
        long,
        value_name = "ADDR:PORT",
        default_value = "127.0.0.1:10262",
        help_heading = "Operations"
    )]
    pub admin_listen_address: SocketAddr,

    /// Also serve /healthz, /readyz and /metrics on this unix socket, which only this process
    /// answers: beside another proxy on the same --admin-listen-address (a surge rollout, where
    /// both share the port), `kubelet-auth-proxy admin-probe` reaches this one through it. Put it
    /// in a directory of the pod's own (an emptyDir).
    #[arg(long, value_name = "PATH", help_heading = "Operations")]
    pub admin_socket: Option<PathBuf>,

    /// Hand the listening sockets to a new proxy, and take them from a running one, through this
    /// unix socket, instead of sharing the port: a surge rollout. Put it in a host directory only
    /// the proxy's user can reach (mode 0700, or 0770 with the proxy's group; checked at start,
    /// ACL included: otherwise, or with something else than its socket at the path, the proxy
    /// serves without it and says why). A new proxy asks it before binding; with nobody
    /// answering it binds its addresses itself.
    #[arg(long, value_name = "PATH", help_heading = "Operations")]
    pub handover_socket: Option<PathBuf>,

    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, help_heading = "Operations")]
    pub log_format: LogFormat,

    /// Log verbosity: 0 info, 1-3 debug, 4+ trace. RUST_LOG, when set, takes precedence.
    #[arg(
        short = 'v',
        long = "v",
        value_name = "LEVEL",
        default_value_t = 0,
        help_heading = "Operations"
    )]
    pub verbosity: u8,
}

/// One authorizer of the `--authorization-mode` chain, spelled as Kubernetes spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuthorizationMode {
    /// Allows every authenticated request.
    #[value(name = "AlwaysAllow")]
    AlwaysAllow,
    /// Has no opinion on anything (as in Kubernetes); requests are refused unless a later
    /// authorizer allows them.
    #[value(name = "AlwaysDeny")]
    AlwaysDeny,
    /// Denies node identities (`system:node:<n>` in `system:nodes`) other than this node.
    #[value(name = "Node")]
    Node,
    /// Local RBAC rules from --authorization-policy-file.
    #[value(name = "Policy")]
    Policy,
    /// The cluster's ClusterRoles and ClusterRoleBindings (and Roles and RoleBindings with
    /// --pod-scoped-authz), watched from the API server and decided on the node.
    #[value(name = "RBAC")]
    Rbac,
    /// SubjectAccessReview with the API server, cached.
    #[value(name = "Webhook")]
    Webhook,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

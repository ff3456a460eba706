//! Configuration files that become flags: `--config` (the proxy's own `ProxyConfiguration`) and
//! `--kubelet-config` (a `KubeletConfiguration`), each turned into flag arguments placed before the
//! command line's own, so precedence is plain: KubeletConfiguration < `--config` < flags.
//!
//! A `ProxyConfiguration`'s keys are the flag names in camelCase, and every flag has a field; of a
//! `KubeletConfiguration`, the authentication, authorization and TLS fields are read, with the
//! kubelet's config-file defaults.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::duration::parse_go_duration;
use super::{ConfigError, file_error};

/// `apiVersion` of the proxy's configuration file.
pub const PROXY_CONFIG_API_VERSION: &str = "kubelet-auth-proxy/v1alpha1";
/// `kind` of the proxy's configuration file.
pub const PROXY_CONFIG_KIND: &str = "ProxyConfiguration";
/// Largest configuration file read.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads and parses a YAML (or JSON) mapping, with the flag and file in every error.
fn read_mapping(flag: &'static str, path: &Path) -> Result<Map<String, Value>, ConfigError> {
    let text = read_text(flag, path)?;
    let value: Value =
        serde_saphyr::from_str_with_options(&text, serde_saphyr::options! { with_snippet: false })
            .map_err(|e| file_error(flag, path, format!("not valid YAML: {e}")))?;
    match value {
        Value::Object(map) => Ok(map),
        Value::Null => Err(file_error(flag, path, "the file is empty")),
        _ => Err(file_error(
            flag,
            path,
            "expected a mapping at the top level",
        )),
    }
}

/// Reads a configuration file of at most [`MAX_CONFIG_BYTES`]: a larger one is refused rather than
/// read into memory whole.
pub(crate) fn read_text(flag: &'static str, path: &Path) -> Result<String, ConfigError> {
    use std::io::Read;
    let file = std::fs::File::open(path)
        .map_err(|e| file_error(flag, path, format!("cannot read: {e}")))?;
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| file_error(flag, path, format!("cannot read: {e}")))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(file_error(
            flag,
            path,
            format!("larger than {MAX_CONFIG_BYTES} bytes"),
        ));
    }
    Ok(text)
}

/// Checks `apiVersion` and `kind` and removes them from `map`.
fn check_type(
    flag: &'static str,
    path: &Path,
    map: &mut Map<String, Value>,
    api_versions: &[&str],
    kind: &str,
) -> Result<(), ConfigError> {
    let mut field = |name: &str| match map.remove(name) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(file_error(flag, path, format!("{name} must be a string"))),
        None => Err(file_error(flag, path, format!("{name} is missing"))),
    };
    let api_version = field("apiVersion")?;
    if !api_versions.contains(&api_version.as_str()) {
        return Err(file_error(
            flag,
            path,
            format!(
                "apiVersion {api_version:?} is not supported (expected {})",
                api_versions.join(" or ")
            ),
        ));
    }
    let found = field("kind")?;
    if found != kind {
        return Err(file_error(
            flag,
            path,
            format!("kind {found:?} is not {kind}"),
        ));
    }
    Ok(())
}

/// `upstreamCaFile` → `upstream-ca-file`.
fn kebab_case(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 4);
    for c in camel.chars() {
        if c.is_ascii_uppercase() {
            out.push('-');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Paths in a configuration file are relative to the file's directory, as in Kubernetes.
fn resolve(base: &Path, value: &str) -> String {
    if value == "-" || Path::new(value).is_absolute() {
        return value.to_owned();
    }
    base.join(value).to_string_lossy().into_owned()
}

fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The `ProxyConfiguration` file as flag arguments, leaving out every flag given on the command
/// line (`given`). Unknown keys, nested files and wrong value shapes are errors naming the key.
fn proxy_config_args(
    path: &Path,
    command: &Command,
    given: &dyn Fn(&str) -> bool,
    origins: &mut Origins,
) -> Result<Vec<String>, ConfigError> {
    const FLAG: &str = "--config";
    let mut map = read_mapping(FLAG, path)?;
    check_type(
        FLAG,
        path,
        &mut map,
        &[PROXY_CONFIG_API_VERSION],
        PROXY_CONFIG_KIND,
    )?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut args = Vec::new();
    for (key, value) in &map {
        let long = kebab_case(key);
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()))
            .filter(|a| !matches!(a.get_id().as_str(), "config" | "kubelet_config"))
            .ok_or_else(|| file_error(FLAG, path, format!("unknown field {key:?}")))?;
        if given(arg.get_id().as_str()) {
            continue;
        }
        origins.record(&long, format!("--config {}: field {key}", path.display()));
        let is_file = arg
            .get_value_names()
            .is_some_and(|names| names.iter().any(|n| n.as_str() == "FILE"));
        let render = |v: &Value| -> Result<String, ConfigError> {
            let text = scalar(v).ok_or_else(|| {
                file_error(
                    FLAG,
                    path,
                    format!("{key}: expected a string, number or boolean"),
                )
            })?;
            Ok(format!(
                "--{long}={}",
                if is_file { resolve(base, &text) } else { text }
            ))
        };
        match value {
            Value::Array(items) => {
                if !matches!(arg.get_action(), ArgAction::Append) {
                    return Err(file_error(
                        FLAG,
                        path,
                        format!("{key}: expected a single value, not a list"),
                    ));
                }
                for item in items {
                    args.push(render(item)?);
                }
            }
            Value::Null => {}
            other => args.push(render(other)?),
        }
    }
    Ok(args)
}

/// Every field of `KubeletConfiguration` (`kubelet.config.k8s.io/v1beta1`), so that a kubelet's
/// own configuration file is accepted as it is while a misspelled field is still an error.
const KUBELET_CONFIGURATION_FIELDS: &[&str] = &[
    "enableServer",
    "staticPodPath",
    "podLogsDir",
    "syncFrequency",
    "fileCheckFrequency",
    "httpCheckFrequency",
    "staticPodURL",
    "staticPodURLHeader",
    "address",
    "port",
    "readOnlyPort",
    "tlsCertFile",
    "tlsPrivateKeyFile",
    "tlsCipherSuites",
    "tlsCurvePreferences",
    "tlsMinVersion",
    "rotateCertificates",
    "serverTLSBootstrap",
    "authentication",
    "authorization",
    "registryPullQPS",
    "registryBurst",
    "imagePullCredentialsVerificationPolicy",
    "preloadedImagesVerificationAllowlist",
    "eventRecordQPS",
    "eventBurst",
    "enableDebuggingHandlers",
    "enableContentionProfiling",
    "healthzPort",
    "healthzBindAddress",
    "oomScoreAdj",
    "clusterDomain",
    "clusterDNS",
    "streamingConnectionIdleTimeout",
    "nodeStatusUpdateFrequency",
    "nodeStatusReportFrequency",
    "nodeLeaseDurationSeconds",
    "imageMinimumGCAge",
    "imageMaximumGCAge",
    "imageGCHighThresholdPercent",
    "imageGCLowThresholdPercent",
    "volumeStatsAggPeriod",
    "kubeletCgroups",
    "systemCgroups",
    "cgroupRoot",
    "cgroupsPerQOS",
    "cgroupDriver",
    "cpuManagerPolicy",
    "singleProcessOOMKill",
    "cpuManagerPolicyOptions",
    "cpuManagerReconcilePeriod",
    "memoryManagerPolicy",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "topologyManagerPolicyOptions",
    "qosReserved",
    "runtimeRequestTimeout",
    "hairpinMode",
    "maxPods",
    "podCIDR",
    "podPidsLimit",
    "resolvConf",
    "runOnce",
    "cpuCFSQuota",
    "cpuCFSQuotaPeriod",
    "nodeStatusMaxImages",
    "maxOpenFiles",
    "contentType",
    "kubeAPIQPS",
    "kubeAPIBurst",
    "serializeImagePulls",
    "maxParallelImagePulls",
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionPressureTransitionPeriod",
    "evictionMaxPodGracePeriod",
    "evictionMinimumReclaim",
    "mergeDefaultEvictionSettings",
    "podsPerCore",
    "enableControllerAttachDetach",
    "protectKernelDefaults",
    "makeIPTablesUtilChains",
    "iptablesMasqueradeBit",
    "iptablesDropBit",
    "featureGates",
    "failSwapOn",
    "memorySwap",
    "containerLogMaxSize",
    "containerLogMaxFiles",
    "containerLogMaxWorkers",
    "containerLogMonitorInterval",
    "configMapAndSecretChangeDetectionStrategy",
    "systemReserved",
    "kubeReserved",
    "reservedSystemCPUs",
    "showHiddenMetricsForVersion",
    "systemReservedCgroup",
    "kubeReservedCgroup",
    "enforceNodeAllocatable",
    "allowedUnsafeSysctls",
    "volumePluginDir",
    "providerID",
    "kernelMemcgNotification",
    "logging",
    "enableSystemLogHandler",
    "enableSystemLogQuery",
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "shutdownGracePeriodByPodPriority",
    "crashLoopBackOff",
    "reservedMemory",
    "enableProfilingHandler",
    "enableDebugFlagsHandler",
    "seccompDefault",
    "memoryThrottlingFactor",
    "registerWithTaints",
    "registerNode",
    "tracing",
    "localStorageCapacityIsolation",
    "containerRuntimeEndpoint",
    "imageServiceEndpoint",
    "failCgroupV1",
    "userNamespaces",
];

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct KubeletAuthentication {
    #[serde(default)]
    x509: KubeletX509,
    #[serde(default)]
    webhook: KubeletAuthnWebhook,
    #[serde(default)]
    anonymous: KubeletAnonymous,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct KubeletX509 {
    #[serde(default, rename = "clientCAFile")]
    client_ca_file: String,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct KubeletAuthnWebhook {
    enabled: Option<bool>,
    #[serde(default, rename = "cacheTTL")]
    cache_ttl: String,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct KubeletAnonymous {
    enabled: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct KubeletAuthorization {
    #[serde(default)]
    mode: String,
    #[serde(default)]
    webhook: KubeletAuthzWebhook,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct KubeletAuthzWebhook {
    #[serde(default, rename = "cacheAuthorizedTTL")]
    cache_authorized_ttl: String,
    #[serde(default, rename = "cacheUnauthorizedTTL")]
    cache_unauthorized_ttl: String,
}

/// The KubeletConfiguration's authentication, authorization and TLS settings as flag arguments,
/// with the v1beta1 config-file defaults (anonymous off, token webhook on, mode Webhook, TTLs
/// 2m/5m/30s; a zero duration means the default, as in the kubelet), leaving out every flag given
/// on the command line or in `--config` (`given`).
fn kubelet_config_args(
    path: &Path,
    given: &dyn Fn(&str) -> bool,
    origins: &mut Origins,
) -> Result<Vec<String>, ConfigError> {
    const FLAG: &str = "--kubelet-config";
    let mut map = read_mapping(FLAG, path)?;
    check_type(
        FLAG,
        path,
        &mut map,
        &["kubelet.config.k8s.io/v1beta1"],
        "KubeletConfiguration",
    )?;
    if let Some(unknown) = map
        .keys()
        .find(|k| !KUBELET_CONFIGURATION_FIELDS.contains(&k.as_str()))
    {
        return Err(file_error(
            FLAG,
            path,
            format!("unknown field {unknown:?} (not a KubeletConfiguration v1beta1 field)"),
        ));
    }
    let section = |name: &str| map.get(name).cloned().unwrap_or(Value::Null);
    let authentication: KubeletAuthentication = match section("authentication") {
        Value::Null => KubeletAuthentication::default(),
        v => serde_json::from_value(v)
            .map_err(|e| file_error(FLAG, path, format!("authentication: {e}")))?,
    };
    let authorization: KubeletAuthorization = match section("authorization") {
        Value::Null => KubeletAuthorization::default(),
        v => serde_json::from_value(v)
            .map_err(|e| file_error(FLAG, path, format!("authorization: {e}")))?,
    };
    let base = path.parent().unwrap_or(Path::new("."));
    let duration = |field: &str, text: &str, default: &str| -> Result<String, ConfigError> {
        if text.is_empty() {
            return Ok(default.to_owned());
        }
        let parsed =
            parse_go_duration(text).map_err(|e| file_error(FLAG, path, format!("{field}: {e}")))?;
        Ok(if parsed.is_zero() {
            default.to_owned()
        } else {
            text.to_owned()
        })
    };
    let mode = match authorization.mode.as_str() {
        "" | "Webhook" => "Webhook",
        "AlwaysAllow" => "AlwaysAllow",
        other => {
            return Err(file_error(
                FLAG,
                path,
                format!(
                    "authorization.mode: unknown authorization mode {other:?} (AlwaysAllow or Webhook)"
                ),
            ));
        }
    };
    let string = |name: &str| match map.get(name) {
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        None | Some(Value::Null) | Some(Value::String(_)) => Ok(None),
        Some(_) => Err(file_error(FLAG, path, format!("{name} must be a string"))),
    };
    let mut settings: Vec<(&str, String)> = vec![
        (
            "anonymous_auth",
            authentication
                .anonymous
                .enabled
                .unwrap_or(false)
                .to_string(),
        ),
        (
            "authentication_token_webhook",
            authentication.webhook.enabled.unwrap_or(true).to_string(),
        ),
        (
            "authentication_token_webhook_cache_ttl",
            duration(
                "authentication.webhook.cacheTTL",
                &authentication.webhook.cache_ttl,
                "2m0s",
            )?,
        ),
        ("authorization_mode", mode.to_owned()),
        (
            "authorization_webhook_cache_authorized_ttl",
            duration(
                "authorization.webhook.cacheAuthorizedTTL",
                &authorization.webhook.cache_authorized_ttl,
                "5m0s",
            )?,
        ),
        (
            "authorization_webhook_cache_unauthorized_ttl",
            duration(
                "authorization.webhook.cacheUnauthorizedTTL",
                &authorization.webhook.cache_unauthorized_ttl,
                "30s",
            )?,
        ),
    ];
    if !authentication.x509.client_ca_file.is_empty() {
        settings.push((
            "client_ca_file",
            resolve(base, &authentication.x509.client_ca_file),
        ));
    }
    if let Some(cert) = string("tlsCertFile")? {
        settings.push(("tls_cert_file", resolve(base, &cert)));
    }
    if let Some(key) = string("tlsPrivateKeyFile")? {
        settings.push(("tls_private_key_file", resolve(base, &key)));
    }
    if let Some(version) = string("tlsMinVersion")? {
        settings.push(("tls_min_version", version));
    }
    if let Some(timeout) = string("streamingConnectionIdleTimeout")? {
        settings.push((
            "streaming_connection_idle_timeout",
            duration("streamingConnectionIdleTimeout", &timeout, "4h0m0s")?,
        ));
    }
    match map.get("tlsCipherSuites") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            let names = items
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    file_error(FLAG, path, "tlsCipherSuites must be a list of strings")
                })?;
            if !names.is_empty() {
                settings.push(("tls_cipher_suites", names.join(",")));
            }
        }
        Some(_) => {
            return Err(file_error(
                FLAG,
                path,
                "tlsCipherSuites must be a list of strings",
            ));
        }
    }
    let settings: Vec<(&str, String)> = settings.into_iter().filter(|(id, _)| !given(id)).collect();
    for (id, _) in &settings {
        let field = KUBELET_FIELDS
            .iter()
            .find(|(flag_id, _)| flag_id == id)
            .map_or(*id, |(_, field)| field);
        origins.record(
            &id.replace('_', "-"),
            format!("--kubelet-config {}: field {field}", path.display()),
        );
    }
    Ok(settings
        .into_iter()
        .map(|(id, value)| format!("--{}={value}", id.replace('_', "-")))
        .collect())
}

/// The KubeletConfiguration field each flag is taken from, for errors about its value.
const KUBELET_FIELDS: [(&str, &str); 12] = [
    ("anonymous_auth", "authentication.anonymous.enabled"),
    (
        "authentication_token_webhook",
        "authentication.webhook.enabled",
    ),
    (
        "authentication_token_webhook_cache_ttl",
        "authentication.webhook.cacheTTL",
    ),
    ("authorization_mode", "authorization.mode"),
    (
        "authorization_webhook_cache_authorized_ttl",
        "authorization.webhook.cacheAuthorizedTTL",
    ),
    (
        "authorization_webhook_cache_unauthorized_ttl",
        "authorization.webhook.cacheUnauthorizedTTL",
    ),
    ("client_ca_file", "authentication.x509.clientCAFile"),
    ("tls_cert_file", "tlsCertFile"),
    ("tls_private_key_file", "tlsPrivateKeyFile"),
    ("tls_min_version", "tlsMinVersion"),
    (
        "streaming_connection_idle_timeout",
        "streamingConnectionIdleTimeout",
    ),
    ("tls_cipher_suites", "tlsCipherSuites"),
];

/// Where flag values taken from configuration files came from, so an error about a value names
/// the file and field the operator wrote rather than a flag they never typed.
#[derive(Debug, Default, Clone)]
pub struct Origins {
    /// `(long flag without dashes, "--config <path>: field <name>")`.
    by_flag: Vec<(String, String)>,
}

impl Origins {
    fn record(&mut self, long: &str, origin: String) {
        self.by_flag.retain(|(flag, _)| flag != long);
        self.by_flag.push((long.to_owned(), origin));
    }

    /// Where `flag` (`--name`) came from, if from a file.
    pub fn of(&self, flag: &str) -> Option<&str> {
        let long = flag.strip_prefix("--")?;
        self.by_flag
            .iter()
            .find(|(name, _)| name == long)
            .map(|(_, origin)| origin.as_str())
    }

    /// `error` with the file and field its flag's value came from, when it came from a file:
    /// `--config proxy.yaml: field upstreamCaFile: ca.crt: cannot read: … (--upstream-ca-file)`.
    pub fn describe(&self, error: &ConfigError) -> String {
        let Some(origin) = self.of(error.flag()) else {
            return error.to_string();
        };
        match error {
            ConfigError::Flag { flag, reason, .. } => format!("{origin}: {reason} ({flag})"),
            ConfigError::File {
                flag, path, reason, ..
            } => format!("{origin}: {}: {reason} ({flag})", path.display()),
        }
    }
}

/// Expands `--config` and `--kubelet-config` of a parsed command line into flag arguments and
/// returns the full argument list to parse again (`None` when neither is given), with where each
/// value taken from a file came from. `matches` are the matches of the (sub)command that holds
/// the proxy flags; `insert_at` is where its flags start in `args`.
pub fn expand(
    command: &Command,
    matches: &ArgMatches,
    args: &[OsString],
    insert_at: usize,
) -> Result<Option<(Vec<OsString>, Origins)>, ConfigError> {
    let config: Option<&PathBuf> = matches.get_one("config");
    let kubelet_config: Option<&PathBuf> = matches.get_one("kubelet_config");
    if config.is_none() && kubelet_config.is_none() {
        return Ok(None);
    }
    let on_command_line = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
    let mut origins = Origins::default();
    let mut kubelet_origins = Origins::default();
    let from_config = match config {
        Some(path) => proxy_config_args(path, command, &on_command_line, &mut origins)?,
        None => Vec::new(),
    };
    let in_config = |id: &str| {
        let long = format!("--{}=", id.replace('_', "-"));
        from_config.iter().any(|a| a.starts_with(&long))
    };
    // An AuthorizationConfiguration, from either place, replaces the KubeletConfiguration's
    // authorization settings as it replaces --authorization-mode.
    let authorization_config =
        on_command_line("authorization_config") || in_config("authorization_config");
    let from_kubelet = match kubelet_config {
        Some(path) => kubelet_config_args(
            path,
            &|id| {
                on_command_line(id)
                    || in_config(id)
                    || (authorization_config && id.starts_with("authorization_"))
            },
            &mut kubelet_origins,
        )?,
        None => Vec::new(),
    };
    let mut expanded = Vec::with_capacity(args.len() + from_config.len() + from_kubelet.len());
    expanded.extend_from_slice(&args[..insert_at.min(args.len())]);
    expanded.extend(from_kubelet.into_iter().map(OsString::from));
    expanded.extend(from_config.into_iter().map(OsString::from));
    expanded.extend_from_slice(&args[insert_at.min(args.len())..]);
    origins.by_flag.extend(kubelet_origins.by_flag);
    Ok(Some((expanded, origins)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::flags::ProxyFlags;
    use clap::{Args, FromArgMatches};

    fn command() -> Command {
        ProxyFlags::augment_args(Command::new("kubelet-auth-proxy"))
    }

    use crate::test_fixtures::TempDir;

    /// Writes `text` to `name` in `dir`; its path.
    fn write(dir: &TempDir, name: &str, text: &str) -> PathBuf {
        let path = dir.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Parses `args` as the binary does: expand the files, parse again.
    fn parse(args: &[&str]) -> Result<ProxyFlags, String> {
        let args: Vec<OsString> = std::iter::once("kubelet-auth-proxy")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        let cmd = command();
        let matches = cmd
            .clone()
            .try_get_matches_from(&args)
            .map_err(|e| e.to_string())?;
        let matches = match expand(&cmd, &matches, &args, 1).map_err(|e| e.to_string())? {
            Some((expanded, _)) => cmd
                .try_get_matches_from(expanded)
                .map_err(|e| e.to_string())?,
            None => matches,
        };
        ProxyFlags::from_arg_matches(&matches).map_err(|e| e.to_string())
    }

    const HEADER: &str = "apiVersion: kubelet-auth-proxy/v1alpha1\nkind: ProxyConfiguration\n";

    #[test]
    fn every_flag_is_a_camel_case_field_and_flags_win() {
        let dir = TempDir::new("fields");
        let path = write(
            &dir,
            "proxy.yaml",
            &format!(
                "{HEADER}upstream: https://127.0.0.1:10250\nupstreamCaFile: ca.crt\nnodeName: from-file\n\
                 anonymousAuth: true\nmaxConnections: 7\nheaderReadTimeout: 3s\n\
                 authorizationMode: [Node, Policy]\nauthorizationPolicyFile: [a.yaml, /abs/b.yaml]\n\
                 tlsCipherSuites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\nv: 2\n"
            ),
        );
        let config = path.to_str().unwrap();
        let flags = parse(&["--config", config]).unwrap();
        assert_eq!(flags.upstream.as_deref(), Some("https://127.0.0.1:10250"));
        assert_eq!(
            flags.upstream_ca_file,
            Some(dir.0.join("ca.crt")),
            "relative to the file"
        );
        assert_eq!(flags.node_name.as_deref(), Some("from-file"));
        assert!(flags.anonymous_auth);
        assert_eq!(flags.max_connections, 7);
        assert_eq!(flags.header_read_timeout, std::time::Duration::from_secs(3));
        assert_eq!(flags.authorization_mode.len(), 2);
        assert_eq!(
            flags.authorization_policy_file,
            vec![dir.0.join("a.yaml"), PathBuf::from("/abs/b.yaml")]
        );
        assert_eq!(flags.tls_cipher_suites.len(), 1);
        assert_eq!(flags.verbosity, 2);

        let overridden = parse(&[
            "--config",
            config,
            "--node-name=from-flag",
            "--anonymous-auth=false",
            "--authorization-policy-file=c.yaml",
        ])
        .unwrap();
        assert_eq!(overridden.node_name.as_deref(), Some("from-flag"));
        assert!(!overridden.anonymous_auth);
        assert_eq!(
            overridden.authorization_policy_file,
            vec![PathBuf::from("c.yaml")],
            "a repeatable flag on the command line replaces the file's list"
        );
    }

    #[test]
    fn config_file_errors_name_the_file_and_field() {
        let dir = TempDir::new("errors");
        let cases = [
            (format!("{HEADER}nodeNam: x\n"), "unknown field \"nodeNam\""),
            (
                format!("{HEADER}config: other.yaml\n"),
                "unknown field \"config\"",
            ),
            (
                format!("{HEADER}nodeName: [a, b]\n"),
                "nodeName: expected a single value",
            ),
            (
                format!("{HEADER}nodeName: {{a: b}}\n"),
                "nodeName: expected a string",
            ),
            (
                "apiVersion: v1\nkind: ProxyConfiguration\n".to_owned(),
                "apiVersion \"v1\"",
            ),
            (
                "apiVersion: kubelet-auth-proxy/v1alpha1\nkind: Foo\n".to_owned(),
                "kind \"Foo\"",
            ),
            (
                "kind: ProxyConfiguration\n".to_owned(),
                "apiVersion is missing",
            ),
            ("- a\n".to_owned(), "expected a mapping"),
            ("a: [\n".to_owned(), "not valid YAML"),
        ];
        for (i, (text, expected)) in cases.iter().enumerate() {
            let path = write(&dir, &format!("bad{i}.yaml"), text);
            let err = parse(&["--config", path.to_str().unwrap()]).unwrap_err();
            assert!(
                err.contains("--config") && err.contains(&format!("bad{i}.yaml")),
                "{err}"
            );
            assert!(
                err.contains(expected),
                "case {i}: {err:?} lacks {expected:?}"
            );
        }
        let err = parse(&["--config", "/nonexistent/proxy.yaml"]).unwrap_err();
        assert!(err.contains("cannot read"), "{err}");
    }

    #[test]
    fn kubelet_configuration_defaults_and_overrides() {
        let dir = TempDir::new("kubelet");
        let path = write(
            &dir,
            "kubelet.yaml",
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             address: 127.0.0.1\ncgroupDriver: systemd\nfeatureGates: {A: true}\n\
             authentication:\n  x509: {clientCAFile: pki/ca.crt}\n  webhook: {cacheTTL: 0s}\n\
             authorization:\n  webhook: {cacheAuthorizedTTL: 1m}\n\
             tlsCertFile: /pki/kubelet.crt\ntlsPrivateKeyFile: /pki/kubelet.key\n\
             tlsMinVersion: VersionTLS13\ntlsCipherSuites: [TLS_AES_128_GCM_SHA256]\n\
             streamingConnectionIdleTimeout: 30m\n",
        );
        let kubelet = path.to_str().unwrap();
        let flags = parse(&["--kubelet-config", kubelet]).unwrap();
        // v1beta1 config-file defaults: anonymous off, token webhook on, mode Webhook.
        assert!(!flags.anonymous_auth);
        assert!(flags.authentication_token_webhook);
        assert_eq!(
            flags.authorization_mode,
            vec![crate::config::flags::AuthorizationMode::Webhook]
        );
        assert_eq!(
            flags.authentication_token_webhook_cache_ttl,
            std::time::Duration::from_secs(120),
            "a zero duration means the default"
        );
        assert_eq!(
            flags.authorization_webhook_cache_authorized_ttl,
            std::time::Duration::from_secs(60)
        );
        assert_eq!(flags.client_ca_file, Some(dir.0.join("pki/ca.crt")));
        assert_eq!(flags.tls_cert_file, Some(PathBuf::from("/pki/kubelet.crt")));
        assert_eq!(flags.tls_min_version, "VersionTLS13");
        assert_eq!(
            flags.streaming_connection_idle_timeout,
            std::time::Duration::from_secs(30 * 60)
        );

        // --config beats the KubeletConfiguration, and flags beat both.
        let config = write(
            &dir,
            "proxy.yaml",
            &format!("{HEADER}anonymousAuth: true\ntlsMinVersion: VersionTLS12\n"),
        );
        let flags = parse(&[
            "--kubelet-config",
            kubelet,
            "--config",
            config.to_str().unwrap(),
            "--authentication-token-webhook=false",
        ])
        .unwrap();
        assert!(flags.anonymous_auth);
        assert_eq!(flags.tls_min_version, "VersionTLS12");
        assert!(!flags.authentication_token_webhook);
    }

    #[test]
    fn kubelet_configuration_errors() {
        let dir = TempDir::new("kubelet-errors");
        let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
        let cases = [
            (
                format!("{head}cgroupDrivr: systemd\n"),
                "unknown field \"cgroupDrivr\"",
            ),
            (
                format!("{head}authentication:\n  webhook: {{enable: true}}\n"),
                "authentication: unknown field `enable`",
            ),
            (
                format!("{head}authorization: {{mode: RBAC}}\n"),
                "unknown authorization mode \"RBAC\"",
            ),
            (
                format!("{head}authentication:\n  webhook: {{cacheTTL: 2x}}\n"),
                "authentication.webhook.cacheTTL",
            ),
            (
                format!("{head}tlsCipherSuites: TLS_AES_128_GCM_SHA256\n"),
                "tlsCipherSuites must be a list",
            ),
            (
                "apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n".to_owned(),
                "apiVersion",
            ),
        ];
        for (i, (text, expected)) in cases.iter().enumerate() {
            let path = write(&dir, &format!("k{i}.yaml"), text);
            let err = parse(&["--kubelet-config", path.to_str().unwrap()]).unwrap_err();
            assert!(err.contains("--kubelet-config"), "{err}");
            assert!(
                err.contains(expected),
                "case {i}: {err:?} lacks {expected:?}"
            );
        }
    }
}

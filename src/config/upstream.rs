//! The kubelet (`--upstream`): its URL, the TLS client towards it and its files, reloadable, the
//! name its certificate is checked against, and the bounds on requests to it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Uri};
use rustls::pki_types::ServerName;

use super::ConfigError;
use super::error::{file_cause, flag_cause, flag_error, reload_cause};
use super::flags::ProxyFlags;
use super::serving::check_pair;
use crate::base::certificates::CertificateSource;
use crate::base::reload::{ReloadError, ReloadRegistry, Reloadable};
use crate::forward::{UpstreamEndpoint, UpstreamTarget, UpstreamTlsConfig};
use crate::tls::{self, UpstreamTls};

/// The kubelet, resolved, and the bounds on requests to it.
pub struct UpstreamSettings {
    /// Where and how to connect.
    pub endpoint: UpstreamEndpoint,
    /// `--forward-identity-headers`.
    pub forward_identity_headers: bool,
    /// `--upstream-connect-timeout`.
    pub connect_timeout: Duration,
    /// `--streaming-connection-idle-timeout`.
    pub streaming_idle_timeout: Duration,
    /// `--upstream-max-requests-inflight`.
    pub max_requests_inflight: usize,
    /// `--upstream-max-requests-inflight-per-user`.
    pub max_requests_inflight_per_user: usize,
}

/// Parses `--upstream` into a target; only a bare scheme://host[:port] or unix:///path is accepted,
/// so the forwarded path is always exactly the client's.
pub(super) fn upstream_target(url: &str) -> Result<UpstreamTarget, String> {
    if let Some(path) = url.strip_prefix("unix://") {
        if !path.starts_with('/') {
            return Err("a unix socket must be an absolute path: unix:///path/to/socket".into());
        }
        return Ok(UpstreamTarget::Unix {
            path: PathBuf::from(path),
        });
    }
    let uri: Uri = url.parse().map_err(|e| {
        format!("not a URL ({e}); expected https://host:port, http://host:port or unix:///path")
    })?;
    if uri.query().is_some() || !matches!(uri.path(), "" | "/") {
        return Err("must not have a path or query: the client's path is forwarded as is".into());
    }
    let authority: Authority = uri
        .authority()
        .cloned()
        .ok_or("missing host; expected https://host:port")?;
    match uri.scheme_str() {
        Some("https") => Ok(UpstreamTarget::Https { authority }),
        Some("http") => Ok(UpstreamTarget::Http { authority }),
        _ => Err("scheme must be https, http or unix".into()),
    }
}

/// The files the TLS client towards the kubelet is built from.
struct UpstreamTlsFiles {
    /// `--upstream-ca-file`.
    ca: PathBuf,
    /// `--upstream-client-cert-file` and `--upstream-client-key-file`.
    client_identity: Option<(PathBuf, PathBuf)>,
    /// See [`UpstreamTls::or_name`].
    or_name: Option<ServerName<'static>>,
}

impl UpstreamTlsFiles {
    /// The files, in the order they are read.
    fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.ca.clone()];
        if let Some((cert, key)) = &self.client_identity {
            paths.extend([cert.clone(), key.clone()]);
        }
        paths
    }

    /// The flag that names `path`.
    fn flag_of(&self, path: &Path) -> &'static str {
        match &self.client_identity {
            Some((cert, _)) if cert == path => "--upstream-client-cert-file",
            Some((_, key)) if key == path => "--upstream-client-key-file",
            _ => "--upstream-ca-file",
        }
    }

    /// The TLS client configuration from the files as they are now; errors name the flag and
    /// the file at fault.
    fn build(&self) -> Result<rustls::ClientConfig, ConfigError> {
        let client_identity = match &self.client_identity {
            Some((cert, key)) => {
                let cert_flag = ("--upstream-client-cert-file", cert.as_path());
                let key_flag = ("--upstream-client-key-file", key.as_path());
                let chain = tls::read_certs(cert).map_err(|e| file_cause(cert_flag.0, cert, e))?;
                let private = tls::read_key(key).map_err(|e| file_cause(key_flag.0, key, e))?;
                check_pair(&chain, &private, cert_flag, key_flag)?;
                Some((chain, private))
            }
            None => None,
        };
        let roots =
            tls::read_certs(&self.ca).map_err(|e| file_cause("--upstream-ca-file", &self.ca, e))?;
        tls::upstream_client_config(UpstreamTls {
            roots,
            client_identity,
            or_name: self.or_name.clone(),
        })
        .map_err(|e| flag_error("--upstream-client-cert-file", e))
    }
}

/// The TLS client towards the kubelet, registered for reloading: a rotated client certificate
/// or kubelet CA applies to the next connection to the kubelet; pooled connections keep theirs.
fn upstream_tls(
    files: UpstreamTlsFiles,
    reloads: &mut ReloadRegistry,
) -> Result<Arc<Reloadable<rustls::ClientConfig>>, ConfigError> {
    let paths = files.paths();
    reloads.certificates(CertificateSource::pem("upstream_ca", files.ca.clone()));
    if let Some((cert, _)) = &files.client_identity {
        reloads.certificates(CertificateSource::pem("upstream_client", cert.clone()));
    }
    let flag_of = |path: &Path| files.flag_of(path);
    let named: Vec<(PathBuf, &'static str)> =
        paths.iter().map(|p| (p.clone(), flag_of(p))).collect();
    reloads
        .load("upstream_tls", paths, move |_| files.build())
        .map_err(|e| match e {
            ReloadError::Build(cause) => match cause.downcast::<ConfigError>() {
                Ok(e) => *e,
                Err(cause) => flag_error("--upstream-ca-file", cause.to_string()),
            },
            ReloadError::Read { ref path, .. } | ReloadError::Empty { ref path } => {
                let flag = named
                    .iter()
                    .find(|(p, _)| p == path)
                    .map_or("--upstream-ca-file", |(_, flag)| *flag);
                reload_cause(flag, &path.clone(), e)
            }
            e => flag_error("--upstream-ca-file", e.to_string()),
        })
}

/// The kubelet from `--upstream` and its TLS flags, resolved, with the bounds on requests to it.
pub(super) fn upstream(
    flags: &ProxyFlags,
    node_name: Option<&str>,
    reloads: &mut ReloadRegistry,
) -> Result<UpstreamSettings, ConfigError> {
    if flags.upstream_max_requests_inflight_per_user > flags.upstream_max_requests_inflight {
        return Err(flag_error(
            "--upstream-max-requests-inflight-per-user",
            format!(
                "{} is more than --upstream-max-requests-inflight={}; a user's share must fit in the total",
                flags.upstream_max_requests_inflight_per_user, flags.upstream_max_requests_inflight
            ),
        ));
    }
    let url = flags
        .upstream
        .as_deref()
        .ok_or_else(|| flag_error("--upstream", "required (e.g. https://127.0.0.1:10250)"))?;
    let target = upstream_target(url).map_err(|e| flag_error("--upstream", e))?;
    if flags.forward_identity_headers && !identity_headers_stay_local(&target) {
        return Err(flag_error(
            "--forward-identity-headers",
            format!(
                "would send X-Remote-* identity headers in clear text over the network to {url}; \
                 use an https:// upstream, a unix:// socket, or a loopback http:// address"
            ),
        ));
    }
    let client_identity = match (
        &flags.upstream_client_cert_file,
        &flags.upstream_client_key_file,
    ) {
        (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
        (None, None) => None,
        (Some(_), None) => {
            return Err(flag_error(
                "--upstream-client-key-file",
                "required with --upstream-client-cert-file",
            ));
        }
        (None, Some(_)) => {
            return Err(flag_error(
                "--upstream-client-cert-file",
                "required with --upstream-client-key-file",
            ));
        }
    };
    let tls = match &target {
        UpstreamTarget::Https { .. } => {
            let ca = flags.upstream_ca_file.clone().ok_or_else(|| {
                flag_error("--upstream-ca-file", "required for an https --upstream")
            })?;
            let files = UpstreamTlsFiles {
                ca,
                client_identity,
                or_name: node_name.and_then(|n| node_name_fallback(flags, &target, n)),
            };
            Some(upstream_tls(files, reloads)?)
        }
        _ => {
            if client_identity.is_some() || flags.upstream_ca_file.is_some() {
                return Err(flag_error(
                    "--upstream",
                    "TLS files for the upstream are given but --upstream is not https://",
                ));
            }
            None
        }
    };
    let server_name = match &flags.upstream_server_name {
        Some(name) => Some(
            ServerName::try_from(name.clone())
                .map_err(|e| flag_cause("--upstream-server-name", e))?,
        ),
        None => None,
    };
    Ok(UpstreamSettings {
        endpoint: UpstreamEndpoint::resolve(
            target,
            tls.map(UpstreamTlsConfig::Reloaded),
            server_name,
        )
        .map_err(|e| flag_cause("--upstream", e))?,
        forward_identity_headers: flags.forward_identity_headers,
        connect_timeout: flags.upstream_connect_timeout,
        streaming_idle_timeout: flags.streaming_connection_idle_timeout,
        max_requests_inflight: flags.upstream_max_requests_inflight as usize,
        max_requests_inflight_per_user: flags.upstream_max_requests_inflight_per_user as usize,
    })
}

/// Without `--upstream-server-name`, a loopback upstream's certificate may also be valid for the
/// node's name (see `tls::upstream_name`).
fn node_name_fallback(
    flags: &ProxyFlags,
    target: &UpstreamTarget,
    node_name: &str,
) -> Option<ServerName<'static>> {
    let UpstreamTarget::Https { authority } = target else {
        return None;
    };
    if flags.upstream_server_name.is_some() || !is_loopback(authority) {
        return None;
    }
    ServerName::try_from(node_name.to_owned()).ok()
}

/// Whether identity headers sent to `target` stay off the network or are encrypted: https, a unix
/// socket, or plain http to a loopback address (`localhost` or an IP literal in 127.0.0.0/8 or
/// `::1`). A name other than `localhost` could resolve anywhere, so it does not count.
fn identity_headers_stay_local(target: &UpstreamTarget) -> bool {
    match target {
        UpstreamTarget::Https { .. } | UpstreamTarget::Unix { .. } => true,
        UpstreamTarget::Http { authority } => is_loopback(authority),
    }
}

/// Whether `authority` names this host's loopback: `localhost`, or an IP literal in 127.0.0.0/8
/// or `::1`. A name other than `localhost` could resolve anywhere, so it does not count.
fn is_loopback(authority: &Authority) -> bool {
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_headers_travel_only_encrypted_or_on_loopback() {
        for (url, local) in [
            ("https://10.0.0.1:10250", true),
            ("unix:///run/kubelet.sock", true),
            ("http://127.0.0.1:10255", true),
            ("http://127.9.9.9:10255", true),
            ("http://localhost:10255", true),
            ("http://[::1]:10255", true),
            ("http://10.0.0.1:10255", false),
            ("http://node-1.example:10255", false),
            ("http://[2001:db8::1]:10255", false),
        ] {
            let target = upstream_target(url).unwrap();
            assert_eq!(identity_headers_stay_local(&target), local, "{url}");
        }
    }

    #[test]
    fn upstream_forms() {
        assert!(matches!(
            upstream_target("https://127.0.0.1:10250"),
            Ok(UpstreamTarget::Https { .. })
        ));
        assert!(matches!(
            upstream_target("http://localhost:10255/"),
            Ok(UpstreamTarget::Http { .. })
        ));
        assert!(matches!(
            upstream_target("unix:///run/kubelet.sock"),
            Ok(UpstreamTarget::Unix { .. })
        ));
        for bad in [
            "unix://relative.sock",
            "https://h:1/prefix",
            "https://h:1/?q=1",
            "ftp://h",
            "/just/a/path",
            "https://",
        ] {
            assert!(upstream_target(bad).is_err(), "{bad} should be refused");
        }
    }
}

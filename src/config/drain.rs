//! What happens to sessions after a handover: `--session-drain-timeout` and
//! `--drain-release-pod`, validated, with the API server client the release needs.

use std::time::Duration;

use super::error::flag_error;
use super::flags::ProxyFlags;
use super::warnings::Warning;
use crate::apiserver::ApiServerSettings;
use crate::base::names::{is_dns1123_label, is_dns1123_subdomain};
use crate::config::ConfigError;

/// How a stopped proxy treats the sessions still open once a successor serves.
pub struct DrainSettings {
    /// `--session-drain-timeout`: zero closes them with the grace period.
    pub session_timeout: Duration,
    /// `--drain-release-pod`: the pod to label so its DaemonSet lets go of it.
    pub release: Option<PodRelease>,
}

/// The proxy's own pod and the API server it is labelled through.
pub struct PodRelease {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// `--kubeconfig` (or the pod's service account), bounded by `--apiserver-request-timeout`.
    pub apiserver: ApiServerSettings,
}

/// Reads the drain flags; warns of a combination that cannot work as meant.
pub(super) fn drain_settings(
    flags: &ProxyFlags,
    warnings: &mut Vec<Warning>,
) -> Result<DrainSettings, ConfigError> {
    let release = match &flags.drain_release_pod {
        None => None,
        Some(value) => {
            let (namespace, name) = parse_pod(value)?;
            let apiserver =
                ApiServerSettings::read(flags.kubeconfig.as_deref(), flags.apiserver_request_timeout)
                    .map_err(|e| ConfigError::Flag {
                        flag: "--drain-release-pod",
                        reason: format!(
                            "{e}; labelling the pod needs the API server (--kubeconfig, or the pod's service account)"
                        ),
                        source: Some(Box::new(e)),
                    })?;
            Some(PodRelease {
                namespace,
                name,
                apiserver,
            })
        }
    };
    if release.is_some() && flags.handover_socket.is_none() {
        warnings.push(Warning::new(
            "--drain-release-pod",
            "has no effect without --handover-socket: a pod hands its sockets to the next one only \
             there, and without a successor the sessions are closed with the grace period",
        ));
    }
    if release.is_some() && flags.session_drain_timeout.is_zero() {
        warnings.push(Warning::new(
            "--drain-release-pod",
            "has no effect with --session-drain-timeout=0: sessions are closed with the grace period",
        ));
    }
    if release.is_none()
        && flags.handover_socket.is_some()
        && !flags.session_drain_timeout.is_zero()
        && std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
    {
        warnings.push(Warning::new(
            "--session-drain-timeout",
            format!(
                "in a pod with --handover-socket but no --drain-release-pod, a stopped pod stays its \
                 DaemonSet's while its sessions drain, and the DaemonSet's rollout waits for it (up to \
                 {:?} per node); set --drain-release-pod=$(POD_NAMESPACE)/$(POD_NAME) (the shipped \
                 DaemonSet does), or --session-drain-timeout=0",
                flags.session_drain_timeout
            ),
        ));
    }
    Ok(DrainSettings {
        session_timeout: flags.session_drain_timeout,
        release,
    })
}

/// `NAMESPACE/NAME`, each as the API server validates it.
fn parse_pod(value: &str) -> Result<(String, String), ConfigError> {
    let hint = "give NAMESPACE/NAME of the proxy's own pod, e.g. \
                --drain-release-pod=$(POD_NAMESPACE)/$(POD_NAME) with both from the downward API";
    let Some((namespace, name)) = value.split_once('/') else {
        return Err(flag_error(
            "--drain-release-pod",
            format!("{value:?} is not NAMESPACE/NAME; {hint}"),
        ));
    };
    if !is_dns1123_label(namespace) {
        return Err(flag_error(
            "--drain-release-pod",
            format!("{namespace:?} is not a namespace name (a DNS-1123 label); {hint}"),
        ));
    }
    if !is_dns1123_subdomain(name) {
        return Err(flag_error(
            "--drain-release-pod",
            format!("{name:?} is not a pod name (a DNS-1123 subdomain); {hint}"),
        ));
    }
    Ok((namespace.to_owned(), name.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_is_namespace_slash_name_as_the_api_server_validates_them() {
        assert_eq!(
            parse_pod("kube-system/kubelet-auth-proxy-x7k2p").unwrap(),
            ("kube-system".into(), "kubelet-auth-proxy-x7k2p".into())
        );
        for bad in [
            "kubelet-auth-proxy-x7k2p",
            "/name",
            "kube-system/",
            "Kube-System/name",
            "kube-system/a/b",
            "$(POD_NAMESPACE)/$(POD_NAME)",
        ] {
            let error = parse_pod(bad).unwrap_err().to_string();
            assert!(
                error.contains("--drain-release-pod") && error.contains("downward API"),
                "{bad}: {error}"
            );
        }
    }

    fn flags(args: &[&str]) -> ProxyFlags {
        use clap::{Args as _, FromArgMatches as _};
        let command = ProxyFlags::augment_args(clap::Command::new("kubelet-auth-proxy"));
        let matches = command
            .try_get_matches_from(std::iter::once("kubelet-auth-proxy").chain(args.iter().copied()))
            .unwrap();
        ProxyFlags::from_arg_matches(&matches).unwrap()
    }

    #[tokio::test]
    async fn a_pod_that_cannot_be_labelled_is_a_config_error_naming_the_flag_and_the_api_server() {
        let mut warnings = Vec::new();
        let Err(error) = drain_settings(
            &flags(&[
                "--drain-release-pod=kube-system/kubelet-auth-proxy-x7k2p",
                "--kubeconfig=/nonexistent/kubeconfig",
            ]),
            &mut warnings,
        ) else {
            panic!("a kubeconfig that cannot be read was accepted");
        };
        let error = error.to_string();
        assert!(
            error.contains("--drain-release-pod")
                && error.contains("labelling the pod needs the API server"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn the_defaults_drain_for_four_hours_and_release_nothing() {
        let mut warnings = Vec::new();
        let settings = drain_settings(&flags(&[]), &mut warnings).unwrap();
        assert_eq!(settings.session_timeout, Duration::from_secs(4 * 3600));
        assert!(settings.release.is_none());
        assert!(warnings.is_empty(), "{warnings:?}");
    }
}

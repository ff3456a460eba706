//! The configuration error: one line naming the flag and, for files, the path, with the library's
//! error kept as its source; and the constructors every reader of flags and files uses.

use std::error::Error as StdError;
use std::path::{Path, PathBuf};

use super::flags::ProxyFlags;
use crate::apiserver::ApiClientError;
use crate::base::reload::ReloadError;

/// The cause of a configuration problem, kept so that callers can tell one failure from another.
pub type Cause = Box<dyn StdError + Send + Sync>;

/// A configuration problem, reported before anything is served.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A flag's value is wrong or missing.
    #[error("{flag}: {reason}")]
    Flag {
        /// The flag, e.g. `--upstream`.
        flag: &'static str,
        /// What is wrong.
        reason: String,
        /// The underlying error, when a library reported one.
        #[source]
        source: Option<Cause>,
    },
    /// A file named by a flag is missing, unreadable or malformed.
    #[error("{flag} {}: {reason}", path.display())]
    File {
        /// The flag that named the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
        /// The underlying error, when a library reported one.
        #[source]
        source: Option<Cause>,
    },
}

impl ConfigError {
    /// The flag the problem is about.
    pub fn flag(&self) -> &'static str {
        match self {
            ConfigError::Flag { flag, .. } | ConfigError::File { flag, .. } => flag,
        }
    }
}

/// A flag whose value is wrong or missing, for a reason of this proxy's own.
pub(super) fn flag_error(flag: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Flag {
        flag,
        reason: reason.into(),
        source: None,
    }
}

/// A file named by a flag that is wrong, for a reason of this proxy's own.
pub(crate) fn file_error(
    flag: &'static str,
    path: &Path,
    reason: impl Into<String>,
) -> ConfigError {
    ConfigError::File {
        flag,
        path: path.to_owned(),
        reason: reason.into(),
        source: None,
    }
}

/// A flag whose value a library refused, with its error kept as the source.
pub(super) fn flag_cause(
    flag: &'static str,
    cause: impl StdError + Send + Sync + 'static,
) -> ConfigError {
    ConfigError::Flag {
        flag,
        reason: cause.to_string(),
        source: Some(Box::new(cause)),
    }
}

/// A reloadable value that could not be loaded from `path`, without naming the file twice when
/// the file at fault is the flag's own.
pub(super) fn reload_cause(flag: &'static str, path: &Path, e: ReloadError) -> ConfigError {
    let reason = match &e {
        ReloadError::Read { path: at, source } if at == path => format!("cannot read: {source}"),
        ReloadError::Empty { path: at } if at == path => "the file is empty".to_owned(),
        other => other.to_string(),
    };
    ConfigError::File {
        flag,
        path: path.to_owned(),
        reason,
        source: Some(Box::new(e)),
    }
}

/// A file a library refused, with its error kept as the source.
pub(crate) fn file_cause(
    flag: &'static str,
    path: &Path,
    cause: impl StdError + Send + Sync + 'static,
) -> ConfigError {
    ConfigError::File {
        flag,
        path: path.to_owned(),
        reason: cause.to_string(),
        source: Some(Box::new(cause)),
    }
}

/// A client error attributed to `--kubeconfig` (its file, or its absence).
pub(super) fn kubeconfig_error(flags: &ProxyFlags, e: ApiClientError) -> ConfigError {
    match &flags.kubeconfig {
        Some(path) => file_cause("--kubeconfig", path, e),
        None => ConfigError::Flag {
            flag: "--kubeconfig",
            reason: format!(
                "{e}; the API server is needed by --authentication-token-webhook and --authorization-mode=Webhook or RBAC"
            ),
            source: Some(Box::new(e)),
        },
    }
}

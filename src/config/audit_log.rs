//! The audit log (`--audit-log-path`, its rotation and truncation flags, its policy), checked
//! without creating, writing or removing anything.

use std::path::PathBuf;

use super::audit_policy::audit_policy;
use super::error::{file_cause, flag_error};
use super::flags::ProxyFlags;
use super::warnings::Warning;
use super::{AuthorizationSettings, ConfigError};
use crate::audit::policy::AuditPolicy;
use crate::audit::{self, AuditOptions, AuditTarget, Rotation};

/// The audit log, checked but not opened.
pub struct AuditSettings {
    /// A file or standard output.
    pub target: AuditTarget,
    /// Rotation and truncation.
    pub options: AuditOptions,
    /// `--audit-log-path` as given, for errors.
    pub path: PathBuf,
    /// `--audit-policy-file`: which events are written; `None` writes every one.
    pub policy: Option<AuditPolicy>,
}

/// Checks `--audit-log-path` and its rotation and truncation flags without creating, writing or
/// removing anything: the directory must exist and be writable, and the file, if present, must be
/// a regular file.
pub(super) fn audit_settings(
    flags: &ProxyFlags,
    authorization: Option<&AuthorizationSettings>,
    warnings: &mut Vec<Warning>,
) -> Result<Option<AuditSettings>, ConfigError> {
    let policy = audit_policy(flags, authorization, warnings)?;
    let Some(path) = &flags.audit_log_path else {
        return Ok(None);
    };
    let target = AuditTarget::from_flag(path.clone());
    if let AuditTarget::File(file) = &target {
        if flags.audit_log_maxsize == 0 {
            warnings.push(Warning::new(
                "--audit-log-maxsize",
                "0: the audit log is never rotated and can fill its disk",
            ));
        } else if flags.audit_log_maxbackup == 0 {
            warnings.push(Warning::new(
                "--audit-log-maxbackup",
                "0: every rotated audit log is kept; together they can fill their disk",
            ));
        }
        audit::check_file_target(file).map_err(|e| file_cause("--audit-log-path", path, e))?;
        let max_event = flags.audit_log_truncate_max_event_size;
        if flags.audit_log_truncate_enabled
            && flags.audit_log_maxsize > 0
            && max_event > flags.audit_log_maxsize.saturating_mul(1024 * 1024)
        {
            return Err(flag_error(
                "--audit-log-truncate-max-event-size",
                format!(
                    "{max_event} bytes is more than --audit-log-maxsize ({} MB): an event that \
                     large could never be written; lower it or raise --audit-log-maxsize",
                    flags.audit_log_maxsize
                ),
            ));
        }
    }
    if flags.audit_log_flood_retention.is_zero() {
        warnings.push(Warning::new(
            "--audit-log-flood-retention",
            "0: the audit flood budget is off; any caller who can send requests can rotate \
             earlier events (an exec) out of every kept audit file",
        ));
    }
    Ok(Some(AuditSettings {
        target,
        options: AuditOptions {
            rotation: Rotation {
                max_size_mb: flags.audit_log_maxsize,
                max_backups: flags.audit_log_maxbackup,
            },
            max_event_size: flags
                .audit_log_truncate_enabled
                .then_some(flags.audit_log_truncate_max_event_size as usize),
            flood_retention: Some(flags.audit_log_flood_retention).filter(|r| !r.is_zero()),
        },
        path: path.clone(),
        policy,
    }))
}

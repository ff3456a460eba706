//! The audit file with kube-apiserver's (lumberjack's) size-based rotation and backup names.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::write_utc;

/// lumberjack's megabyte, the unit of `--audit-log-maxsize`.
pub(super) const MEGABYTE: u64 = 1024 * 1024;
/// Mode of a new audit log file: it names every caller, so only its owner reads it.
pub(super) const NEW_FILE_MODE: u32 = 0o600;
/// Tries at a free backup name, one millisecond apart, before a rotation gives up.
pub(super) const BACKUP_NAME_TRIES: u32 = 1000;

/// Size-based rotation of a file target with kube-apiserver's (lumberjack's) semantics: before a
/// line would take the file past `max_size_mb` MiB, the file is renamed to
/// `<stem>-<UTC time as 2006-01-02T15-04-05.000>.<ext>` and a new one started with the old one's
/// mode; then only the newest `max_backups` backups are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rotation {
    /// `--audit-log-maxsize`; 0 never rotates.
    pub max_size_mb: u64,
    /// `--audit-log-maxbackup`; 0 keeps every backup.
    pub max_backups: u32,
}

/// Whether a line fits in the current file.
pub(super) enum Fit {
    Fits,
    /// Rotate first, then write.
    Rotate,
    /// Larger than the maximum size on its own: lumberjack refuses such a write.
    TooLarge,
}

/// The audit file with lumberjack's size-based rotation.
pub(super) struct RotatingFile {
    path: PathBuf,
    /// `None` after a failed write or rotation: reopened before the next event.
    file: Option<File>,
    /// Bytes in the file, including those pending in the writer's batch.
    pub(super) size: u64,
    /// In bytes; 0 never rotates.
    max_size: u64,
    max_backups: u32,
}

impl RotatingFile {
    pub(super) fn open(path: PathBuf, rotation: Rotation) -> io::Result<RotatingFile> {
        if path.file_name().is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("audit log path {} names no file", path.display()),
            ));
        }
        let mut file = RotatingFile {
            path,
            file: None,
            size: 0,
            max_size: rotation.max_size_mb.saturating_mul(MEGABYTE),
            max_backups: rotation.max_backups,
        };
        file.ensure_open()?;
        file.remove_old_backups();
        Ok(file)
    }

    /// Opens the file for appending (creating it 0600) unless it is open.
    pub(super) fn ensure_open(&mut self) -> io::Result<()> {
        if self.file.is_none() {
            let file = OpenOptions::new()
                .append(true)
                .create(true)
                .mode(NEW_FILE_MODE)
                .open(&self.path)?;
            self.size = file.metadata()?.len();
            self.file = Some(file);
        }
        Ok(())
    }

    pub(super) fn fit(&self, len: u64) -> Fit {
        if self.max_size == 0 {
            Fit::Fits
        } else if len > self.max_size {
            Fit::TooLarge
        } else if self.size + len > self.max_size {
            Fit::Rotate
        } else {
            Fit::Fits
        }
    }

    pub(super) fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        let written = match &mut self.file {
            Some(file) => file.write_all(bytes),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the audit log file is not open",
            )),
        };
        if written.is_err() {
            self.file = None;
        }
        written
    }

    /// Renames the file to a backup name, starts a new one with the same mode, and removes the
    /// backups beyond `max_backups`. On failure the file is left closed, to be reopened (and
    /// rotation retried) at the next event.
    pub(super) fn rotate(&mut self) -> io::Result<()> {
        let mode = match self.file.take() {
            Some(file) => file.metadata()?.permissions().mode() & 0o777,
            None => NEW_FILE_MODE,
        };
        let backup = self.free_backup_name(SystemTime::now())?;
        fs::rename(&self.path, &backup)?;
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&self.path)?;
        self.file = Some(file);
        self.size = 0;
        self.remove_old_backups();
        Ok(())
    }

    /// The backup name for `now`, or the first free one a millisecond later: lumberjack would
    /// overwrite an existing backup, which would destroy audit records.
    pub(super) fn free_backup_name(&self, now: SystemTime) -> io::Result<PathBuf> {
        for step in 0..BACKUP_NAME_TRIES {
            let candidate = backup_path(&self.path, now + Duration::from_millis(step.into()));
            if !candidate.try_exists()? {
                return Ok(candidate);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "no free audit log backup name",
        ))
    }

    /// lumberjack's cleanup: among the files named `<stem>-<timestamp><ext>` next to the log,
    /// keeps the `max_backups` newest by the time in their name and removes the rest. Failures
    /// are logged; they never stop the log.
    pub(super) fn remove_old_backups(&self) {
        if self.max_backups == 0 {
            return;
        }
        let dir = match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "cannot list audit log backups");
                return;
            }
        };
        let Some(name) = self.path.file_name() else {
            return;
        };
        let (stem, ext) = split_extension(name.as_bytes());
        let mut backups: Vec<(Vec<u8>, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|entry| entry.file_type().is_ok_and(|t| !t.is_dir()))
            .filter_map(|entry| {
                let name = entry.file_name().into_vec();
                let stamp = backup_timestamp(&name, stem, ext)?.to_vec();
                Some((stamp, entry.path()))
            })
            .collect();
        // The timestamps are fixed-width and zero-padded: byte order is time order.
        backups.sort_unstable_by(|a, b| b.cmp(a));
        for (_, old) in backups.iter().skip(self.max_backups as usize) {
            if let Err(error) = fs::remove_file(old) {
                tracing::warn!(file = %old.display(), %error, "cannot remove old audit log backup");
            }
        }
    }
}

/// Splits a file name as Go's `filepath.Ext`: the extension starts at the last dot.
pub(super) fn split_extension(name: &[u8]) -> (&[u8], &[u8]) {
    match name.iter().rposition(|&b| b == b'.') {
        Some(dot) => name.split_at(dot),
        None => (name, &[]),
    }
}

/// `<dir>/<stem>-<2006-01-02T15-04-05.000 in UTC><ext>`, lumberjack's backup name.
pub(super) fn backup_path(path: &Path, time: SystemTime) -> PathBuf {
    let name = path.file_name().map_or(&[][..], |n| n.as_bytes());
    let (stem, ext) = split_extension(name);
    let mut stamp = String::from("-");
    // Writing into a String cannot fail.
    let _ = write_utc(&mut stamp, time, '-', 3);
    let mut backup = Vec::with_capacity(name.len() + stamp.len());
    backup.extend_from_slice(stem);
    backup.extend_from_slice(stamp.as_bytes());
    backup.extend_from_slice(ext);
    path.with_file_name(std::ffi::OsString::from_vec(backup))
}

/// The timestamp part of a backup file name, when `name` is `<stem>-<timestamp><ext>`.
pub(super) fn backup_timestamp<'a>(name: &'a [u8], stem: &[u8], ext: &[u8]) -> Option<&'a [u8]> {
    const SHAPE: &[u8] = b"0000-00-00T00-00-00.000";
    let stamp = name
        .strip_prefix(stem)?
        .strip_prefix(b"-")?
        .strip_suffix(ext)?;
    let well_formed = stamp.len() == SHAPE.len()
        && stamp.iter().zip(SHAPE).all(|(&c, &shape)| {
            if shape == b'0' {
                c.is_ascii_digit()
            } else {
                c == shape
            }
        });
    well_formed.then_some(stamp)
}

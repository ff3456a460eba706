//! Who may reach the directory of `--handover-socket` beyond what its mode says: its POSIX access
//! ACL (`setfacl -m u:20001:rwx DIR`), which the kernel applies over the mode bits. A named entry
//! lets its user or group in although the mode (`0770`, the group's bits being the ACL's mask
//! then) looks closed, so the directory check reads the ACL and decides on the effective access.
//!
//! The ACL is the `system.posix_acl_access` extended attribute, in the kernel's format
//! (`include/uapi/linux/posix_acl_xattr.h`): a 4-byte little-endian version (2), then 8-byte
//! entries of a 16-bit tag, 16-bit permissions and a 32-bit id, all little-endian.

use std::fmt;
use std::path::Path;

/// The attribute holding a file's access ACL.
const ACCESS_ACL: &str = "system.posix_acl_access";
/// The only version of the format.
const VERSION: u32 = 2;
/// The largest value an extended attribute can have on Linux (`XATTR_SIZE_MAX`).
const MAX_XATTR: usize = 64 * 1024;

/// The file's owner (its permissions are the mode's owner bits).
const USER_OBJ: u16 = 0x01;
/// A user named by id.
const USER: u16 = 0x02;
/// The file's group (its permissions are under the mask).
const GROUP_OBJ: u16 = 0x04;
/// A group named by id.
const GROUP: u16 = 0x08;
/// The most any named entry and the file's group get.
const MASK: u16 = 0x10;
/// Everyone else (the mode's other bits).
const OTHER: u16 = 0x20;

/// Read, write and search (execute) permissions, as in the mode's bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Perm(u16);

impl Perm {
    /// Whether it grants anything at all.
    pub(super) fn any(self) -> bool {
        self.0 & 0o7 != 0
    }

    /// Whether it lets its holder create, rename and delete files in a directory.
    pub(super) fn writes(self) -> bool {
        self.0 & 0o2 != 0
    }
}

impl fmt::Display for Perm {
    /// As `getfacl` writes it: `rwx`, `r-x`, …
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (bit, letter) in [(0o4, 'r'), (0o2, 'w'), (0o1, 'x')] {
            let shown = if self.0 & bit != 0 { letter } else { '-' };
            write!(f, "{shown}")?;
        }
        Ok(())
    }
}

/// Who an entry names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Named {
    /// A user, by uid.
    User(u32),
    /// A group, by gid.
    Group(u32),
}

/// A named entry of the ACL with the access it effectively grants (its permissions under the
/// mask), as `getfacl` names it: `user:20001:rwx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Entry {
    /// The user or group.
    pub(super) named: Named,
    /// Its permissions under the mask.
    pub(super) effective: Perm,
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.named {
            Named::User(uid) => write!(f, "user:{uid}:{}", self.effective),
            Named::Group(gid) => write!(f, "group:{gid}:{}", self.effective),
        }
    }
}

/// What an access ACL grants beyond the owner and others, whose bits the mode carries anyway.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Acl {
    /// The file's group's permissions under the mask (the mode's group bits are the mask).
    pub(super) owning_group: Option<Perm>,
    /// Every named user and group, with what they effectively get.
    pub(super) named: Vec<Entry>,
}

/// Why an ACL could not be read or made sense of: the directory is then refused, as one whose
/// access cannot be told.
#[derive(Debug, thiserror::Error)]
pub enum AclError {
    /// Reading the attribute failed for another reason than there being none.
    #[error("cannot read its ACL ({ACCESS_ACL}): {0}")]
    Read(#[source] std::io::Error),
    /// The attribute is not in the kernel's format.
    #[error("its ACL ({ACCESS_ACL}) is not in the format this proxy reads: {0}")]
    Format(&'static str),
}

/// The access ACL of `path` (following symbolic links, as the mode check does), or `None` when
/// it has none or its file system keeps none: the mode alone then says who gets in.
pub(super) fn read(path: &Path) -> Result<Option<Acl>, AclError> {
    let mut value = vec![0u8; MAX_XATTR];
    match rustix::fs::getxattr(path, ACCESS_ACL, &mut value[..]) {
        Ok(len) => decode(value.get(..len).unwrap_or_default()).map(Some),
        Err(rustix::io::Errno::NODATA | rustix::io::Errno::NOTSUP) => Ok(None),
        Err(e) => Err(AclError::Read(e.into())),
    }
}

/// Decodes the attribute's value.
pub(super) fn decode(value: &[u8]) -> Result<Acl, AclError> {
    let (header, entries) = value
        .split_first_chunk::<4>()
        .ok_or(AclError::Format("shorter than its header"))?;
    if u32::from_le_bytes(*header) != VERSION {
        return Err(AclError::Format("not version 2"));
    }
    if entries.len() % 8 != 0 {
        return Err(AclError::Format("a partial entry"));
    }
    let mut mask = None;
    let mut owning_group = None;
    let mut named = Vec::new();
    for entry in entries.chunks_exact(8) {
        let tag = u16::from_le_bytes([entry[0], entry[1]]);
        let perm = Perm(u16::from_le_bytes([entry[2], entry[3]]) & 0o7);
        let id = u32::from_le_bytes([entry[4], entry[5], entry[6], entry[7]]);
        match tag {
            USER => named.push((Named::User(id), perm)),
            GROUP => named.push((Named::Group(id), perm)),
            GROUP_OBJ => owning_group = Some(perm),
            MASK => mask = Some(perm),
            USER_OBJ | OTHER => {}
            _ => return Err(AclError::Format("an entry of an unknown kind")),
        }
    }
    // Without a mask (an ACL of the three base entries only) nothing is masked.
    let under_mask = |perm: Perm| Perm(perm.0 & mask.map_or(0o7, |mask: Perm| mask.0));
    Ok(Acl {
        owning_group: owning_group.map(under_mask),
        named: named
            .into_iter()
            .map(|(named, perm)| Entry {
                named,
                effective: under_mask(perm),
            })
            .collect(),
    })
}

#[cfg(test)]
pub(super) mod tests {
    pub(in crate::server::handover_socket) use super::decode;
    use super::*;

    /// The attribute's value for `entries` of (tag, permissions, id), as the kernel writes it.
    pub(in crate::server::handover_socket) fn xattr(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut value = VERSION.to_le_bytes().to_vec();
        for &(tag, perm, id) in entries {
            value.extend(tag.to_le_bytes());
            value.extend(perm.to_le_bytes());
            value.extend(id.to_le_bytes());
        }
        value
    }

    /// The entries `setfacl -m u:20001:rwx` leaves on a 0770 directory.
    pub(in crate::server::handover_socket) fn named_user(
        uid: u32,
        perm: u16,
        mask: u16,
    ) -> Vec<u8> {
        xattr(&[
            (USER_OBJ, 0o7, u32::MAX),
            (USER, perm, uid),
            (GROUP_OBJ, 0o7, u32::MAX),
            (MASK, mask, u32::MAX),
            (OTHER, 0, u32::MAX),
        ])
    }

    #[test]
    fn every_class_of_attribute_decodes_to_the_effective_access_or_is_refused() {
        let user = |uid, effective| Entry {
            named: Named::User(uid),
            effective: Perm(effective),
        };
        let group = |gid, effective| Entry {
            named: Named::Group(gid),
            effective: Perm(effective),
        };
        let base = [(USER_OBJ, 0o7, 0), (GROUP_OBJ, 0o5, 0), (OTHER, 0, 0)];
        // (what, the attribute, what it decodes to or the refusal's words)
        let cases: [(&str, Vec<u8>, Result<Acl, &str>); 8] = [
            (
                "the three base entries",
                xattr(&base),
                Ok(Acl {
                    owning_group: Some(Perm(0o5)),
                    named: vec![],
                }),
            ),
            (
                "a named user, all its permissions within the mask",
                named_user(20001, 0o7, 0o7),
                Ok(Acl {
                    owning_group: Some(Perm(0o7)),
                    named: vec![user(20001, 0o7)],
                }),
            ),
            (
                "a named user and the group under a mask of r-x",
                named_user(20001, 0o7, 0o5),
                Ok(Acl {
                    owning_group: Some(Perm(0o5)),
                    named: vec![user(20001, 0o5)],
                }),
            ),
            (
                "a named group masked to nothing",
                xattr(&[
                    (USER_OBJ, 0o7, 0),
                    (GROUP_OBJ, 0o7, 0),
                    (GROUP, 0o7, 30000),
                    (MASK, 0, 0),
                    (OTHER, 0, 0),
                ]),
                Ok(Acl {
                    owning_group: Some(Perm(0)),
                    named: vec![group(30000, 0)],
                }),
            ),
            ("an empty value", vec![], Err("shorter than its header")),
            (
                "another version",
                {
                    let mut value = xattr(&base);
                    value[0] = 1;
                    value
                },
                Err("not version 2"),
            ),
            (
                "a cut entry",
                {
                    let mut value = xattr(&base);
                    value.pop();
                    value
                },
                Err("a partial entry"),
            ),
            (
                "an unknown tag",
                xattr(&[(0x40, 0o7, 0)]),
                Err("an entry of an unknown kind"),
            ),
        ];
        for (what, value, expected) in cases {
            match (decode(&value), expected) {
                (Ok(acl), Ok(expected)) => assert_eq!(acl, expected, "{what}"),
                (Err(e), Err(words)) => assert!(e.to_string().contains(words), "{what}: {e}"),
                (got, expected) => panic!("{what}: got {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn an_entry_is_named_as_getfacl_names_it() {
        let entry = Entry {
            named: Named::User(20001),
            effective: Perm(0o5),
        };
        assert_eq!(entry.to_string(), "user:20001:r-x");
        let entry = Entry {
            named: Named::Group(30000),
            effective: Perm(0o7),
        };
        assert_eq!(entry.to_string(), "group:30000:rwx");
    }
}

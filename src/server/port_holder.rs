//! Who holds a TCP address this process cannot bind: the listening sockets on it, from
//! `/proc/net/tcp` and `/proc/net/tcp6` (this network namespace's, which a host-network pod
//! shares with the node), and the processes holding them, from the `socket:[inode]` links under
//! `/proc/<pid>/fd` (best effort: a process of another user, or of another pid namespace, stays
//! unseen unless this one may trace it). So that an operator reads who holds the port in the
//! log and on `/readyz`, and the standby tells a previous version of the proxy from anything else.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The kernel's state number of a listening socket.
const LISTEN: &str = "0A";
/// The most descriptors looked at in one search, over all processes: finding the holder stays
/// bounded on a node with very many of them; past it, holders not yet found stay unseen.
const MAX_DESCRIPTORS: usize = 1 << 20;

/// A listening socket: its inode and the user it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Socket {
    /// The socket's inode, as in the `socket:[inode]` links of its holders' descriptors.
    pub inode: u64,
    /// The user that created it.
    pub uid: u32,
}

/// A process holding one of the sockets.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Process {
    /// Its pid, in this process's pid namespace.
    pub pid: u32,
    /// Its command name (`/proc/<pid>/comm`), empty if unreadable.
    pub comm: String,
}

/// Who holds an address: the sockets listening on it and the processes this one can see holding
/// them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holder {
    /// The sockets, by inode.
    pub sockets: BTreeSet<Socket>,
    /// The processes seen holding them.
    pub processes: BTreeSet<Process>,
}

impl Holder {
    /// Whether no socket listens on the address any more (it was let go of meanwhile).
    pub fn is_nobody(&self) -> bool {
        self.sockets.is_empty()
    }

    /// Whether `self` and `other` are the same holder, as far as this process can tell: a process
    /// holding both when the holders of both are seen, else the same users' sockets.
    pub fn same_as(&self, other: &Holder) -> bool {
        if !self.processes.is_empty() && !other.processes.is_empty() {
            let pids = |holder: &Holder| -> BTreeSet<u32> {
                holder.processes.iter().map(|p| p.pid).collect()
            };
            return !pids(self).is_disjoint(&pids(other));
        }
        let uids =
            |holder: &Holder| -> BTreeSet<u32> { holder.sockets.iter().map(|s| s.uid).collect() };
        !self.sockets.is_empty() && uids(self) == uids(other)
    }
}

impl fmt::Display for Holder {
    /// `pid 1234 (kubelet)`, `pids 1, 2 (a, b)`, or, unseen, `a process of uid 0 this user cannot
    /// see (socket inode 5678)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.sockets.is_empty() {
            return write!(f, "no socket listening any more");
        }
        if !self.processes.is_empty() {
            let names: Vec<String> = self
                .processes
                .iter()
                .map(|p| format!("pid {} ({})", p.pid, p.comm))
                .collect();
            return write!(f, "{}", names.join(", "));
        }
        let uids: BTreeSet<u32> = self.sockets.iter().map(|s| s.uid).collect();
        let inodes: Vec<String> = self.sockets.iter().map(|s| s.inode.to_string()).collect();
        let uids: Vec<String> = uids.iter().map(u32::to_string).collect();
        write!(
            f,
            "a process of uid {} this user cannot see (socket inode {})",
            uids.join(", "),
            inodes.join(", ")
        )
    }
}

/// [`holder_of`], off the event loop: it reads every process's descriptors.
pub async fn find(addr: SocketAddr) -> Holder {
    tokio::task::spawn_blocking(move || holder_of(addr))
        .await
        .unwrap_or_default()
}

/// Who holds `addr`, as far as `/proc` tells.
pub fn holder_of(addr: SocketAddr) -> Holder {
    let mut sockets = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        // A kernel without IPv6 has no tcp6 table: nothing listens there.
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        sockets.extend(listening_on(&text, addr));
    }
    let processes = holding(&sockets);
    Holder { sockets, processes }
}

/// The listening sockets of a `/proc/net/tcp{,6}` table that keep `addr` from being bound: on
/// its port, at the same address or a wildcard of its family (or, for IPv4, IPv6's wildcard,
/// which takes IPv4 too unless `IPV6_V6ONLY`, which the table does not show).
fn listening_on(table: &str, addr: SocketAddr) -> Vec<Socket> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, state) = (fields.get(1)?, fields.get(3)?);
            if *state != LISTEN {
                return None;
            }
            let (ip, port) = local.split_once(':')?;
            let port = u16::from_str_radix(port, 16).ok()?;
            let ip = parse_ip(ip)?;
            let blocks = port == addr.port()
                && match (ip, addr.ip()) {
                    (IpAddr::V4(held), IpAddr::V4(wanted)) => {
                        held == wanted || held.is_unspecified() || wanted.is_unspecified()
                    }
                    (IpAddr::V6(held), IpAddr::V6(wanted)) => {
                        held == wanted || held.is_unspecified() || wanted.is_unspecified()
                    }
                    (IpAddr::V6(held), IpAddr::V4(wanted)) => {
                        held.is_unspecified() || held.to_ipv4_mapped() == Some(wanted)
                    }
                    (IpAddr::V4(_), IpAddr::V6(_)) => false,
                };
            Some(Socket {
                uid: fields.get(7)?.parse().ok()?,
                inode: fields.get(9)?.parse().ok()?,
            })
            .filter(|_| blocks)
        })
        .collect()
}

/// An address as the tables print it: the bytes of each 32-bit word in this machine's order.
fn parse_ip(hex: &str) -> Option<IpAddr> {
    let word = |at: usize| -> Option<[u8; 4]> {
        let word = u32::from_str_radix(hex.get(at..at + 8)?, 16).ok()?;
        Some(word.to_ne_bytes())
    };
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?))),
        32 => {
            let mut octets = [0u8; 16];
            for (i, chunk) in octets.chunks_exact_mut(4).enumerate() {
                chunk.copy_from_slice(&word(i * 8)?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(octets)))
        }
        _ => None,
    }
}

/// The processes whose descriptors include one of `sockets`, among those this process may look
/// into.
fn holding(sockets: &BTreeSet<Socket>) -> BTreeSet<Process> {
    let mut found = BTreeSet::new();
    if sockets.is_empty() {
        return found;
    }
    let links: BTreeSet<String> = sockets
        .iter()
        .map(|s| format!("socket:[{}]", s.inode))
        .collect();
    let Ok(proc) = std::fs::read_dir("/proc") else {
        return found;
    };
    let mut budget = MAX_DESCRIPTORS;
    for entry in proc.flatten() {
        if budget == 0 {
            break;
        }
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(descriptors) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = descriptors.flatten().any(|fd| {
            budget = budget.saturating_sub(1);
            budget > 0
                && std::fs::read_link(fd.path())
                    .is_ok_and(|target| target.to_str().is_some_and(|t| links.contains(t)))
        });
        if holds {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            found.insert(Process {
                pid,
                comm: comm.trim_end().to_owned(),
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
        \x20  0: 0100007F:2802 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 111 1 0 100 0 0 10 0\n\
        \x20  1: 00000000:2803 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 222 1 0 100 0 0 10 0\n\
        \x20  2: 0100007F:2804 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 333 1 0 100 0 0 10 0\n\
        \x20  3: 0200007F:2805 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 444 1 0 100 0 0 10 0\n\
        \x20  4: garbage\n";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
        \x20  0: 00000000000000000000000001000000:2806 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 555 1 0 100 0 0 10 0\n\
        \x20  1: 00000000000000000000000000000000:2807 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000    65        0 666 1 0 100 0 0 10 0\n";

    #[test]
    fn every_class_of_table_line_blocks_the_addresses_the_kernel_would_refuse() {
        // (the address wanted, the table, the inodes found)
        let cases: [(&str, &str, &[u64]); 11] = [
            ("127.0.0.1:10242", TCP, &[111]),
            ("0.0.0.0:10242", TCP, &[111]),
            ("127.0.0.2:10242", TCP, &[]),
            ("127.0.0.1:10243", TCP, &[222]),
            ("10.1.2.3:10243", TCP, &[222]),
            // Connected, not listening.
            ("127.0.0.1:10244", TCP, &[]),
            ("127.0.0.2:10245", TCP, &[444]),
            ("[::1]:10246", TCP6, &[555]),
            ("[::]:10246", TCP6, &[555]),
            // IPv6's wildcard takes IPv4 too, unless IPV6_V6ONLY.
            ("127.0.0.1:10247", TCP6, &[666]),
            ("[::1]:10242", TCP, &[]),
        ];
        for (addr, table, inodes) in cases {
            let found: Vec<u64> = listening_on(table, addr.parse().unwrap())
                .into_iter()
                .map(|s| s.inode)
                .collect();
            assert_eq!(found, inodes, "{addr}");
        }
    }

    #[test]
    fn a_listener_of_this_process_is_named_with_its_pid_and_command() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let holder = holder_of(listener.local_addr().unwrap());
        let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
        let expected = format!("pid {} ({})", std::process::id(), comm.trim_end());
        assert_eq!(holder.to_string(), expected);
        assert!(holder.same_as(&holder));
        drop(listener);
    }

    #[test]
    fn holders_are_told_apart_by_pid_when_seen_and_by_user_when_not() {
        let seen = |pid, uid| Holder {
            sockets: [Socket { inode: 1, uid }].into(),
            processes: [Process {
                pid,
                comm: "p".into(),
            }]
            .into(),
        };
        let unseen = |uid| Holder {
            sockets: [Socket { inode: 2, uid }].into(),
            processes: BTreeSet::new(),
        };
        // (what, one, the other, the same)
        let cases = [
            ("one process", seen(7, 0), seen(7, 0), true),
            ("two processes of one user", seen(7, 0), seen(8, 0), false),
            ("unseen, one user", unseen(0), unseen(0), true),
            ("unseen, two users", unseen(0), unseen(1000), false),
            ("seen and unseen of one user", seen(7, 0), unseen(0), true),
            ("nobody", Holder::default(), Holder::default(), false),
        ];
        for (what, one, other, same) in cases {
            assert_eq!(one.same_as(&other), same, "{what}");
        }
        assert_eq!(
            unseen(0).to_string(),
            "a process of uid 0 this user cannot see (socket inode 2)"
        );
    }
}

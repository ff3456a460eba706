//! `--listen-address`: an address and port, or a port alone, which stands for every address of
//! the families the kubelet does not listen on with that port, so that the same value fits every
//! node, whichever loopback its kubelet was moved to.
//!
//! The kernel refuses a wildcard beside a specific address of its own family and port, so beside a
//! kubelet on `[::1]:PORT` a port alone is `0.0.0.0:PORT`, beside one on `127.0.0.1:PORT` it is
//! `[::]:PORT`, and otherwise (another port, a unix socket, a remote kubelet) both wildcards.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use crate::forward::UpstreamTarget;

/// One `--listen-address` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenAddress {
    /// `ADDR:PORT` or `[IPv6]:PORT`: exactly that.
    Socket(SocketAddr),
    /// `:PORT`: see the module's documentation.
    Port(u16),
}

impl ListenAddress {
    /// The port, in either form.
    pub fn port(&self) -> u16 {
        match self {
            ListenAddress::Socket(addr) => addr.port(),
            ListenAddress::Port(port) => *port,
        }
    }
}

impl FromStr for ListenAddress {
    type Err = String;

    fn from_str(text: &str) -> Result<ListenAddress, String> {
        if let Some(port) = text.strip_prefix(':') {
            return port
                .parse()
                .map(ListenAddress::Port)
                .map_err(|_| format!("{text:?}: the port after ':' must be a number up to 65535"));
        }
        text.parse().map(ListenAddress::Socket).map_err(|_| {
            format!("{text:?}: expected ADDR:PORT, [IPv6]:PORT, or :PORT for every address")
        })
    }
}

impl fmt::Display for ListenAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddress::Socket(addr) => addr.fmt(f),
            ListenAddress::Port(port) => write!(f, ":{port}"),
        }
    }
}

/// The sockets to bind for `given`, with the kubelet at `upstream`. Each appears once.
pub fn resolve(given: &[ListenAddress], upstream: Option<&UpstreamTarget>) -> Vec<SocketAddr> {
    let kubelet = upstream.and_then(loopback_of);
    let mut addresses: Vec<SocketAddr> = Vec::new();
    for value in given {
        let resolved = match *value {
            ListenAddress::Socket(addr) => vec![addr],
            ListenAddress::Port(port) => {
                let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
                let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port);
                match kubelet {
                    Some((Family::V6, on)) if on == port => vec![v4],
                    Some((Family::V4, on)) if on == port => vec![v6],
                    _ => vec![v4, v6],
                }
            }
        };
        for addr in resolved {
            if !addresses.contains(&addr) {
                addresses.push(addr);
            }
        }
    }
    addresses
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

/// The family of the loopback address the kubelet listens on, and its port, if it is on one.
/// `localhost` counts as IPv4: it is `127.0.0.1` first in every distribution's `/etc/hosts`.
fn loopback_of(upstream: &UpstreamTarget) -> Option<(Family, u16)> {
    let (authority, default_port) = match upstream {
        UpstreamTarget::Https { authority } => (authority, 443),
        UpstreamTarget::Http { authority } => (authority, 80),
        UpstreamTarget::Unix { .. } => return None,
    };
    let port = authority.port_u16().unwrap_or(default_port);
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let family = if host.eq_ignore_ascii_case("localhost") {
        Family::V4
    } else {
        match host.parse::<IpAddr>() {
            Ok(IpAddr::V4(ip)) if ip.is_loopback() => Family::V4,
            Ok(IpAddr::V6(ip)) if ip.is_loopback() => Family::V6,
            _ => return None,
        }
    };
    Some((family, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn https(authority: &str) -> UpstreamTarget {
        UpstreamTarget::Https {
            authority: authority.parse().unwrap(),
        }
    }

    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn a_port_alone_is_every_address_the_kubelet_does_not_hold() {
        let port = [ListenAddress::Port(10250)];
        assert_eq!(
            resolve(&port, Some(&https("[::1]:10250"))),
            addrs(&["0.0.0.0:10250"])
        );
        assert_eq!(
            resolve(&port, Some(&https("127.0.0.1:10250"))),
            addrs(&["[::]:10250"])
        );
        assert_eq!(
            resolve(&port, Some(&https("localhost:10250"))),
            addrs(&["[::]:10250"])
        );
        let unix = UpstreamTarget::Unix {
            path: "/run/kubelet.sock".into(),
        };
        assert_eq!(
            resolve(&port, Some(&unix)),
            addrs(&["0.0.0.0:10250", "[::]:10250"])
        );
        assert_eq!(
            resolve(&port, Some(&https("10.0.0.12:10250"))),
            addrs(&["0.0.0.0:10250", "[::]:10250"])
        );
        // A kubelet on another port collides with neither wildcard.
        assert_eq!(
            resolve(&port, Some(&https("127.0.0.1:10251"))),
            addrs(&["0.0.0.0:10250", "[::]:10250"])
        );
    }

    #[test]
    fn addresses_are_kept_as_given_once_each() {
        let given: Vec<ListenAddress> = [
            "10.0.0.12:10250",
            "[fd00::12]:10250",
            ":10250",
            "10.0.0.12:10250",
        ]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
        assert_eq!(
            resolve(&given, Some(&https("[::1]:10250"))),
            addrs(&["10.0.0.12:10250", "[fd00::12]:10250", "0.0.0.0:10250"])
        );
    }

    #[test]
    fn values_parse_and_print_as_written() {
        for text in ["0.0.0.0:10250", "[::]:10250", ":10250", "[fd00::1]:443"] {
            let value: ListenAddress = text.parse().unwrap();
            assert_eq!(value.to_string(), text);
        }
        for bad in [":", ":http", ":70000", "10250", "localhost:10250", "[::1]"] {
            assert!(bad.parse::<ListenAddress>().is_err(), "{bad}");
        }
    }
}

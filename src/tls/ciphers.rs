//! TLS versions and cipher suites by the names Go, the kubelet and kube-apiserver use
//! (`VersionTLS12`, `TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256`), mapped onto what rustls offers.

use rustls::SupportedCipherSuite;
use rustls::crypto::ring::cipher_suite as suites;

/// The minimum protocol version, from `--tls-min-version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinVersion {
    /// TLS 1.2 and 1.3.
    Tls12,
    /// TLS 1.3 only.
    Tls13,
}

/// Parses a Go TLS version name. TLS 1.0 and 1.1 are known names but refused: rustls does not
/// implement them, and they have no place in front of the kubelet.
pub fn parse_min_version(name: &str) -> Result<MinVersion, String> {
    match name {
        "" | "VersionTLS12" => Ok(MinVersion::Tls12),
        "VersionTLS13" => Ok(MinVersion::Tls13),
        "VersionTLS10" | "VersionTLS11" => Err(format!(
            "{name} is not supported: only VersionTLS12 and VersionTLS13 are available"
        )),
        _ => Err(format!(
            "unknown TLS version {name:?} (use VersionTLS12 or VersionTLS13)"
        )),
    }
}

/// Go names of the suites rustls (ring) implements, TLS 1.2 first as Go lists them. Go's
/// `_POLY1305` aliases without `_SHA256` are accepted too.
const SUITES: &[(&str, SupportedCipherSuite)] = &[
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        suites::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        suites::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        suites::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        suites::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        suites::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        suites::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        suites::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        suites::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    ("TLS_AES_128_GCM_SHA256", suites::TLS13_AES_128_GCM_SHA256),
    ("TLS_AES_256_GCM_SHA384", suites::TLS13_AES_256_GCM_SHA384),
    (
        "TLS_CHACHA20_POLY1305_SHA256",
        suites::TLS13_CHACHA20_POLY1305_SHA256,
    ),
];

/// Suites Go knows that rustls deliberately does not implement (CBC, RSA key exchange, 3DES,
/// RC4). Naming one is an error that says so, rather than "unknown".
const REFUSED: &[&str] = &[
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
];

/// What `--tls-cipher-suites` selects.
#[derive(Debug)]
pub struct Selection {
    /// The suites to offer, TLS 1.3 first.
    pub suites: Vec<SupportedCipherSuite>,
    /// Named suites Go knows but rustls does not offer (CBC, RSA key exchange, 3DES, RC4),
    /// skipped; the caller warns about them.
    pub skipped: Vec<String>,
}

/// Turns `--tls-cipher-suites` into the suite list for rustls. An empty list means every suite
/// rustls offers. As in Go, the list restricts TLS 1.2 only: all TLS 1.3 suites stay enabled.
///
/// Suites Go knows but rustls does not offer are skipped (and listed in
/// [`Selection::skipped`]) as long as at least one named suite can be offered: real kubelet
/// configurations (CIS benchmark lists) name `TLS_RSA_*` suites beside the ECDHE ones. A list of
/// such suites only, or an unknown name, is an error.
pub fn select_suites(names: &[String]) -> Result<Selection, String> {
    let tls13 = || {
        SUITES
            .iter()
            .map(|(_, s)| *s)
            .filter(|s| s.tls13().is_some())
    };
    if names.is_empty() {
        let mut all: Vec<SupportedCipherSuite> = tls13().collect();
        all.extend(
            SUITES
                .iter()
                .map(|(_, s)| *s)
                .filter(|s| s.tls13().is_none()),
        );
        all.dedup_by_key(|s| s.suite());
        return Ok(Selection {
            suites: all,
            skipped: Vec::new(),
        });
    }
    let mut chosen: Vec<SupportedCipherSuite> = tls13().collect();
    let mut named = 0;
    let mut skipped = Vec::new();
    for name in names {
        let name = name.trim();
        match SUITES.iter().find(|(n, _)| *n == name) {
            Some((_, suite)) => {
                named += 1;
                if !chosen.iter().any(|c| c.suite() == suite.suite()) {
                    chosen.push(*suite);
                }
            }
            None if REFUSED.contains(&name) => skipped.push(name.to_owned()),
            None => return Err(format!("unknown cipher suite {name:?}")),
        }
    }
    if named == 0 {
        return Err(format!(
            "cipher suite {} is not supported (only AEAD suites with forward secrecy are \
             available), and no other named suite can be offered",
            skipped.join(", ")
        ));
    }
    Ok(Selection {
        suites: chosen,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(parse_min_version("VersionTLS12"), Ok(MinVersion::Tls12));
        assert_eq!(parse_min_version("VersionTLS13"), Ok(MinVersion::Tls13));
        assert!(
            parse_min_version("VersionTLS11")
                .unwrap_err()
                .contains("not supported")
        );
        assert!(parse_min_version("tls12").unwrap_err().contains("unknown"));
    }

    #[test]
    fn suites_by_go_name() {
        let chosen = select_suites(&["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into()])
            .unwrap()
            .suites;
        let tls12: Vec<_> = chosen.iter().filter(|s| s.tls13().is_none()).collect();
        assert_eq!(tls12.len(), 1);
        assert_eq!(chosen.iter().filter(|s| s.tls13().is_some()).count(), 3);
        let err = select_suites(&["TLS_RSA_WITH_AES_128_CBC_SHA".into()]).unwrap_err();
        assert!(err.contains("not supported"), "{err}");
        let err = select_suites(&["TLS_FOO".into()]).unwrap_err();
        assert!(err.contains("unknown cipher suite"), "{err}");
        assert_eq!(select_suites(&[]).unwrap().suites.len(), 9);
    }

    #[test]
    fn suites_rustls_cannot_offer_are_skipped_beside_usable_ones() {
        let cis: Vec<String> = [
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            "TLS_RSA_WITH_AES_256_GCM_SHA384",
            "TLS_RSA_WITH_AES_128_GCM_SHA256",
        ]
        .map(String::from)
        .to_vec();
        let selection = select_suites(&cis).unwrap();
        assert_eq!(
            selection.skipped,
            [
                "TLS_RSA_WITH_AES_256_GCM_SHA384",
                "TLS_RSA_WITH_AES_128_GCM_SHA256"
            ]
        );
        assert_eq!(
            selection
                .suites
                .iter()
                .filter(|s| s.tls13().is_none())
                .count(),
            2
        );
    }
}

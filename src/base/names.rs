//! Kubernetes' name rules (apimachinery `pkg/util/validation`), which pod paths, authorizer
//! names, audit policy groups and authentication configuration keys are checked against: one
//! copy, so that every check agrees with the API server's.

/// Longest RFC 1123 subdomain.
const MAX_SUBDOMAIN: usize = 253;
/// Longest RFC 1123 label.
const MAX_LABEL: usize = 63;

/// `IsDNS1123Label`: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters (a namespace).
pub fn is_dns1123_label(name: &str) -> bool {
    name.len() <= MAX_LABEL && is_part(name)
}

/// `IsDNS1123Subdomain`: such parts joined by dots, at most 253 characters (a pod, an API
/// group, a domain).
pub fn is_dns1123_subdomain(name: &str) -> bool {
    name.len() <= MAX_SUBDOMAIN && name.split('.').all(is_part)
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn is_part(part: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = part.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|&b| alnum(b) || b == b'-')
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subdomains_and_labels() {
        for good in ["a", "a-b.c", "0.example.com", &"a".repeat(63)] {
            assert!(is_dns1123_subdomain(good), "{good}");
        }
        for bad in ["", "A", "a..b", "-a", "a-", "a_b", ".a", &"a.".repeat(127)] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
        assert!(is_dns1123_label("kube-system"));
        assert!(!is_dns1123_label("a.b"));
        assert!(!is_dns1123_label(&"a".repeat(64)));
    }
}

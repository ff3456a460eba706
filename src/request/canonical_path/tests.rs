//! The path gate's tests: canonical, redirected and refused paths.

use super::*;
use crate::authz::attributes::{AttributeMapping, kubelet_attributes};
use http::Method;

fn canonical(raw: &str) -> Cow<'_, str> {
    match check_path(raw) {
        PathCheck::Canonical { decoded } => decoded,
        other => panic!("{raw:?}: expected canonical, got {other:?}"),
    }
}

#[test]
fn canonical_paths_pass_with_their_decoded_form() {
    let cases = [
        ("/", "/"),
        ("/pods", "/pods"),
        ("/pods/", "/pods/"),
        ("/stats/summary", "/stats/summary"),
        ("/exec/default/pod/ctr", "/exec/default/pod/ctr"),
        ("/a;b/c;d=1/e", "/a;b/c;d=1/e"),
        ("/exec;/x", "/exec;/x"),
        ("/.well-known/x", "/.well-known/x"),
        ("/.../a../..a/.a.", "/.../a../..a/.a."),
        ("/~user/!$&'()*+,=:@", "/~user/!$&'()*+,=:@"),
        ("/containerLogs/ns/my%20pod/c", "/containerLogs/ns/my pod/c"),
        ("/logs/100%25", "/logs/100%"),
        ("/logs/%252e%252e", "/logs/%2e%2e"),
        ("/a%3ab/%3A", "/a:b/:"),
        ("/a%5Cb", "/a\\b"),
        ("/a%3Fb%23c", "/a?b#c"),
        ("/caf%C3%A9", "/café"),
    ];
    for (raw, decoded) in cases {
        let got = canonical(raw);
        assert_eq!(got, decoded, "{raw:?}");
        assert_eq!(
            matches!(got, Cow::Borrowed(_)),
            !raw.contains('%'),
            "{raw:?}: borrowed exactly when escape-free"
        );
    }
}

#[test]
fn unclean_paths_redirect_to_their_cleaned_form() {
    let cases = [
        ("/stats/../exec/a/b/c", "/exec/a/b/c"),
        ("/stats/%2e%2e/exec/a/b/c", "/exec/a/b/c"),
        ("/stats/%2E%2E/exec/a/b/c", "/exec/a/b/c"),
        ("/stats/%2e%2E/exec/a/b/c", "/exec/a/b/c"),
        ("/stats/.%2e/exec/a/b/c", "/exec/a/b/c"),
        ("//exec/a/b/c", "/exec/a/b/c"),
        ("/exec/./a/b/c", "/exec/a/b/c"),
        ("/exec/%2E/a/b/c", "/exec/a/b/c"),
        ("/pods/.", "/pods"),
        ("/pods/./", "/pods/"),
        ("/pods//", "/pods/"),
        ("/st%61ts/summary", "/stats/summary"),
        ("/%7Euser/%41%2d%5F", "/~user/A-_"),
        ("/..", "/"),
        ("/../..//", "/"),
        ("/a/b/..", "/a"),
        ("/a/b/../", "/a/"),
        ("/a/../../b", "/b"),
        ("/a%2e/", "/a./"),
        (
            "/containerLogs/ns/my%20pod/./c",
            "/containerLogs/ns/my%20pod/c",
        ),
        ("/%2e%2e/%25%2e", "/%25."),
        ("/x/%2e%2e%2e", "/x/..."),
    ];
    for (raw, location) in cases {
        assert_eq!(
            check_path(raw),
            PathCheck::Redirect {
                location: location.to_owned()
            },
            "{raw:?}"
        );
        canonical(location);
    }
}

#[test]
fn malformed_or_ambiguous_paths_are_rejected() {
    let long_ok = format!("/{}", "a".repeat(MAX_PATH_LEN - 1));
    let too_long = format!("/{}", "a".repeat(MAX_PATH_LEN));
    canonical(&long_ok);
    let cases: &[(&str, PathError)] = &[
        ("", PathError::NotAbsolute),
        ("*", PathError::NotAbsolute),
        ("pods", PathError::NotAbsolute),
        ("%2Fpods", PathError::NotAbsolute),
        (&too_long, PathError::TooLong),
        ("/a%", PathError::InvalidEscape),
        ("/a%2", PathError::InvalidEscape),
        ("/a%zz", PathError::InvalidEscape),
        ("/a%g0/b", PathError::InvalidEscape),
        ("/%%41", PathError::InvalidEscape),
        ("/a%00", PathError::EncodedControl),
        ("/a%0A", PathError::EncodedControl),
        ("/a%1f", PathError::EncodedControl),
        ("/a%7F", PathError::EncodedControl),
        ("/a%C2%85", PathError::EncodedControl),
        ("/a%c2%9b2J", PathError::EncodedControl),
        ("/a%C2%80b", PathError::EncodedControl),
        ("/a%2Fb", PathError::EncodedSlash),
        ("/a%2fb", PathError::EncodedSlash),
        ("/stats%2F..%2Fexec/a", PathError::EncodedSlash),
        ("/a%C3", PathError::InvalidUtf8),
        ("/a%80", PathError::InvalidUtf8),
        ("/%FF/x", PathError::InvalidUtf8),
        ("/a b", PathError::InvalidCharacter),
        ("/a\0", PathError::InvalidCharacter),
        ("/a\x7f", PathError::InvalidCharacter),
        ("/a\tb", PathError::InvalidCharacter),
        ("/café", PathError::InvalidCharacter),
        ("/./\\evil.example", PathError::InvalidCharacter),
        ("/a|b", PathError::InvalidCharacter),
        ("/a\"b", PathError::InvalidCharacter),
        ("/a?b", PathError::InvalidCharacter),
        // A reject wins over a redirect the rest of the path would get.
        ("/../a%00", PathError::EncodedControl),
        ("//a%2f", PathError::EncodedSlash),
    ];
    for (raw, error) in cases {
        assert_eq!(check_path(raw), PathCheck::Reject(*error), "{raw:?}");
    }
}

#[test]
fn errors_read_as_short_client_reasons() {
    assert_eq!(
        PathError::InvalidEscape.to_string(),
        "invalid percent-encoding in path"
    );
    assert_eq!(
        PathError::EncodedSlash.to_string(),
        "percent-encoded '/' in path"
    );
    assert_eq!(
        PathError::NotAbsolute.to_string(),
        "path must begin with '/'"
    );
}

/// Go's `r.URL.Path`: every escape decoded. `None` for what Go would not parse.
fn decode_all(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(escape_value(bytes.get(i + 1..))?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Go's `ServeMux` `cleanPath` (`path.Clean`, trailing slash restored), written separately
/// from [`clean`] and applied to the decoded path, as Go does.
fn go_clean_path(p: &str) -> String {
    let mut stack: Vec<&str> = Vec::new();
    for segment in p.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                stack.pop();
            }
            s => stack.push(s),
        }
    }
    let mut cleaned = format!("/{}", stack.join("/"));
    if p.ends_with('/') && cleaned != "/" {
        cleaned.push('/');
    }
    cleaned
}

/// Deterministic xorshift64*, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

fn all_mappings() -> Vec<AttributeMapping> {
    let mut mappings = Vec::new();
    for bits in 0..8 {
        mappings.push(AttributeMapping {
            fine_grained: bits & 1 != 0,
            standalone_statusz_flagz: bits & 2 != 0,
            exec_requires_create: bits & 4 != 0,
            pod_scoped: false,
        });
    }
    mappings
}

fn attributes_agree(mappings: &[AttributeMapping], a: &str, b: &str) -> bool {
    mappings
        .iter()
        .all(|m| kubelet_attributes(m, &Method::GET, a) == kubelet_attributes(m, &Method::GET, b))
}

#[test]
fn generated_paths_uphold_the_canonical_form() {
    const ALPHABET: &[&str] = &[
        "/", ".", "%", "2", "e", "E", "f", "F", "a", "s", "~", ";", "\0", "x",
    ];
    const STARTS: &[&str] = &[
        "",
        "/",
        "//",
        "/exec",
        "/exec/",
        "/pods",
        "/stats/",
        "/logs",
        "/healthz/",
        "/runningpods",
        "/st%61ts",
        "/%2e%2e/",
    ];
    let mappings = all_mappings();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut canonicals, mut redirects, mut rejects) = (0, 0, 0);
    for _ in 0..5000 {
        let mut raw = String::from(STARTS[rng.below(STARTS.len())]);
        for _ in 0..rng.below(12) {
            raw.push_str(ALPHABET[rng.below(ALPHABET.len())]);
        }
        match check_path(&raw) {
            PathCheck::Canonical { decoded } => {
                canonicals += 1;
                assert_eq!(decode_all(&raw).as_deref(), Some(&*decoded), "{raw:?}");
                for bad in ["//", "/./", "/../"] {
                    assert!(!decoded.contains(bad), "{raw:?} decodes to {decoded:?}");
                }
                for bad in ["/.", "/.."] {
                    assert!(!decoded.ends_with(bad), "{raw:?} decodes to {decoded:?}");
                }
                let go = go_clean_path(&decoded);
                assert!(attributes_agree(&mappings, &decoded, &go), "{raw:?}");
            }
            PathCheck::Redirect { location } => {
                redirects += 1;
                assert_ne!(location, raw);
                assert!(!location.starts_with("//"), "{raw:?} -> {location:?}");
                let decoded = canonical(&location);
                let go = go_clean_path(&decode_all(&raw).unwrap());
                assert_eq!(*decoded, go, "{raw:?} must redirect where Go routes it");
                assert!(attributes_agree(&mappings, &decoded, &go), "{raw:?}");
            }
            PathCheck::Reject(_) => rejects += 1,
        }
    }
    for (outcome, count) in [
        ("canonical", canonicals),
        ("redirect", redirects),
        ("reject", rejects),
    ] {
        assert!(count > 500, "only {count} {outcome} paths generated");
    }
}

//! The bodies of the fuzz targets, one plain function per target, shared by the cargo-fuzz
//! binaries (`fuzz/fuzz_targets/`) and the stable replay test (`tests/e2e/fuzz_corpus.rs`), so
//! the corpus and every past crasher are re-checked in CI without nightly. Each function feeds
//! untrusted bytes to one parser and asserts the invariants the proxy's security rests on.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use clap::{Args, Command, FromArgMatches};
use http::{Method, StatusCode};
use kubelet_auth_proxy::apiserver::{
    ApiCallError, classify_error_answer, decode_subject_access_review, decode_token_review,
};
use kubelet_auth_proxy::authn::token::user_from_token_review;
use kubelet_auth_proxy::authn::x509::{
    CREDENTIAL_ID_EXTRA, ClientCa, X509Authenticator, X509Outcome, user_from_leaf,
};
use kubelet_auth_proxy::authn::{ANONYMOUS_USER, AUTHENTICATED_GROUP, UNAUTHENTICATED_GROUP, User};
use kubelet_auth_proxy::authz::attributes::{AttributeMapping, kubelet_attributes};
use kubelet_auth_proxy::authz::pod_attributes::pod_attributes;
use kubelet_auth_proxy::authz::policy::PolicyAuthorizer;
use kubelet_auth_proxy::authz::webhook::decision_from_review;
use kubelet_auth_proxy::authz::{Attributes, Decision};
use kubelet_auth_proxy::base::reload::Reloadable;
use kubelet_auth_proxy::config::authorization;
use kubelet_auth_proxy::config::file::expand;
use kubelet_auth_proxy::config::flags::ProxyFlags;
use kubelet_auth_proxy::request::canonical_path::{MAX_PATH_LEN, PathCheck, PathError, check_path};
use rustls_pki_types::{CertificateDer, UnixTime};

/// The methods tried on every canonical path: the five the kubelet maps to verbs, two it maps to
/// the empty verb, and a lower-case one (methods are case-sensitive).
fn methods() -> [Method; 8] {
    [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::DELETE,
        Method::HEAD,
        Method::OPTIONS,
        // A valid token, so the conversion cannot fail.
        Method::from_bytes(b"get").unwrap(),
    ]
}

/// Request target → path gate → attributes.
///
/// The bytes are a request target. Its path (up to `?`) and, when `http::Uri` accepts the whole
/// target (origin or absolute form, as hyper would), `uri.path()` both go through `check_path`.
/// Invariants: a canonical path decodes to an absolute path without control characters, empty
/// segments (but a trailing one), `.` or `..` segments, and maps, under every mapping and
/// method, to one or two subresources; a redirect location is itself canonical and stays on this
/// host; an over-long path is always refused.
pub fn path_to_attributes(data: &[u8]) {
    let Ok(target) = std::str::from_utf8(data) else {
        return;
    };
    let raw_path = target.split_once('?').map_or(target, |(path, _)| path);
    check_one_path(raw_path);
    if let Ok(uri) = target.parse::<http::Uri>() {
        check_one_path(uri.path());
    }
}

fn check_one_path(raw: &str) {
    let check = check_path(raw);
    if raw.len() > MAX_PATH_LEN {
        assert_eq!(check, PathCheck::Reject(PathError::TooLong), "{raw:?}");
        return;
    }
    match check {
        PathCheck::Canonical { decoded } => {
            assert_canonical_decoded(raw, &decoded);
            check_attributes(&decoded);
        }
        PathCheck::Redirect { location } => {
            assert!(
                location.starts_with('/') && !location.starts_with("//"),
                "redirect of {raw:?} leaves the host: {location:?}"
            );
            assert_ne!(location, raw, "redirect of {raw:?} to itself");
            match check_path(&location) {
                PathCheck::Canonical { decoded } => assert_canonical_decoded(&location, &decoded),
                other => panic!("redirect of {raw:?} to {location:?}, which is {other:?}"),
            }
        }
        PathCheck::Reject(_) => {}
    }
}

fn assert_canonical_decoded(raw: &str, decoded: &str) {
    assert!(decoded.starts_with('/'), "{raw:?} decodes to {decoded:?}");
    assert!(
        !decoded.chars().any(char::is_control),
        "{raw:?} decodes to control characters: {decoded:?}"
    );
    let segments: Vec<&str> = decoded[1..].split('/').collect();
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        assert!(
            !segment.is_empty() || last,
            "{raw:?} decodes to an empty segment: {decoded:?}"
        );
        assert!(
            *segment != "." && *segment != "..",
            "{raw:?} decodes to a dot segment: {decoded:?}"
        );
    }
}

fn check_attributes(decoded: &str) {
    let user = User::anonymous();
    // The pod-level attributes name exactly the namespace and pod of the path's second and third
    // segments, and are asked on pods/<subresource> only.
    for method in methods() {
        if let Some(pod) = pod_attributes(&method, decoded) {
            let segments: Vec<&str> = decoded.split('/').collect();
            assert_eq!(
                (segments[2], segments[3]),
                (pod.namespace, pod.pod),
                "{decoded:?}"
            );
            let attrs = pod.attributes(&user, decoded);
            assert_eq!(
                (attrs.resource, attrs.name),
                ("pods", pod.pod),
                "{decoded:?}"
            );
            assert!(matches!(pod.verb, "get" | "create"), "{decoded:?}");
        }
    }
    for fine_grained in [false, true] {
        for standalone_statusz_flagz in [false, true] {
            for exec_requires_create in [false, true] {
                let mapping = AttributeMapping {
                    fine_grained,
                    standalone_statusz_flagz,
                    exec_requires_create,
                    pod_scoped: false,
                };
                for method in methods() {
                    let attributes = kubelet_attributes(&mapping, &method, decoded);
                    let names = attributes.subresources.as_slice();
                    assert!(
                        (1..=2).contains(&names.len()),
                        "{decoded:?}: {names:?} under {mapping:?}"
                    );
                    assert!(names.len() == 1 || fine_grained, "{decoded:?}: {names:?}");
                    assert!(
                        matches!(
                            attributes.verb,
                            "get" | "create" | "update" | "patch" | "delete" | ""
                        ),
                        "{decoded:?}: verb {:?}",
                        attributes.verb
                    );
                    assert_eq!(
                        attributes
                            .attributes(&user, "node-1", decoded)
                            .filter(|a| a.path == decoded && a.verb == attributes.verb)
                            .count(),
                        names.len()
                    );
                }
            }
        }
    }
}

/// Users every parsed policy is asked about: a person in groups, a service account, anonymous.
fn policy_users() -> &'static [User; 3] {
    static USERS: OnceLock<[User; 3]> = OnceLock::new();
    USERS.get_or_init(|| {
        [
            User {
                name: "alice".into(),
                groups: vec!["system:nodes".into(), AUTHENTICATED_GROUP.into()],
                ..User::default()
            },
            User {
                name: "system:serviceaccount:monitoring:prometheus".into(),
                groups: vec![
                    "system:serviceaccounts".into(),
                    "system:serviceaccounts:monitoring".into(),
                    AUTHENTICATED_GROUP.into(),
                ],
                ..User::default()
            },
            User::anonymous(),
        ]
    })
}

/// RBAC manifests (ClusterRole, ClusterRoleBinding, List, multi-document YAML) → the Policy
/// authorizer, and when it loads, a grid of authorize calls. Invariant: the Policy authorizer
/// never answers `Deny` (so it never hides later authorizers) and never panics.
pub fn rbac_manifest(data: &[u8]) {
    let text = String::from_utf8_lossy(data).into_owned();
    let Ok(policy) = PolicyAuthorizer::from_sources(&[("fuzz.yaml".to_owned(), text)]) else {
        return;
    };
    for user in policy_users() {
        for verb in ["get", "create", ""] {
            for subresource in ["proxy", "stats", "log"] {
                let attrs = Attributes::node(user, verb, subresource, "node-1", "/stats/summary");
                match policy.authorize(&attrs) {
                    Decision::Deny(reason) => panic!("Policy denied {attrs:?}: {reason}"),
                    Decision::Allow(reason) => assert!(!reason.to_string().is_empty()),
                    Decision::NoOpinion(_) => {}
                }
            }
        }
    }
}

/// The command the proxy's flags live in, built once: clap builders are slow to make.
fn proxy_command() -> &'static Command {
    static COMMAND: OnceLock<Command> = OnceLock::new();
    COMMAND.get_or_init(|| ProxyFlags::augment_args(Command::new("kubelet-auth-proxy")))
}

/// A file of this process and thread for configuration inputs: the parsers read paths.
fn scratch_file() -> PathBuf {
    thread_local! {
        static PATH: PathBuf = std::env::temp_dir().join(format!(
            "kap-fuzz-config-{}-{:?}.yaml",
            std::process::id(),
            std::thread::current().id()
        ).replace(['(', ')'], ""));
    }
    PATH.with(PathBuf::clone)
}

/// Configuration files: the first byte picks the parser, the rest is the file. 0: `--config`
/// (ProxyConfiguration), 1: `--kubelet-config` (KubeletConfiguration), both expanded into flags
/// and parsed again as the binary does; 2: `--authorization-config` (AuthorizationConfiguration).
/// Invariant: any file gives flags or a typed error, never a panic.
pub fn config_files(data: &[u8]) {
    let Some((&selector, file)) = data.split_first() else {
        return;
    };
    let path = scratch_file();
    if std::fs::write(&path, file).is_err() {
        return;
    }
    match selector % 3 {
        0 => expand_flags("--config", &path),
        1 => expand_flags("--kubelet-config", &path),
        _ => {
            if let Ok(chain) = authorization::load(&path) {
                assert!(
                    !chain.is_empty(),
                    "an authorization chain without authorizers"
                );
            }
        }
    }
    let _ = std::fs::remove_file(&path);
}

fn expand_flags(flag: &str, path: &std::path::Path) {
    let command = proxy_command();
    let args: Vec<std::ffi::OsString> = vec![
        "kubelet-auth-proxy".into(),
        flag.into(),
        path.as_os_str().to_owned(),
    ];
    let matches = command
        .clone()
        .try_get_matches_from(&args)
        .expect("the scratch file path is a valid flag value");
    if let Ok(Some((expanded, _))) = expand(command, &matches, &args, 1)
        && let Ok(matches) = command.clone().try_get_matches_from(expanded)
    {
        let _ = ProxyFlags::from_arg_matches(&matches);
    }
}

/// The fixed client CA of the certificate target (`fuzz/fixtures/ca.der`, a P-256 root valid
/// 2026–2126) and its authenticator.
fn x509_authenticator() -> &'static (X509Authenticator, Arc<ClientCa>) {
    static AUTHENTICATOR: OnceLock<(X509Authenticator, Arc<ClientCa>)> = OnceLock::new();
    AUTHENTICATOR.get_or_init(|| {
        let ca = Reloadable::load("fuzz client CA", Vec::new(), |_| {
            ClientCa::from_certs(&[CertificateDer::from(&include_bytes!("fixtures/ca.der")[..])])
                .map_err(|e| e.to_string())
        })
        .expect("the fixed CA is valid");
        let authenticator = X509Authenticator::new(Arc::new(ca));
        let current = authenticator.current_ca();
        (authenticator, current)
    })
}

/// The time chains are verified at: 2030-03-17, inside the fixed CA's validity.
const VERIFY_AT_SECS: u64 = 1_900_000_000;

/// Splits concatenated DER TLVs (a leaf then intermediates, as a client sends them); whatever does
/// not parse as a TLV is the last element. At most 8 elements.
fn split_der(mut data: &[u8]) -> Vec<&[u8]> {
    let mut chain = Vec::new();
    while !data.is_empty() && chain.len() < 7 {
        let Some(len) = der_element_len(data) else {
            break;
        };
        let (element, rest) = data.split_at(len);
        chain.push(element);
        data = rest;
    }
    if !data.is_empty() {
        chain.push(data);
    }
    chain
}

/// The length (header included) of the DER element at the start of `data`, if it fits.
fn der_element_len(data: &[u8]) -> Option<usize> {
    let first = *data.get(1)?;
    let (header, body) = if first < 0x80 {
        (2, usize::from(first))
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 {
            return None;
        }
        let bytes = data.get(2..2 + count)?;
        let body = bytes
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (2 + count, body)
    };
    let len = header.checked_add(body)?;
    (len <= data.len()).then_some(len)
}

/// Client certificate DER → the user it maps to, and the chain (concatenated DER certificates)
/// verified against the fixed CA. Invariants: a mapped user has a name, the credential-id extra
/// and `system:authenticated` (unless the kubelet's rule leaves it out); a verified chain maps to
/// the user its leaf names and is valid at the time it was verified at.
pub fn client_certificate(data: &[u8]) {
    if let Ok(Some(user)) = user_from_leaf(data) {
        assert_authenticated_user(&user);
        let credential = &user.extra[CREDENTIAL_ID_EXTRA];
        assert!(
            credential.len() == 1 && credential[0].len() == "X509SHA256=".len() + 64,
            "{credential:?}"
        );
    }
    let chain: Vec<CertificateDer<'_>> = split_der(data)
        .into_iter()
        .map(CertificateDer::from)
        .collect();
    let (authenticator, ca) = x509_authenticator();
    let now = UnixTime::since_unix_epoch(Duration::from_secs(VERIFY_AT_SECS));
    match authenticator.authenticate_with(ca, &chain, now) {
        X509Outcome::Authenticated { user, valid_until } => {
            let leaf_user = user_from_leaf(&chain[0])
                .expect("a verified leaf parses")
                .expect("an authenticated leaf has a common name");
            assert_eq!(*user, leaf_user);
            assert!(valid_until >= VERIFY_AT_SECS as i64);
        }
        X509Outcome::NoCertificate => {
            assert!(
                chain.is_empty() || matches!(user_from_leaf(&chain[0]), Ok(None)),
                "a presented certificate ignored"
            );
        }
        X509Outcome::Invalid(reason) => assert!(!reason.is_empty()),
    }
}

/// Every authenticated user has a name and, by the kubelet's `AuthenticatedGroupAdder`,
/// `system:authenticated` unless it is anonymous or claims to be unauthenticated.
fn assert_authenticated_user(user: &User) {
    assert!(!user.name.is_empty(), "a user without a name: {user:?}");
    assert!(
        user.in_group(AUTHENTICATED_GROUP)
            || user.in_group(UNAUTHENTICATED_GROUP)
            || user.name == ANONYMOUS_USER,
        "{user:?}"
    );
}

/// The API server answers the error-answer parser is tried with: a plain refusal, the retried
/// codes and a final 503.
const ERROR_CODES: [StatusCode; 4] = [
    StatusCode::FORBIDDEN,
    StatusCode::TOO_MANY_REQUESTS,
    StatusCode::INTERNAL_SERVER_ERROR,
    StatusCode::SERVICE_UNAVAILABLE,
];

/// Error answers: the message shown in logs is short and on one line whatever the body, and a
/// 429 is always retried.
fn check_error_answer(body: &[u8]) {
    for code in ERROR_CODES {
        let (error, retry) = classify_error_answer(code, 0, body);
        let ApiCallError::Status {
            code: reported,
            message,
            ..
        } = error
        else {
            panic!("an error answer is not a Status error: {error:?}");
        };
        assert_eq!(reported, code.as_u16());
        assert!(message.chars().count() <= 200, "{message:?}");
        assert!(!message.contains(char::is_control), "{message:?}");
        assert!(retry || code != StatusCode::TOO_MANY_REQUESTS);
    }
}

/// A TokenReview answer body → its status → the user, with and without audiences asked for; and
/// the same body as an error answer. Invariant: a user comes out only of an authenticated status
/// naming a user (and an asked-for audience), with `system:authenticated` added.
pub fn token_review_response(data: &[u8]) {
    check_error_answer(data);
    let Ok(status) = decode_token_review(data) else {
        return;
    };
    let audiences = ["https://kubernetes.default.svc".to_owned()];
    for asked in [&[][..], &audiences[..]] {
        if let Ok(Some(user)) = user_from_token_review(status.clone(), asked) {
            assert_eq!(status.authenticated, Some(true));
            assert_authenticated_user(&user);
            if !asked.is_empty() {
                assert!(
                    status
                        .audiences
                        .as_ref()
                        .is_some_and(|answered| answered.iter().any(|a| asked.contains(a)))
                );
            }
        }
    }
}

/// A SubjectAccessReview answer body → its status → the decision; and the same body as an error
/// answer. Invariant: `Allow` only when allowed and not denied, `Deny` only when denied and not
/// allowed, an error when both.
pub fn subject_access_review_response(data: &[u8]) {
    check_error_answer(data);
    let Ok(status) = decode_subject_access_review(data) else {
        return;
    };
    let denied = status.denied == Some(true);
    match decision_from_review(&status) {
        Ok(Decision::Allow(_)) => assert!(status.allowed && !denied),
        Ok(Decision::Deny(_)) => assert!(!status.allowed && denied),
        Ok(Decision::NoOpinion(_)) => assert!(!status.allowed && !denied),
        Err(_) => assert!(status.allowed && denied),
    }
}

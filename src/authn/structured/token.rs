//! A JWT of a configured issuer, read and checked as kube-apiserver's JWT authenticator reads it
//! before any key is looked at (go-oidc v2's `IDTokenVerifier.Verify`, which kube-apiserver
//! v1.36 vendors, and go-jose's compact parsing): three parts, each Go's unpadded base64url; a
//! protected header with `alg` (and `kid`), no `crit`; a payload whose registered claims have
//! the types Go's `encoding/json` accepts for them (field names matched ignoring case); the
//! issuer; one of the audiences; `exp` present and not past (no leeway); `nbf`, when present,
//! at most [`NBF_LEEWAY`] ahead. `iat` is not compared with the clock.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde_json::{Map, Value};

use crate::authn::jwt::{GO_RAW_URL, issuer, signing_input};

/// go-oidc v2's leeway on `nbf`; `exp` has none.
pub const NBF_LEEWAY: Duration = Duration::from_secs(60);

/// A token's parts, its claims checked, its signature not yet.
#[derive(Debug)]
pub struct Token<'a> {
    /// The header's `alg`.
    pub algorithm: String,
    /// The header's `kid` (empty when none).
    pub kid: String,
    /// What the signature covers, canonically encoded.
    pub signing_input: Cow<'a, [u8]>,
    /// The signature.
    pub signature: Vec<u8>,
    /// The payload.
    pub claims: Map<String, Value>,
}

/// Why a token of a configured issuer was refused before its signature was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClaimsRefusal {
    /// Not a compact JWS, or a part or a registered claim that does not decode.
    #[error("malformed jwt")]
    Malformed,
    /// `iss` is not the issuer's URL.
    #[error("id token issued by a different provider")]
    Issuer,
    /// None of the token's audiences is configured.
    #[error("audience not accepted")]
    Audience,
    /// Past `exp`, or no `exp`.
    #[error("token is expired")]
    Expired,
    /// Before `nbf`, with the leeway.
    #[error("current time before the nbf (not before) time")]
    NotYetValid,
}

/// The issuer a token names, read as kube-apiserver's `untrustedIssuer`: none for a token that
/// looks like JSON or has other than three parts; Google's scheme-less legacy issuer is read as
/// `https://accounts.google.com`.
pub fn untrusted_issuer(token: &str) -> Option<String> {
    if token.trim_start().starts_with('{') {
        return None;
    }
    let mut parts = token.split('.');
    let (Some(_), Some(payload), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let payload = GO_RAW_URL.decode(payload).ok()?;
    let issuer = issuer(&payload)?;
    if issuer == "accounts.google.com" {
        return Some("https://accounts.google.com".to_owned());
    }
    Some(issuer)
}

/// Reads `token`, which names `issuer_url`, and checks its claims against `audiences` at `now`.
pub fn parse<'a>(
    token: &'a str,
    issuer_url: &str,
    audiences: &[String],
    now: SystemTime,
) -> Result<Token<'a>, ClaimsRefusal> {
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ClaimsRefusal::Malformed);
    };
    let decode = |part: &str| {
        GO_RAW_URL
            .decode(part)
            .map_err(|_| ClaimsRefusal::Malformed)
    };
    let (header_bytes, payload_bytes, signature) =
        (decode(header)?, decode(payload)?, decode(signature)?);
    // Go reads bytes that are not UTF-8 as U+FFFD.
    let header: Map<String, Value> = serde_json::from_str(&String::from_utf8_lossy(&header_bytes))
        .map_err(|_| ClaimsRefusal::Malformed)?;
    let claims: Map<String, Value> = serde_json::from_str(&String::from_utf8_lossy(&payload_bytes))
        .map_err(|_| ClaimsRefusal::Malformed)?;
    let text = |name: &str| match header.get(name) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(value)) => Ok(value.clone()),
        Some(_) => Err(ClaimsRefusal::Malformed),
    };
    let (algorithm, kid) = (text("alg")?, text("kid")?);
    // go-jose refuses every critical header it would have to understand.
    if header
        .get("crit")
        .is_some_and(|crit| !matches!(crit, Value::Null) && crit != &Value::Array(Vec::new()))
    {
        return Err(ClaimsRefusal::Malformed);
    }
    let registered = Registered::read(&claims)?;
    if registered.issuer.as_deref().unwrap_or_default() != issuer_url {
        return Err(ClaimsRefusal::Issuer);
    }
    if !registered.audiences.iter().any(|a| audiences.contains(a)) {
        return Err(ClaimsRefusal::Audience);
    }
    let now_nanos = unix_nanos(now);
    match registered.expiry {
        Some(exp) if i128::from(exp) * 1_000_000_000 >= now_nanos => {}
        _ => return Err(ClaimsRefusal::Expired),
    }
    if let Some(nbf) = registered.not_before
        && now_nanos + (NBF_LEEWAY.as_nanos() as i128) < i128::from(nbf) * 1_000_000_000
    {
        return Err(ClaimsRefusal::NotYetValid);
    }
    Ok(Token {
        algorithm,
        kid,
        signing_input: signing_input(token, &header_bytes, &payload_bytes),
        signature,
        claims,
    })
}

fn unix_nanos(at: SystemTime) -> i128 {
    match at.duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_nanos() as i128,
        Err(before) => -(before.duration().as_nanos() as i128),
    }
}

/// The registered claims as go-oidc's `idToken` struct receives them.
#[derive(Debug, Default)]
struct Registered {
    issuer: Option<String>,
    audiences: Vec<String>,
    expiry: Option<i64>,
    not_before: Option<i64>,
}

impl Registered {
    /// Every key of `claims` that names a field of go-oidc's `idToken` (ignoring case, as Go
    /// does) must have a type that field accepts, or the whole payload is refused; for a field
    /// named twice, the last wins.
    fn read(claims: &Map<String, Value>) -> Result<Registered, ClaimsRefusal> {
        let mut registered = Registered::default();
        for (key, value) in claims {
            let field = |name: &str| go_field_eq(key, name);
            if field("iss") {
                // `null` leaves a Go string as it was.
                if let Some(issuer) = go_string(value)? {
                    registered.issuer = Some(issuer);
                }
            } else if field("aud") {
                registered.audiences = audiences(value)?;
            } else if field("exp") {
                registered.expiry = Some(go_time(value)?);
            } else if field("nbf") {
                registered.not_before = match value {
                    Value::Null => None,
                    value => Some(go_time(value)?),
                };
            } else if field("iat") {
                go_time(value)?;
            } else if field("sub") || field("nonce") || field("at_hash") {
                go_string(value)?;
            } else if field("_claim_names") {
                string_map(value, |v| go_string(v).map(drop))?;
            } else if field("_claim_sources") {
                string_map(value, |source| match source {
                    Value::Null => Ok(()),
                    Value::Object(fields) => fields
                        .iter()
                        .filter(|(k, _)| {
                            go_field_eq(k, "endpoint") || go_field_eq(k, "access_token")
                        })
                        .try_for_each(|(_, v)| go_string(v).map(drop)),
                    _ => Err(ClaimsRefusal::Malformed),
                })?;
            }
        }
        Ok(registered)
    }
}

/// Whether a JSON key names the Go struct field `name` for `encoding/json`: equal ignoring case
/// with Unicode simple folding (`ſ` is an `s`, the Kelvin sign a `k`).
fn go_field_eq(key: &str, name: &str) -> bool {
    let fold = |c: char| match c {
        '\u{17f}' => 's',
        '\u{212a}' => 'k',
        c => c.to_ascii_lowercase(),
    };
    key.chars().map(fold).eq(name.chars())
}

/// A JSON value read into a Go string: `null` leaves it unset.
fn go_string(value: &Value) -> Result<Option<String>, ClaimsRefusal> {
    match value {
        Value::Null => Ok(None),
        Value::String(value) => Ok(Some(value.clone())),
        _ => Err(ClaimsRefusal::Malformed),
    }
}

/// go-oidc's `audience`: a string (`null` reads as the empty string), else a list of strings.
fn audiences(value: &Value) -> Result<Vec<String>, ClaimsRefusal> {
    match value {
        Value::Null => Ok(vec![String::new()]),
        Value::String(one) => Ok(vec![one.clone()]),
        Value::Array(many) => many
            .iter()
            .map(|value| go_string(value).map(Option::unwrap_or_default))
            .collect(),
        _ => Err(ClaimsRefusal::Malformed),
    }
}

/// A map of strings to values `check` accepts, or `null`.
fn string_map(
    value: &Value,
    check: impl Fn(&Value) -> Result<(), ClaimsRefusal>,
) -> Result<(), ClaimsRefusal> {
    match value {
        Value::Null => Ok(()),
        Value::Object(entries) => entries.values().try_for_each(check),
        _ => Err(ClaimsRefusal::Malformed),
    }
}

/// go-oidc's `jsonTime`: a JSON number, or a string holding one (Go's `json.Number` takes both),
/// read as an integer or else as a float truncated toward zero; `null` and anything else are
/// errors. A float beyond the 64-bit range becomes the smallest integer, as Go's conversion does
/// on amd64.
fn go_time(value: &Value) -> Result<i64, ClaimsRefusal> {
    let text = match value {
        Value::Number(number) => number.to_string(),
        Value::String(text) if is_json_number(text) => text.clone(),
        _ => return Err(ClaimsRefusal::Malformed),
    };
    if let Ok(seconds) = text.parse::<i64>() {
        return Ok(seconds);
    }
    let float: f64 = text.parse().map_err(|_| ClaimsRefusal::Malformed)?;
    // 2^63: the first float past the 64-bit range on either side.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if !(-LIMIT..LIMIT).contains(&float) {
        return Ok(i64::MIN);
    }
    Ok(float.trunc() as i64)
}

/// Whether `text` is a JSON number literal (`-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`).
fn is_json_number(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut at = usize::from(bytes.first() == Some(&b'-'));
    let digits = |at: &mut usize| {
        let start = *at;
        while bytes.get(*at).is_some_and(u8::is_ascii_digit) {
            *at += 1;
        }
        *at > start
    };
    match bytes.get(at) {
        Some(b'0') => at += 1,
        Some(b'1'..=b'9') => {
            digits(&mut at);
        }
        _ => return false,
    }
    if bytes.get(at) == Some(&b'.') {
        at += 1;
        if !digits(&mut at) {
            return false;
        }
    }
    if matches!(bytes.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(bytes.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        if !digits(&mut at) {
            return false;
        }
    }
    at == bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    const ISSUER: &str = "https://issuer.example";

    fn token(header: &str, claims: &str) -> String {
        format!(
            "{}.{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(claims),
            URL_SAFE_NO_PAD.encode(b"signature")
        )
    }

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    fn check(claims: &str, now: SystemTime) -> Result<(), ClaimsRefusal> {
        parse(
            &token(r#"{"alg":"RS256","kid":"k1"}"#, claims),
            ISSUER,
            &["aud-1".to_owned(), "aud-2".to_owned()],
            now,
        )
        .map(drop)
    }

    #[test]
    fn the_issuer_is_read_as_kube_apiserver_reads_it() {
        let of = |claims: &str| untrusted_issuer(&token("{}", claims));
        assert_eq!(of(r#"{"iss":"https://a"}"#).as_deref(), Some("https://a"));
        assert_eq!(of(r#"{"ISS":"https://a"}"#).as_deref(), Some("https://a"));
        assert_eq!(
            of(r#"{"iss":"accounts.google.com"}"#).as_deref(),
            Some("https://accounts.google.com")
        );
        assert_eq!(of(r#"{"sub":"x"}"#), None);
        assert_eq!(untrusted_issuer(" {\"iss\":\"https://a\"}"), None);
        assert_eq!(untrusted_issuer("a.b"), None);
    }

    #[test]
    fn registered_claims_are_checked_as_go_oidc_checks_them() {
        let now = at(1_000_000);
        let ok = r#"{"iss":"https://issuer.example","aud":"aud-2","exp":1000000}"#;
        assert_eq!(check(ok, now), Ok(()));
        // exp has no leeway, and a token without one has expired.
        assert_eq!(
            check(ok, now + Duration::from_millis(1)),
            Err(ClaimsRefusal::Expired)
        );
        assert_eq!(
            check(r#"{"iss":"https://issuer.example","aud":"aud-1"}"#, now),
            Err(ClaimsRefusal::Expired)
        );
        // nbf has a minute.
        let nbf = |nbf: u64| {
            check(
                &format!(
                    r#"{{"iss":"https://issuer.example","aud":["x","aud-1"],"exp":2000000,"nbf":{nbf}}}"#
                ),
                now,
            )
        };
        assert_eq!(nbf(1_000_060), Ok(()));
        assert_eq!(nbf(1_000_061), Err(ClaimsRefusal::NotYetValid));
        // iat is not compared with the clock, but must be a time.
        let iat = r#"{"iss":"https://issuer.example","aud":"aud-1","exp":2000000,"iat":9000000}"#;
        assert_eq!(check(iat, now), Ok(()));
        let iat = r#"{"iss":"https://issuer.example","aud":"aud-1","exp":2000000,"iat":null}"#;
        assert_eq!(check(iat, now), Err(ClaimsRefusal::Malformed));
        // Times may be quoted numbers or floats.
        let quoted = r#"{"iss":"https://issuer.example","aud":"aud-1","exp":"2e6"}"#;
        assert_eq!(check(quoted, now), Ok(()));
        let word = r#"{"iss":"https://issuer.example","aud":"aud-1","exp":"soon"}"#;
        assert_eq!(check(word, now), Err(ClaimsRefusal::Malformed));
        // Audiences, issuer, field types matched ignoring case.
        let other = r#"{"iss":"https://issuer.example","aud":["x"],"exp":2000000}"#;
        assert_eq!(check(other, now), Err(ClaimsRefusal::Audience));
        let issuer = r#"{"iss":"https://issuer.example/","aud":"aud-1","exp":2000000}"#;
        assert_eq!(check(issuer, now), Err(ClaimsRefusal::Issuer));
        let sub = r#"{"iss":"https://issuer.example","aud":"aud-1","exp":2000000,"SUB":5}"#;
        assert_eq!(check(sub, now), Err(ClaimsRefusal::Malformed));
        let names = r#"{"iss":"https://issuer.example","aud":"aud-1","exp":2000000,"_claim_names":{"g":1}}"#;
        assert_eq!(check(names, now), Err(ClaimsRefusal::Malformed));
    }

    #[test]
    fn headers_need_no_critical_extension_and_parts_must_decode() {
        let claims = r#"{"iss":"https://issuer.example","aud":"aud-1","exp":2000000}"#;
        let crit = token(r#"{"alg":"RS256","crit":["exp"]}"#, claims);
        assert_eq!(
            parse(&crit, ISSUER, &["aud-1".to_owned()], at(1)).map(drop),
            Err(ClaimsRefusal::Malformed)
        );
        let es256 = token(r#"{"alg":"ES256"}"#, claims);
        let parsed = parse(&es256, ISSUER, &["aud-1".to_owned()], at(1)).unwrap();
        assert_eq!(
            (parsed.algorithm.as_str(), parsed.kid.as_str()),
            ("ES256", "")
        );
        assert_eq!(
            parse("a.b.c.d", ISSUER, &[], at(1)).map(drop),
            Err(ClaimsRefusal::Malformed)
        );
    }

    #[test]
    fn json_numbers_are_recognised() {
        for good in ["0", "-1", "1.5", "1e9", "2E+3", "-0.0e-1"] {
            assert!(is_json_number(good), "{good}");
        }
        for bad in ["", "-", "01", "1.", ".5", "1e", "+1", "0x10", " 1"] {
            assert!(!is_json_number(bad), "{bad}");
        }
        assert_eq!(go_time(&Value::from(1.9)), Ok(1));
        assert_eq!(go_time(&Value::from(1e30)), Ok(i64::MIN));
    }
}

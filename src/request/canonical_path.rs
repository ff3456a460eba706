//! The gate before authentication: a request path is authorized only in the one form the kubelet
//! will route the same way. Canonical paths pass with their percent-decoded form, unclean ones are
//! redirected to their cleaned form (as Go's `ServeMux` does), ambiguous or malformed ones rejected.

use std::borrow::Cow;

pub use crate::base::wire::MAX_PATH_LEN;

/// Why a path is refused. The `Display` text is a short reason meant for the client's 400 body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The path does not begin with `/` (empty, `*`, or a relative path): nothing the kubelet
    /// serves.
    #[error("path must begin with '/'")]
    NotAbsolute,
    /// The path is longer than [`MAX_PATH_LEN`].
    #[error("path too long")]
    TooLong,
    /// A literal byte outside RFC 3986 path characters: a control byte, space, non-ASCII, or a
    /// delimiter such as `\` that some clients read as `/` (which would make a redirect location
    /// leave the host).
    #[error("invalid character in path")]
    InvalidCharacter,
    /// A `%` not followed by two hex digits. Go refuses these too.
    #[error("invalid percent-encoding in path")]
    InvalidEscape,
    /// Escapes decoding to a control character: a control byte (0x00–0x1F, 0x7F) or a UTF-8 C1
    /// control (U+0080–U+009F, such as NEL, which some log readers break lines at). No kubelet
    /// path needs them, and they could split or hide parts of the path in logs.
    #[error("percent-encoded control character in path")]
    EncodedControl,
    /// `%2F`: the kubelet decodes it before routing, so it would cross segment boundaries we
    /// authorized as one segment (`/stats%2F..%2Fexec` is `/stats/../exec` to the kubelet).
    #[error("percent-encoded '/' in path")]
    EncodedSlash,
    /// The decoded path is not UTF-8, so it cannot be an authorizer attribute.
    #[error("percent-encoded path is not valid UTF-8")]
    InvalidUtf8,
}

/// What to do with a request path, decided before authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathCheck<'a> {
    /// The raw path is in canonical form: forward it byte for byte, and compute attributes from
    /// `decoded`, which is exactly what the kubelet will see as `r.URL.Path` and route on.
    Canonical {
        /// The percent-decoded path, borrowed from the raw path when it has no escapes.
        decoded: Cow<'a, str>,
    },
    /// The path has a cleaner equivalent: answer 301 with `location` (append `?query` when the
    /// request had one), as the kubelet's router would. `location` is still percent-encoded and
    /// always canonical; it begins with `/` but never `//`, so it stays on this host.
    Redirect {
        /// The cleaned path.
        location: String,
    },
    /// The path is malformed or ambiguous: answer 400 with the error's text.
    Reject(PathError),
}

/// Classifies a raw request path (`uri.path()`: still percent-encoded, query excluded).
///
/// The path is canonical when it needs no cleaning: no escape of an RFC 3986 unreserved character
/// (`A-Za-z0-9-._~`, which must appear literally), no empty segment except a trailing slash, no
/// `.` or `..` segment. Checks run in one pass and allocate only when the path has escapes.
pub fn check_path(raw: &str) -> PathCheck<'_> {
    match scan(raw) {
        Err(error) => PathCheck::Reject(error),
        Ok(Scan {
            needs_cleaning: true,
            ..
        }) => PathCheck::Redirect {
            location: clean(raw),
        },
        Ok(Scan { decoded: None, .. }) => PathCheck::Canonical {
            decoded: Cow::Borrowed(raw),
        },
        Ok(Scan {
            decoded: Some(decoded),
            ..
        }) => PathCheck::Canonical {
            decoded: Cow::Owned(decoded),
        },
    }
}

/// The outcome of the validating pass over a raw path.
struct Scan {
    /// The decoded path; `None` when the raw path has no escapes and is its own decoded form.
    decoded: Option<String>,
    /// The path is valid but not canonical.
    needs_cleaning: bool,
}

fn scan(raw: &str) -> Result<Scan, PathError> {
    let bytes = raw.as_bytes();
    if bytes.len() > MAX_PATH_LEN {
        return Err(PathError::TooLong);
    }
    if bytes.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    let mut decoded: Option<Vec<u8>> = None;
    let mut needs_cleaning = false;
    // The segment being read: its raw length and how many of its bytes are literal dots.
    let mut segment_len = 0;
    let mut segment_dots = 0;
    let mut i = 1;
    while let Some(&byte) = bytes.get(i) {
        let value = match byte {
            b'/' => {
                if segment_len == 0 || is_dot_segment(segment_len, segment_dots) {
                    needs_cleaning = true;
                }
                segment_len = 0;
                segment_dots = 0;
                i += 1;
                byte
            }
            b'%' => {
                let value = escape_value(bytes.get(i + 1..)).ok_or(PathError::InvalidEscape)?;
                if value == b'/' {
                    return Err(PathError::EncodedSlash);
                }
                if value.is_ascii_control() {
                    return Err(PathError::EncodedControl);
                }
                if is_unreserved(value) {
                    needs_cleaning = true;
                }
                if decoded.is_none() {
                    let mut buffer = Vec::with_capacity(bytes.len());
                    // `bytes.get(i)` is `Some`, so `..i` is in bounds.
                    buffer.extend_from_slice(&bytes[..i]);
                    decoded = Some(buffer);
                }
                segment_len += 3;
                i += 3;
                value
            }
            _ if is_literal_path_byte(byte) => {
                if byte == b'.' {
                    segment_dots += 1;
                }
                segment_len += 1;
                i += 1;
                byte
            }
            _ => return Err(PathError::InvalidCharacter),
        };
        if let Some(buffer) = decoded.as_mut() {
            buffer.push(value);
        }
    }
    // The last segment may be empty (a trailing slash) but not `.` or `..`.
    if is_dot_segment(segment_len, segment_dots) {
        needs_cleaning = true;
    }
    let decoded = match decoded {
        Some(buffer) => {
            let text = String::from_utf8(buffer).map_err(|_| PathError::InvalidUtf8)?;
            // Literal bytes are ASCII, so a C1 control can only come from escapes.
            if text.chars().any(char::is_control) {
                return Err(PathError::EncodedControl);
            }
            Some(text)
        }
        None => None,
    };
    Ok(Scan {
        decoded,
        needs_cleaning,
    })
}

/// A segment that is `.` or `..` written literally (escaped dots make the path unclean anyway).
fn is_dot_segment(len: usize, dots: usize) -> bool {
    (len == 1 || len == 2) && dots == len
}

/// The byte encoded by the two hex digits at the start of `after_percent`, if they are there.
fn escape_value(after_percent: Option<&[u8]>) -> Option<u8> {
    match after_percent? {
        [hi, lo, ..] => Some((hex_digit(*hi)? << 4) | hex_digit(*lo)?),
        _ => None,
    }
}

fn hex_digit(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// RFC 3986 unreserved characters: their escapes mean the same as the character itself.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// Bytes RFC 3986 allows literally in a path segment (`pchar` without escapes).
fn is_literal_path_byte(byte: u8) -> bool {
    is_unreserved(byte)
        || matches!(
            byte,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
        )
}

/// The cleaned form of a path that [`scan`] accepted: unreserved escapes decoded, then Go's
/// `cleanPath` (empty and `.` segments dropped, `..` resolved but never above the root, a trailing
/// slash kept unless the result is `/`). Other escapes are kept as they are; since `%2F` was
/// refused, segments here are the segments Go cleans after decoding.
fn clean(raw: &str) -> String {
    let mut unescaped = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '%' {
            let rest = chars.as_str();
            if let Some(value) = escape_value(Some(rest.as_bytes()))
                && is_unreserved(value)
                && let Some(after) = rest.get(2..)
            {
                unescaped.push(char::from(value));
                chars = after.chars();
                continue;
            }
        }
        unescaped.push(c);
    }

    let mut cleaned = String::with_capacity(unescaped.len());
    for segment in unescaped.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                if let Some(parent_end) = cleaned.rfind('/') {
                    cleaned.truncate(parent_end);
                }
            }
            _ => {
                cleaned.push('/');
                cleaned.push_str(segment);
            }
        }
    }
    if cleaned.is_empty() || unescaped.ends_with('/') {
        cleaned.push('/');
    }
    cleaned
}

#[cfg(test)]
mod tests;

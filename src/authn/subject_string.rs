//! Subject attribute values read as Go's `crypto/x509` reads them (Go 1.22+ `parser.go`
//! `parseASN1String`), so that a certificate names the same user and groups for the proxy as for
//! the kubelet: PrintableString, UTF8String, IA5String and NumericString (validated), T61String
//! (each byte a Latin-1 character) and BMPString (UTF-16, big-endian). Go refuses any other
//! string type, and any value that breaks its type's rules, as an unparseable certificate; so
//! does the proxy (a 401). Reading fewer types than Go would let a later `CN=nobody` in a
//! BMPString go unseen and an earlier `CN=reader` stand: another user than the kubelet's.

use x509_parser::asn1_rs::{Any, Tag};

/// Why an attribute value is not a string Go would accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubjectStringError {
    /// A type Go's parser does not decode.
    #[error("unsupported string type (tag {0})")]
    Unsupported(u32),
    /// Bytes that break the type's rules.
    #[error("invalid {0}")]
    Invalid(&'static str),
}

/// The text of one subject attribute value, as Go decodes it.
pub fn decode(value: &Any<'_>) -> Result<String, SubjectStringError> {
    let data = value.data;
    match value.tag() {
        Tag::PrintableString => {
            check(data.iter().all(|&b| is_printable(b)), "PrintableString")?;
            utf8(data, "PrintableString")
        }
        Tag::Utf8String => utf8(data, "UTF8String"),
        Tag::Ia5String => {
            check(data.is_ascii(), "IA5String")?;
            utf8(data, "IA5String")
        }
        Tag::NumericString => {
            check(
                data.iter().all(|&b| b.is_ascii_digit() || b == b' '),
                "NumericString",
            )?;
            utf8(data, "NumericString")
        }
        // Go reads each byte as the code point of the same value.
        Tag::TeletexString => Ok(data.iter().map(|&b| char::from(b)).collect()),
        Tag::BmpString => bmp(data),
        other => Err(SubjectStringError::Unsupported(other.0)),
    }
}

fn check(valid: bool, kind: &'static str) -> Result<(), SubjectStringError> {
    if valid {
        Ok(())
    } else {
        Err(SubjectStringError::Invalid(kind))
    }
}

fn utf8(data: &[u8], kind: &'static str) -> Result<String, SubjectStringError> {
    std::str::from_utf8(data)
        .map(str::to_owned)
        .map_err(|_| SubjectStringError::Invalid(kind))
}

/// Go's `isPrintable`, which accepts `*` and `&` beyond X.680's set because real certificates
/// carry them.
fn is_printable(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b" '()+,-./:=?*&".contains(&b)
}

/// Go's `parseBMPString`: an even length, one trailing NUL character dropped, then UTF-16
/// decoding with unpaired surrogates as U+FFFD.
fn bmp(data: &[u8]) -> Result<String, SubjectStringError> {
    if !data.len().is_multiple_of(2) {
        return Err(SubjectStringError::Invalid("BMPString"));
    }
    let data = match data {
        [rest @ .., 0, 0] => rest,
        _ => data,
    };
    let units = data
        .chunks_exact(2)
        .map(|pair| u16::from_be_bytes([pair[0], pair[1]]));
    Ok(char::decode_utf16(units)
        .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::asn1_rs::{Class, Header, Length};

    fn any(tag: Tag, data: &[u8]) -> Any<'_> {
        Any::new(
            Header::new(Class::Universal, false, tag, Length::Definite(data.len())),
            data,
        )
    }

    #[test]
    fn every_string_type_go_reads_is_decoded_as_go_decodes_it() {
        let cases: [(Tag, &[u8], &str); 8] = [
            (Tag::PrintableString, b"reader (ops) *&", "reader (ops) *&"),
            (Tag::Utf8String, "zoë".as_bytes(), "zoë"),
            (Tag::Ia5String, b"nobody@example", "nobody@example"),
            (Tag::NumericString, b"12 34", "12 34"),
            (Tag::TeletexString, b"Jos\xe9", "José"),
            (Tag::BmpString, b"\x00n\x00o\x00b\x00o\x00d\x00y", "nobody"),
            (Tag::BmpString, b"\x00a\x00\x00", "a"),
            (Tag::BmpString, b"\xd8\x3d\xde\x00", "😀"),
        ];
        for (tag, data, text) in cases {
            assert_eq!(decode(&any(tag, data)).as_deref(), Ok(text), "{tag:?}");
        }
    }

    #[test]
    fn values_go_refuses_are_errors() {
        let cases: [(Tag, &[u8]); 6] = [
            (Tag::PrintableString, b"under_score"),
            (Tag::Ia5String, b"caf\xc3\xa9"),
            (Tag::NumericString, b"12a"),
            (Tag::Utf8String, b"\xff"),
            (Tag::BmpString, b"\x00a\x00"),
            (Tag::OctetString, b"x"),
        ];
        for (tag, data) in cases {
            assert!(decode(&any(tag, data)).is_err(), "{tag:?} {data:?}");
        }
    }
}

//! The little of HTTP/1.1 the stream client needs, by hand so that nothing between the socket
//! and the count buffers or re-cuts the stream: a response head, and the chunked body decoded
//! as it arrives.

use anyhow::Context as _;

/// A response's status line and headers.
#[derive(Debug)]
pub struct Head {
    pub status: u16,
    headers: Vec<(String, String)>,
}

impl Head {
    /// Parses a head (without its final empty line); header names are case-insensitive.
    pub fn parse(text: &[u8]) -> anyhow::Result<Head> {
        let text = std::str::from_utf8(text).context("response head is not UTF-8")?;
        let mut lines = text.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("bad status line {status_line:?}"))?;
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        Ok(Head { status, headers })
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// How the body of a 200 ends.
    pub fn body(&self) -> anyhow::Result<BodyFraming> {
        if self
            .get("transfer-encoding")
            .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
        {
            return Ok(BodyFraming::Chunked(Chunked::new()));
        }
        match self.get("content-length") {
            Some(n) => Ok(BodyFraming::Length(
                n.parse().context("bad content-length")?,
            )),
            None => Ok(BodyFraming::UntilClose),
        }
    }
}

/// Where the end of the head is in `buf`, if it has arrived: the index after `\r\n\r\n`.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// How a body is delimited.
#[derive(Debug)]
pub enum BodyFraming {
    Chunked(Chunked),
    /// Bytes left.
    Length(u64),
    UntilClose,
}

impl BodyFraming {
    /// Takes the next bytes of the body and hands its payload to `out`.
    pub fn feed(&mut self, bytes: &[u8], out: &mut impl FnMut(&[u8])) -> anyhow::Result<()> {
        match self {
            BodyFraming::Chunked(c) => c.feed(bytes, out),
            BodyFraming::Length(left) => {
                let n = (*left).min(bytes.len() as u64) as usize;
                out(&bytes[..n]);
                *left -= n as u64;
                anyhow::ensure!(n == bytes.len(), "bytes after the end of the body");
                Ok(())
            }
            BodyFraming::UntilClose => {
                out(bytes);
                Ok(())
            }
        }
    }

    /// Whether the body is complete (a body delimited by closing never is before it closes).
    pub fn done(&self) -> bool {
        match self {
            BodyFraming::Chunked(c) => c.state == State::Done,
            BodyFraming::Length(left) => *left == 0,
            BodyFraming::UntilClose => false,
        }
    }
}

/// A chunked body decoder (RFC 9112 §7.1): chunk extensions and trailers are skipped.
#[derive(Debug)]
pub struct Chunked {
    state: State,
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    /// Reading a chunk size: its value so far.
    Size(u64),
    /// Skipping the rest of a size line (extensions); the size read.
    SizeLine(u64),
    /// Data left in the chunk.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// At the start of a trailer line, or the final empty line.
    TrailerStart,
    TrailerLine,
    Done,
}

impl Chunked {
    /// A decoder at the start of a body.
    pub fn new() -> Chunked {
        Chunked {
            state: State::Size(0),
        }
    }

    fn feed(&mut self, mut bytes: &[u8], out: &mut impl FnMut(&[u8])) -> anyhow::Result<()> {
        while let Some(&b) = bytes.first() {
            let state = std::mem::replace(&mut self.state, State::Done);
            self.state = match state {
                State::Data(left) => {
                    let n = left.min(bytes.len() as u64) as usize;
                    out(&bytes[..n]);
                    bytes = &bytes[n..];
                    match left - n as u64 {
                        0 => State::DataEnd,
                        rest => State::Data(rest),
                    }
                }
                other => {
                    bytes = &bytes[1..];
                    Self::step(other, b)?
                }
            };
        }
        Ok(())
    }

    /// The state after byte `b` outside a chunk's data.
    fn step(state: State, b: u8) -> anyhow::Result<State> {
        Ok(match (state, b) {
            (State::Size(v), b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F') => {
                let digit = u64::from((b as char).to_digit(16).unwrap_or(0));
                State::Size(v.checked_mul(16).context("chunk size overflows")? + digit)
            }
            (State::Size(0) | State::SizeLine(0), b'\n') => State::TrailerStart,
            (State::Size(v) | State::SizeLine(v), b'\n') => State::Data(v),
            (State::Size(v) | State::SizeLine(v), _) => State::SizeLine(v),
            (State::DataEnd, b'\r') => State::DataEnd,
            (State::DataEnd, b'\n') => State::Size(0),
            (State::DataEnd, other) => anyhow::bail!("byte {other:#x} after a chunk's data"),
            (State::TrailerStart, b'\r') => State::TrailerStart,
            (State::TrailerStart, b'\n') => State::Done,
            (State::TrailerLine, b'\n') => State::TrailerStart,
            (State::TrailerStart | State::TrailerLine, _) => State::TrailerLine,
            (State::Done, _) => anyhow::bail!("bytes after the end of the chunked body"),
            // `feed` hands a chunk's data out itself.
            (data @ State::Data(_), _) => data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_decode_in_any_cut() {
        let wire = b"5\r\nhello\r\n1;ext=1\r\n \r\n6\r\nworld\n\r\n0\r\nx-trailer: 1\r\n\r\n";
        for cut in 1..wire.len() {
            let mut body = BodyFraming::Chunked(Chunked::new());
            let mut got = Vec::new();
            for piece in wire.chunks(cut) {
                body.feed(piece, &mut |b| got.extend_from_slice(b)).unwrap();
            }
            assert_eq!(got, b"hello world\n", "cut {cut}");
            assert!(body.done(), "cut {cut}");
        }
    }
}

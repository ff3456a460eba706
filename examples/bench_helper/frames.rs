//! The framing of the kubelet's upgraded streams, shared by the stand-in kubelet (`kubelet`) and
//! the stream client (`stream`): WebSocket frames (RFC 6455) carrying Kubernetes' channel byte,
//! and SPDY/3 DATA frames. Only what the benchmark needs: frames are built whole, so that each is
//! one write, and read by a deframer that counts payload without buffering it, so that reading
//! costs the same for every target.

/// The largest data a frame carries: the buffer of Go's `io.Copy`, which the kubelet's exec
/// and port-forward streams write through.
pub const FRAME_DATA: usize = 32 * 1024;

/// WebSocket opcodes used here.
pub const WS_BINARY: u8 = 0x2;
pub const WS_CLOSE: u8 = 0x8;

/// Kubernetes' exec channels (the first payload byte of each WebSocket frame).
pub const CHANNEL_STDOUT: u8 = 1;
pub const CHANNEL_STATUS: u8 = 3;
/// Port-forward channels: data and error of the first port.
pub const CHANNEL_PF_DATA: u8 = 0;
pub const CHANNEL_PF_ERROR: u8 = 1;

/// The SPDY stream the stand-in writes its DATA frames on (the skipped setup would have opened it).
pub const SPDY_STREAM: u32 = 3;
/// SPDY's FIN flag: the last frame of a stream.
pub const SPDY_FIN: u8 = 0x01;

pub use kubelet_auth_proxy::tools::demo::kubelet::websocket_accept;

/// One whole WebSocket frame (FIN set): header, then `prefix` and `data` as its payload, masked
/// with `mask` when given (frames a client sends must be masked).
pub fn ws_frame(opcode: u8, prefix: &[u8], data: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let len = prefix.len() + data.len();
    let mut frame = Vec::with_capacity(len + 14);
    frame.push(0x80 | opcode);
    let mask_bit = if mask.is_some() { 0x80 } else { 0 };
    match len {
        0..=125 => frame.push(mask_bit | len as u8),
        126..=0xffff => {
            frame.push(mask_bit | 126);
            frame.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            frame.push(mask_bit | 127);
            frame.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
    let start = frame.len() + mask.map_or(0, |m| m.len());
    if let Some(mask) = mask {
        frame.extend_from_slice(&mask);
    }
    frame.extend_from_slice(prefix);
    frame.extend_from_slice(data);
    if let Some(mask) = mask {
        for (i, byte) in frame[start..].iter_mut().enumerate() {
            *byte ^= mask[i % 4];
        }
    }
    frame
}

/// The close frame with status 1000 (normal closure), unmasked (server) or masked (client).
pub fn ws_close(mask: Option<[u8; 4]>) -> Vec<u8> {
    ws_frame(WS_CLOSE, &1000u16.to_be_bytes(), &[], mask)
}

/// One whole SPDY/3 DATA frame on `stream`: the 8-byte header (control bit 0, 31-bit stream id,
/// flags, 24-bit length), then `data`.
pub fn spdy_data(stream: u32, flags: u8, data: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(data.len() + 8);
    frame.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    let len = (data.len() as u32).to_be_bytes();
    frame.extend_from_slice(&[flags, len[1], len[2], len[3]]);
    frame.extend_from_slice(data);
    frame
}

/// Which framing a stream uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    WebSocket,
    Spdy,
}

/// Reads frames as their bytes arrive, in any cut, and counts the data they carry: for
/// WebSocket the payload of the data channel's frames less the channel byte (and less the port
/// prefix of that channel's first frame when port-forwarding), for SPDY every DATA payload. It
/// ends at a WebSocket close frame or a SPDY frame with FIN.
#[derive(Debug)]
pub struct Deframer {
    framing: Framing,
    /// The WebSocket channel whose data is counted.
    data_channel: u8,
    /// Whether the first frame of each channel starts with a 2-byte port (port-forward).
    port_prefix: bool,
    head: [u8; 14],
    head_len: usize,
    frame: Option<Frame>,
    /// Channels that have had their first frame.
    channels_seen: [bool; 256],
    /// Data bytes counted so far.
    pub data: u64,
    /// Frames read whole.
    pub frames: u64,
    /// The stream's end (close frame or FIN) has been read whole.
    pub ended: bool,
}

#[derive(Debug)]
struct Frame {
    /// WebSocket opcode, or SPDY flags.
    kind: u8,
    len: u64,
    pos: u64,
    mask: Option<[u8; 4]>,
    channel: Option<u8>,
}

impl Deframer {
    pub fn new(framing: Framing, data_channel: u8, port_prefix: bool) -> Deframer {
        Deframer {
            framing,
            data_channel,
            port_prefix,
            head: [0; 14],
            head_len: 0,
            frame: None,
            channels_seen: [false; 256],
            data: 0,
            frames: 0,
            ended: false,
        }
    }

    /// Takes the next bytes of the stream.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match &mut self.frame {
                None => {
                    let take = (self.head_needed() - self.head_len).min(bytes.len());
                    self.head[self.head_len..self.head_len + take].copy_from_slice(&bytes[..take]);
                    self.head_len += take;
                    bytes = &bytes[take..];
                    if self.head_len == self.head_needed() {
                        self.start_frame();
                    }
                }
                Some(frame) => {
                    let take = (frame.len - frame.pos).min(bytes.len() as u64) as usize;
                    if self.framing == Framing::WebSocket && frame.pos == 0 && take > 0 {
                        frame.channel = Some(bytes[0] ^ frame.mask.map_or(0, |m| m[0]));
                    }
                    let (start, end) = (frame.pos, frame.pos + take as u64);
                    frame.pos = end;
                    bytes = &bytes[take..];
                    let counted = self.counted(start, end);
                    self.data += counted;
                    self.end_frame_if_whole();
                }
            }
        }
    }

    /// Bytes of the header read so far say how long it is.
    fn head_needed(&self) -> usize {
        match self.framing {
            Framing::Spdy => 8,
            Framing::WebSocket if self.head_len < 2 => 2,
            Framing::WebSocket => {
                let masked = if self.head[1] & 0x80 != 0 { 4 } else { 0 };
                let extended = match self.head[1] & 0x7f {
                    126 => 2,
                    127 => 8,
                    _ => 0,
                };
                2 + extended + masked
            }
        }
    }

    fn start_frame(&mut self) {
        let h = &self.head;
        let frame = match self.framing {
            Framing::Spdy => Frame {
                kind: h[4],
                len: u64::from(u32::from_be_bytes([0, h[5], h[6], h[7]])),
                pos: 0,
                mask: None,
                channel: None,
            },
            Framing::WebSocket => {
                let (len, at) = match h[1] & 0x7f {
                    126 => (u64::from(u16::from_be_bytes([h[2], h[3]])), 4),
                    127 => {
                        let mut b = [0; 8];
                        b.copy_from_slice(&h[2..10]);
                        (u64::from_be_bytes(b), 10)
                    }
                    n => (u64::from(n), 2),
                };
                let mask = (h[1] & 0x80 != 0).then(|| [h[at], h[at + 1], h[at + 2], h[at + 3]]);
                Frame {
                    kind: h[0] & 0x0f,
                    len,
                    pos: 0,
                    mask,
                    channel: None,
                }
            }
        };
        self.head_len = 0;
        self.frame = Some(frame);
        self.end_frame_if_whole();
    }

    /// Payload bytes `start..end` of the current frame that are data.
    fn counted(&self, start: u64, end: u64) -> u64 {
        let Some(frame) = &self.frame else {
            return 0;
        };
        let skip = match self.framing {
            Framing::Spdy => 0,
            Framing::WebSocket => {
                if frame.kind != WS_BINARY || frame.channel != Some(self.data_channel) {
                    return 0;
                }
                let first = !self.channels_seen[usize::from(self.data_channel)];
                if self.port_prefix && first { 3 } else { 1 }
            }
        };
        end.saturating_sub(start.max(skip))
    }

    fn end_frame_if_whole(&mut self) {
        let Some(frame) = &self.frame else { return };
        if frame.pos < frame.len {
            return;
        }
        self.frames += 1;
        match self.framing {
            Framing::Spdy => self.ended |= frame.kind & SPDY_FIN != 0,
            Framing::WebSocket => {
                self.ended |= frame.kind == WS_CLOSE;
                if let Some(channel) = frame.channel {
                    self.channels_seen[usize::from(channel)] = true;
                }
            }
        }
        self.frame = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deframer_counts_data_in_any_cut() {
        let mask = Some([1, 2, 3, 4]);
        let mut wire = ws_frame(WS_BINARY, &[CHANNEL_PF_DATA, 80, 0], &[], mask);
        wire.extend(ws_frame(WS_BINARY, &[CHANNEL_PF_ERROR, 80, 0], &[], mask));
        wire.extend(ws_frame(WS_BINARY, &[CHANNEL_PF_DATA], &[7; 70000], mask));
        wire.extend(ws_frame(WS_BINARY, &[CHANNEL_PF_DATA], &[7; 300], mask));
        wire.extend(ws_close(mask));
        for cut in [1, 3, 13, 4096, wire.len()] {
            let mut d = Deframer::new(Framing::WebSocket, CHANNEL_PF_DATA, true);
            for piece in wire.chunks(cut) {
                d.feed(piece);
            }
            assert_eq!((d.data, d.frames, d.ended), (70300, 5, true), "cut {cut}");
        }
        let mut spdy = spdy_data(SPDY_STREAM, 0, &[1; 32768]);
        spdy.extend(spdy_data(SPDY_STREAM, SPDY_FIN, &[1; 5]));
        let mut d = Deframer::new(Framing::Spdy, 0, false);
        for piece in spdy.chunks(1000) {
            d.feed(piece);
        }
        assert_eq!((d.data, d.frames, d.ended), (32773, 2, true));
    }
}

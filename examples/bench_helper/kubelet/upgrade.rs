//! Exec and port-forward after the 101, written as the kubelet writes them: frames of at most
//! 32 KiB (Go's `io.Copy` buffer), each one write and one flush.
//!
//! The SPDY variant skips SYN_STREAM stream setup (and the error and resize streams) and sends
//! DATA frames on stream 3 right away: after the 101 a proxy copies opaque bytes, so only the
//! framing sizes and the write pattern matter to what is measured.

use anyhow::Context as _;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::frames::{
    CHANNEL_PF_DATA, CHANNEL_PF_ERROR, CHANNEL_STATUS, CHANNEL_STDOUT, Deframer, FRAME_DATA,
    Framing, SPDY_FIN, SPDY_STREAM, WS_BINARY, spdy_data, ws_close, ws_frame,
};

/// What runs on an upgraded connection.
#[derive(Debug, Clone, Copy)]
pub struct Session {
    pub framing: Framing,
    pub kind: Kind,
    /// Bytes to send (exec stdout, port-forward down) or to receive (port-forward up).
    pub bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Exec with stdout: the stand-in sends `bytes` of stdout, then the status and the end.
    Exec,
    /// Port-forward towards the client.
    ForwardDown { port: u16 },
    /// Port-forward from the client: the stand-in reads `bytes`, then answers with the end.
    ForwardUp { port: u16 },
}

/// The data every frame carries: its content does not matter, only its size.
static DATA: [u8; FRAME_DATA] = [b'x'; FRAME_DATA];

/// The exec status the kubelet sends on channel 3 when the command succeeded.
const EXEC_SUCCESS: &[u8] = br#"{"metadata":{},"status":"Success"}"#;

impl Session {
    pub async fn run(self, upgraded: Upgraded) -> anyhow::Result<()> {
        let mut io = TokioIo::new(upgraded);
        let ws = self.framing == Framing::WebSocket;
        match self.kind {
            Kind::Exec => {
                let prefix: &[u8] = if ws { &[CHANNEL_STDOUT] } else { &[] };
                self.send(&mut io, prefix).await?;
                if ws {
                    write(
                        &mut io,
                        &ws_frame(WS_BINARY, &[CHANNEL_STATUS], EXEC_SUCCESS, None),
                    )
                    .await?;
                    write(&mut io, &ws_close(None)).await?;
                }
            }
            Kind::ForwardDown { port } => {
                if ws {
                    announce_port(&mut io, port).await?;
                }
                let prefix: &[u8] = if ws { &[CHANNEL_PF_DATA] } else { &[] };
                self.send(&mut io, prefix).await?;
                if ws {
                    write(&mut io, &ws_close(None)).await?;
                }
            }
            Kind::ForwardUp { port } => {
                if ws {
                    announce_port(&mut io, port).await?;
                }
                // The client's frames carry no port prefix: only the kubelet announces the port.
                let mut deframer = Deframer::new(self.framing, CHANNEL_PF_DATA, false);
                let mut buf = vec![0; 64 * 1024];
                while deframer.data < self.bytes {
                    let n = io.read(&mut buf).await.context("reading forwarded data")?;
                    anyhow::ensure!(
                        n > 0,
                        "the client closed after {} of {} bytes",
                        deframer.data,
                        self.bytes
                    );
                    deframer.feed(&buf[..n]);
                }
                // A small last frame: the client times the transfer up to it.
                let end = if ws {
                    ws_close(None)
                } else {
                    spdy_data(SPDY_STREAM, SPDY_FIN, b"done")
                };
                write(&mut io, &end).await?;
            }
        }
        io.shutdown().await.ok();
        Ok(())
    }

    /// Sends `bytes` of data in frames of at most [`FRAME_DATA`], each one write and one flush;
    /// a SPDY stream's last frame carries FIN. Full frames are built once and written again.
    async fn send(&self, io: &mut TokioIo<Upgraded>, prefix: &[u8]) -> anyhow::Result<()> {
        let frame = |data: &[u8], last: bool| match self.framing {
            Framing::WebSocket => ws_frame(WS_BINARY, prefix, data, None),
            Framing::Spdy => spdy_data(SPDY_STREAM, if last { SPDY_FIN } else { 0 }, data),
        };
        let full = frame(&DATA, false);
        let mut left = self.bytes;
        while left > 0 {
            let n = left.min(FRAME_DATA as u64) as usize;
            left -= n as u64;
            if n == FRAME_DATA && (left > 0 || self.framing == Framing::WebSocket) {
                write(io, &full).await?;
            } else {
                write(io, &frame(&DATA[..n], left == 0)).await?;
            }
        }
        Ok(())
    }
}

/// The first frame of each port-forward channel carries the port, 2 bytes little-endian.
async fn announce_port(io: &mut TokioIo<Upgraded>, port: u16) -> anyhow::Result<()> {
    let port = port.to_le_bytes();
    for channel in [CHANNEL_PF_DATA, CHANNEL_PF_ERROR] {
        write(
            io,
            &ws_frame(WS_BINARY, &[channel, port[0], port[1]], &[], None),
        )
        .await?;
    }
    Ok(())
}

/// One frame: one write, one flush.
async fn write(io: &mut TokioIo<Upgraded>, frame: &[u8]) -> anyhow::Result<()> {
    io.write_all(frame).await.context("writing a frame")?;
    io.flush().await.context("flushing a frame")?;
    Ok(())
}

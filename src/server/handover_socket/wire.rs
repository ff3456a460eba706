//! What the two processes say to each other on `--handover-socket`, one line each way:
//!
//! - the new process asks: [`ASK`];
//! - the running one answers `sockets <role>:<role>…` with the descriptors attached
//!   (`SCM_RIGHTS`), or [`DRAINING`] (it is stopping: its sockets close with it);
//! - the new process says [`SERVING`] once it serves and holds the path, or closes without it;
//! - the line then stays open as long as both run: the new process says [`END_DRAIN`] when it
//!   begins draining sessions itself (a later rollout replaced it), and the old one, if it is
//!   still draining its own, closes them then, so a node has at most one draining proxy
//!   (`server::drain`). A version that closes the line instead ends nothing.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, Interest};
use tokio::net::UnixStream;

/// The question, with the protocol's version.
pub(super) const ASK: &[u8] = b"kubelet-auth-proxy handover/1\n";
/// The new process serves.
pub(super) const SERVING: &[u8] = b"serving\n";
/// The running process is stopping and hands nothing over.
pub(super) const DRAINING: &[u8] = b"draining\n";
/// The new process drains sessions of its own now: the old one closes what it still drains.
pub(super) const END_DRAIN: &[u8] = b"end-drain\n";
/// The start of the answer that carries the sockets.
const SOCKETS: &str = "sockets ";
/// The most sockets one answer carries (listen addresses and the admin address).
pub(super) const MAX_SOCKETS: usize = 64;
/// The longest line either side reads.
const MAX_LINE: usize = 4096;

/// Reads one line of at most [`MAX_LINE`] bytes, without its newline; what the peer said if it
/// closed first.
pub(super) async fn read_line(stream: &mut UnixStream) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < MAX_LINE {
        if stream.read(&mut byte).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("closed after {:?}", String::from_utf8_lossy(&line)),
            ));
        }
        if byte[0] == b'\n' {
            return Ok(line);
        }
        line.push(byte[0]);
    }
    Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"))
}

/// Writes `line` whole.
pub(super) async fn write_line(stream: &mut UnixStream, line: &[u8]) -> io::Result<()> {
    stream.write_all(line).await?;
    stream.flush().await
}

/// Sends `sockets` with their names, in one message: the descriptors travel with its first byte.
pub(super) async fn send_sockets(
    stream: &mut UnixStream,
    sockets: &[(&'static str, BorrowedFd<'_>)],
) -> io::Result<()> {
    if sockets.is_empty() || sockets.len() > MAX_SOCKETS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} sockets to hand over", sockets.len()),
        ));
    }
    let names: Vec<&str> = sockets.iter().map(|(name, _)| *name).collect();
    let line = format!("{SOCKETS}{}\n", names.join(":"));
    let fds: Vec<BorrowedFd<'_>> = sockets.iter().map(|(_, fd)| *fd).collect();
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("the descriptors do not fit their buffer"));
    }
    let sent = stream
        .async_io(Interest::WRITABLE, || {
            rustix::net::sendmsg(
                &*stream,
                &[IoSlice::new(line.as_bytes())],
                &mut control,
                SendFlags::NOSIGNAL,
            )
            .map_err(io::Error::from)
        })
        .await?;
    // The descriptors went with the first byte; the rest of the line, if the socket took only
    // part of it, follows as plain bytes.
    write_line(stream, &line.as_bytes()[sent..]).await
}

/// What the running process answered.
pub(super) enum Answer {
    /// The listening sockets, named.
    Sockets(Vec<(String, OwnedFd)>),
    /// It is stopping.
    Draining,
}

/// Receives the answer to [`ASK`].
pub(super) async fn receive_sockets(stream: &mut UnixStream) -> io::Result<Answer> {
    let mut buffer = [0u8; MAX_LINE];
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_SOCKETS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = stream
        .async_io(Interest::READABLE, || {
            rustix::net::recvmsg(
                &*stream,
                &mut [IoSliceMut::new(&mut buffer)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )
            .map_err(io::Error::from)
        })
        .await?;
    // Owned at once, so that they are closed whatever goes wrong below.
    let mut fds: Vec<OwnedFd> = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    if received.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("more than {MAX_SOCKETS} descriptors"),
        ));
    }
    let mut line = buffer[..received.bytes].to_vec();
    if received.bytes == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "closed without answering",
        ));
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    } else {
        line.extend(read_line(stream).await?);
    }
    if line == DRAINING.strip_suffix(b"\n").unwrap_or(DRAINING) && fds.is_empty() {
        return Ok(Answer::Draining);
    }
    let names = std::str::from_utf8(&line)
        .ok()
        .and_then(|line| line.strip_prefix(SOCKETS))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected answer {:?}", String::from_utf8_lossy(&line)),
            )
        })?;
    let names: Vec<String> = names.split(':').map(str::to_owned).collect();
    if names.len() != fds.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} names for {} descriptors", names.len(), fds.len()),
        ));
    }
    Ok(Answer::Sockets(names.into_iter().zip(fds).collect()))
}

//! `SO_RCVLOWAT` on a socket: the bytes that must be waiting before the kernel calls it readable
//! (and wakes whoever polls it). Neither the standard library, socket2 nor rustix sets it, so
//! this file calls `setsockopt(2)` itself: the one unsafe call of the forwarding layer.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Sets `SO_RCVLOWAT` of `socket` to `bytes` (at least 1). Lowering it makes the kernel check
/// again at once and signal readiness if that many bytes already wait (Linux `tcp_set_rcvlowat`).
pub(super) fn set(socket: BorrowedFd<'_>, bytes: usize) -> io::Result<()> {
    let value = libc::c_int::try_from(bytes.max(1)).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is borrowed, hence open for the call; the option value is a c_int
    // that lives across the call, and its size is passed with it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            std::ptr::from_ref(&value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn the_kernel_keeps_the_value_set() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let socket = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        set(socket.as_fd(), 16 * 1024).unwrap();
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: as above, with a c_int to be written and its length.
        let rc = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                std::ptr::from_mut(&mut value).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        assert_eq!(value, 16 * 1024);
    }
}

//! The TCP mesh: one connection per pair of ranks and a poll-driven exchange engine.
//!
//! Building: every rank has bound a listener before the rendezvous. Rank `i` connects to every
//! rank `j < i` and sends `MAGIC, key, i, j`; rank `j` accepts, checks the key and the ranks,
//! and answers one byte. The dependencies point to lower ranks only, so this cannot deadlock.
//!
//! Data path: after building, the sockets are non-blocking. [`Mesh::exchange`] progresses any
//! set of sends and receives (at most one of each per peer) together in one thread with
//! `poll(2)`, so sends and receives run full duplex without helper threads. A receive either
//! lands directly in the destination or goes through a scratch chunk and is reduced into the
//! destination chunk by chunk while the kernel keeps receiving the rest (pipelining).
//! Data frames carry no header: every rank runs the same sequence of collectives with the same
//! lengths, so the byte streams line up (as in MPI).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use crate::element::{Element, ReduceOp};
use crate::error::{CommError, Result};
use crate::rendezvous::stream_alive;
use crate::wire::{self, Reader, Writer, MAGIC};

pub(crate) struct Mesh {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) streams: Vec<Option<TcpStream>>,
    pub(crate) timeout: Duration,
}

/// One send of an exchange.
pub(crate) struct SendReq<'a> {
    pub(crate) peer: usize,
    pub(crate) data: &'a [u8],
}

/// Where a receive goes.
pub(crate) enum Sink<'a, T> {
    /// Straight into this slice.
    Copy(&'a mut [T]),
    /// Into `tmp` chunk by chunk, each chunk combined into `dst` (`dst = dst op chunk`).
    Reduce {
        dst: &'a mut [T],
        op: ReduceOp,
        tmp: &'a mut [u8],
    },
}

/// One receive of an exchange.
pub(crate) struct RecvReq<'a, T> {
    pub(crate) peer: usize,
    pub(crate) sink: Sink<'a, T>,
}

/// How long [`Mesh::exchange`] busy-polls without progress before it sleeps in `poll(2)`.
/// Measured with 2 ranks: 50 µs made 1 MB - 64 MB allreduces 10 - 30% faster than sleeping at
/// once; 200 µs was no better.
const SPIN: Duration = Duration::from_micros(50);

/// `SO_SNDBUF` for connections to peers on this host (the kernel doubles it). Measured with 2
/// ranks on loopback: 256 KiB made 1 MB - 64 MB allreduces 25 - 45% faster than autotuning
/// (which grows the buffer to 4 MiB, so each `send` copies megabytes into cold socket buffers
/// before the peer drains any); 128 KiB and 512 KiB were no better. Connections to other hosts
/// keep the kernel's autotuning, which a long network path needs.
pub(crate) const LOCAL_SNDBUF_BYTES: usize = 256 << 10;

fn configure(s: &TcpStream, ctx: &str) -> Result<()> {
    // Receive buffers are left to the kernel's autotuning: fixed 512 KiB, 1 MiB and 4 MiB
    // buffers measured no better.
    s.set_nodelay(true)
        .map_err(|e| CommError::io(format!("setting nodelay on {ctx}"), e))
}

/// Said of a connection lost mid-collective: a peer that called another collective, or the
/// same one with other lengths, finishes (or fails) early and leaves, which reads the same.
const UNEVEN: &str = "; if it did neither, check that every rank calls the same collectives \
                      in the same order with the same lengths and element type";

impl Mesh {
    /// Connects the full mesh. `listener` is this rank's bound listener; `addrs[j]` is rank
    /// `j`'s listen address.
    pub(crate) fn build(
        listener: TcpListener,
        key: &str,
        rank: usize,
        addrs: &[String],
        timeout: Duration,
        deadline: Instant,
    ) -> Result<Mesh> {
        let size = addrs.len();
        let mut streams: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
        // Connect to every lower rank.
        for (j, addr) in addrs.iter().enumerate().take(rank) {
            let sa: SocketAddr = addr.parse().map_err(|e| {
                CommError::Rendezvous(format!("rank {j} announced a bad address {addr:?}: {e}"))
            })?;
            let mut s = loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(CommError::Timeout {
                        peer: Some(j),
                        op: "connect",
                        after: timeout,
                    });
                }
                match TcpStream::connect_timeout(&sa, left) {
                    Ok(s) => break s,
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                        return Err(CommError::PeerLost {
                            peer: j,
                            op: "connect",
                            detail: format!("connection to {sa} refused: {e}"),
                        })
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            };
            configure(&s, &format!("connection to rank {j}"))?;
            let hello = Writer::default()
                .u64(MAGIC)
                .str(key)
                .u64(rank as u64)
                .u64(j as u64)
                .finish();
            let lost = |e: std::io::Error| CommError::PeerLost {
                peer: j,
                op: "connect",
                detail: format!("handshake with {sa} failed: {e}"),
            };
            wire::write_frame(&mut s, &hello).map_err(lost)?;
            let left = deadline.saturating_duration_since(Instant::now());
            s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .map_err(|e| CommError::io("setting a handshake timeout", e))?;
            let mut ack = [0u8; 1];
            std::io::Read::read_exact(&mut s, &mut ack).map_err(|e| {
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) {
                    CommError::Timeout {
                        peer: Some(j),
                        op: "connect",
                        after: timeout,
                    }
                } else {
                    lost(e)
                }
            })?;
            if ack[0] != 1 {
                return Err(CommError::Rendezvous(format!(
                    "rank {j} at {sa} rejected the handshake of rank {rank}"
                )));
            }
            streams[j] = Some(s);
        }
        // Accept every higher rank.
        listener
            .set_nonblocking(true)
            .map_err(|e| CommError::io("configuring the mesh listener", e))?;
        let mut missing = size - rank - 1;
        while missing > 0 {
            let (mut s, _) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let peer = (rank + 1..size).find(|&j| streams[j].is_none());
                        return Err(CommError::Timeout {
                            peer,
                            op: "connect",
                            after: timeout,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                Err(e) => return Err(CommError::io("accepting a mesh connection", e)),
            };
            let _ = s.set_nonblocking(false);
            let left = deadline.saturating_duration_since(Instant::now());
            let _ = s.set_read_timeout(Some(left.max(Duration::from_millis(1))));
            let Ok(frame) = wire::read_frame(&mut s) else {
                continue; // a stray or broken connection: ignore it
            };
            let mut r = Reader::new(&frame);
            let ok = (|| {
                if r.u64()? != MAGIC || r.str()? != key {
                    return None;
                }
                let from_rank = r.usize()?;
                let to = r.usize()?;
                (to == rank && from_rank > rank && from_rank < size && streams[from_rank].is_none())
                    .then_some(from_rank)
            })();
            let Some(j) = ok else {
                let _ = std::io::Write::write_all(&mut s, &[0]);
                continue;
            };
            configure(&s, &format!("connection from rank {j}"))?;
            std::io::Write::write_all(&mut s, &[1]).map_err(|e| CommError::PeerLost {
                peer: j,
                op: "connect",
                detail: format!("handshake reply failed: {e}"),
            })?;
            streams[j] = Some(s);
            missing -= 1;
        }
        Ok(Mesh {
            rank,
            size,
            streams,
            timeout,
        })
    }

    /// Switches every connection to non-blocking mode for the data path.
    pub(crate) fn set_data_mode(&self) -> Result<()> {
        for (j, s) in self.streams.iter().enumerate() {
            if let Some(s) = s {
                s.set_nonblocking(true)
                    .map_err(|e| CommError::io(format!("configuring connection to rank {j}"), e))?;
                s.set_read_timeout(None)
                    .map_err(|e| CommError::io(format!("configuring connection to rank {j}"), e))?;
            }
        }
        Ok(())
    }

    /// Applies [`LOCAL_SNDBUF_BYTES`] to the connection of every peer `j` with `local[j]`.
    pub(crate) fn tune_local(&self, local: &[bool]) -> Result<()> {
        for (j, s) in self.streams.iter().enumerate() {
            let Some(s) = s else { continue };
            if !local.get(j).copied().unwrap_or(false) {
                continue;
            }
            let v = LOCAL_SNDBUF_BYTES as libc::c_int;
            // SAFETY: valid fd; the option value is a live c_int of the given size.
            let rc = unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_SNDBUF,
                    (&v as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if rc != 0 {
                return Err(CommError::io(
                    format!("setting the send buffer of the connection to rank {j}"),
                    std::io::Error::last_os_error(),
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn stream(&mut self, peer: usize) -> Result<&mut TcpStream> {
        self.streams
            .get_mut(peer)
            .and_then(Option::as_mut)
            .ok_or_else(|| CommError::InvalidArgument(format!("no connection to rank {peer}")))
    }

    fn fd(&self, peer: usize) -> RawFd {
        self.streams[peer]
            .as_ref()
            .map(|s| s.as_raw_fd())
            .unwrap_or(-1)
    }

    /// Shuts every connection down so that the peers see EOF (the failure cascade).
    pub(crate) fn shutdown_all(&self) {
        for s in self.streams.iter().flatten() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Fails with `PeerLost` if any peer's connection is closed.
    pub(crate) fn check_alive(&self, op: &'static str) -> Result<()> {
        for (j, s) in self.streams.iter().enumerate() {
            if let Some(s) = s {
                if !stream_alive(s) {
                    return Err(CommError::PeerLost {
                        peer: j,
                        op,
                        detail: format!("connection closed (peer exited or aborted){UNEVEN}"),
                    });
                }
            }
        }
        Ok(())
    }

    /// Progresses all `sends` and `recvs` together until every one is complete.
    pub(crate) fn exchange<T: Element>(
        &self,
        sends: &mut [SendReq<'_>],
        recvs: &mut [RecvReq<'_, T>],
        op: &'static str,
    ) -> Result<()> {
        let esz = std::mem::size_of::<T>();
        let mut sent = vec![0usize; sends.len()];
        // per receive: bytes received in total, bytes pending in tmp
        let mut got = vec![0usize; recvs.len()];
        let mut fill = vec![0usize; recvs.len()];
        let total: Vec<usize> = recvs
            .iter()
            .map(|r| match &r.sink {
                Sink::Copy(d) => std::mem::size_of_val(*d),
                Sink::Reduce { dst, tmp, .. } => {
                    // a chunk must hold whole elements (the tail of a partial one would be lost)
                    debug_assert!(!tmp.is_empty() && tmp.len() % esz == 0);
                    std::mem::size_of_val(*dst)
                }
            })
            .collect();
        let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(sends.len() + recvs.len());
        let mut who: Vec<usize> = Vec::with_capacity(sends.len() + recvs.len());
        loop {
            let mut progress = false;
            let mut pending = false;
            for (i, s) in sends.iter().enumerate() {
                while sent[i] < s.data.len() {
                    let rest = &s.data[sent[i]..];
                    // SAFETY: valid fd; pointer and length from a live slice.
                    let n = unsafe {
                        libc::send(
                            self.fd(s.peer),
                            rest.as_ptr().cast(),
                            rest.len(),
                            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                        )
                    };
                    if n > 0 {
                        sent[i] += n as usize;
                        progress = true;
                        continue;
                    }
                    let e = std::io::Error::last_os_error();
                    match e.kind() {
                        std::io::ErrorKind::WouldBlock => break,
                        std::io::ErrorKind::Interrupted => continue,
                        _ => {
                            return Err(CommError::PeerLost {
                                peer: s.peer,
                                op,
                                detail: format!("send failed: {e}{UNEVEN}"),
                            })
                        }
                    }
                }
                pending |= sent[i] < s.data.len();
            }
            for (i, r) in recvs.iter_mut().enumerate() {
                while got[i] < total[i] {
                    let (ptr, len) = match &mut r.sink {
                        Sink::Copy(d) => {
                            let b: &mut [u8] = bytemuck::cast_slice_mut(d);
                            let rest = &mut b[got[i]..];
                            (rest.as_mut_ptr(), rest.len())
                        }
                        Sink::Reduce { tmp, .. } => {
                            let want = (tmp.len() - fill[i]).min(total[i] - got[i]);
                            let rest = &mut tmp[fill[i]..fill[i] + want];
                            (rest.as_mut_ptr(), rest.len())
                        }
                    };
                    // SAFETY: valid fd; pointer and length from a live, exclusively borrowed slice.
                    let n =
                        unsafe { libc::recv(self.fd(r.peer), ptr.cast(), len, libc::MSG_DONTWAIT) };
                    if n == 0 {
                        return Err(CommError::PeerLost {
                            peer: r.peer,
                            op,
                            detail: format!("connection closed (peer exited or aborted){UNEVEN}"),
                        });
                    }
                    if n < 0 {
                        let e = std::io::Error::last_os_error();
                        match e.kind() {
                            std::io::ErrorKind::WouldBlock => break,
                            std::io::ErrorKind::Interrupted => continue,
                            _ => {
                                return Err(CommError::PeerLost {
                                    peer: r.peer,
                                    op,
                                    detail: format!("receive failed: {e}{UNEVEN}"),
                                })
                            }
                        }
                    }
                    let n = n as usize;
                    got[i] += n;
                    progress = true;
                    if let Sink::Reduce { dst, op: rop, tmp } = &mut r.sink {
                        fill[i] += n;
                        if fill[i] == tmp.len() || got[i] == total[i] {
                            let elems = fill[i] / esz;
                            let start = (got[i] - fill[i]) / esz;
                            let src: &[T] = bytemuck::cast_slice(&tmp[..elems * esz]);
                            T::combine(&mut dst[start..start + elems], src, *rop, false);
                            fill[i] = 0;
                        }
                    }
                }
                pending |= got[i] < total[i];
            }
            if !pending {
                return Ok(());
            }
            if progress {
                continue;
            }
            pfds.clear();
            who.clear();
            for (i, s) in sends.iter().enumerate() {
                if sent[i] < s.data.len() {
                    pfds.push(libc::pollfd {
                        fd: self.fd(s.peer),
                        events: libc::POLLOUT,
                        revents: 0,
                    });
                    who.push(s.peer);
                }
            }
            for (i, r) in recvs.iter().enumerate() {
                if got[i] < total[i] {
                    pfds.push(libc::pollfd {
                        fd: self.fd(r.peer),
                        events: libc::POLLIN,
                        revents: 0,
                    });
                    who.push(r.peer);
                }
            }
            // Busy-poll (lock-free `poll` with timeout 0) briefly before sleeping in poll(2):
            // a wake-up costs tens of microseconds on a VM, more than a 1 MB allreduce step.
            let ms = self.timeout.as_millis().min(i32::MAX as u128) as i32;
            let spin_start = Instant::now();
            let mut wait_ms = 0;
            loop {
                // SAFETY: pfds is a live vector of pollfd of the given length.
                let rc =
                    unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, wait_ms) };
                if rc > 0 {
                    break;
                }
                if rc < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(CommError::io(format!("poll during {op}"), e));
                    }
                    continue;
                }
                if wait_ms != 0 {
                    return Err(CommError::Timeout {
                        peer: who.first().copied(),
                        op,
                        after: self.timeout,
                    });
                }
                if spin_start.elapsed() >= SPIN {
                    wait_ms = ms;
                }
                std::hint::spin_loop();
            }
        }
    }
}

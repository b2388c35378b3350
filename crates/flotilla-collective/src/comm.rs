//! The communicator: setup (rendezvous, mesh, shared memory) and the public collectives.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::algo::{self, Scratch};
use crate::element::{partition, Element, ReduceOp};
use crate::error::{CommError, Result};
use crate::mesh::{Mesh, RecvReq, SendReq, Sink};
use crate::options::{Algorithm, Options, Transport};
use crate::rendezvous::{self, RankInfo, RendezvousServer};
use crate::shm::{Segment, UnlinkGuard};
use crate::shm_ops;
use crate::wire::{self, Reader, Writer};

/// Below this many bytes [`Algorithm::Auto`] uses recursive doubling on TCP, from here on the
/// ring. Measured on the 2-core development machine (BENCHMARKS.md, "Collectives").
pub const RD_THRESHOLD_BYTES: usize = 128 << 10;

/// How an earlier failure broke the communicator (replayed by later calls).
#[derive(Clone, Debug)]
enum Broken {
    PeerLost {
        peer: usize,
        detail: String,
    },
    Timeout {
        peer: Option<usize>,
        after: Duration,
    },
    Aborted {
        by: usize,
    },
    /// This rank's own error (an invalid argument, an I/O error): its peers see it abort.
    Local {
        op: &'static str,
        detail: String,
    },
}

/// A group of `size` ranks that run collectives together.
///
/// Every rank must call the same collectives in the same order with matching lengths (as in
/// MPI). Any error breaks the communicator for good: the rank shuts down its connections and
/// raises the shared memory abort flag, so that its peers' pending and later calls fail quickly
/// too, and every later call on it fails at once. Dropping it closes everything.
pub struct Communicator {
    rank: usize,
    size: usize,
    options: Options,
    transport: Transport,
    mesh: Mesh,
    shm: Option<Segment>,
    scratch: Scratch,
    broken: Option<Broken>,
    _shm_file: Option<UnlinkGuard>,
    _server: Option<RendezvousServer>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("transport", &self.transport)
            .field("broken", &self.broken)
            .finish()
    }
}

fn env_var(name: &str) -> Result<String> {
    std::env::var(name).map_err(|e| {
        CommError::InvalidArgument(format!(
            "environment variable {name} is missing or not unicode: {e}"
        ))
    })
}

fn env_usize(name: &str) -> Result<usize> {
    let v = env_var(name)?;
    v.trim().parse().map_err(|e| {
        CommError::InvalidArgument(format!(
            "environment variable {name}={v:?} is not a non-negative integer: {e}"
        ))
    })
}

impl Communicator {
    /// Joins a group of `size` ranks as `rank` with default [`Options`].
    ///
    /// `rendezvous` is either `"HOST:PORT"`: rank 0 binds `HOST:PORT` and serves the rendezvous
    /// itself (like torch's `MASTER_ADDR`), the others connect to it, retrying until it is up;
    /// or `"HOST:PORT/KEY"`: every rank connects to an existing [`RendezvousServer`] there, in
    /// the group named `KEY`. `HOST` must be an address every rank can reach; each rank's own
    /// listener binds the local interface it reaches the rendezvous through.
    pub fn connect(rendezvous: &str, rank: usize, size: usize) -> Result<Communicator> {
        Self::connect_with(rendezvous, rank, size, Options::default())
    }

    /// Like [`Communicator::connect`] with explicit options.
    pub fn connect_with(
        rendezvous: &str,
        rank: usize,
        size: usize,
        options: Options,
    ) -> Result<Communicator> {
        if size == 0 || rank >= size {
            return Err(CommError::InvalidArgument(format!(
                "rank {rank} is out of range for a group of size {size}"
            )));
        }
        let deadline = Instant::now() + options.timeout;
        let (host_port, key, own_server) = match rendezvous.split_once('/') {
            Some((hp, key)) => (hp, key.to_string(), false),
            None => (rendezvous, String::new(), true),
        };
        let mut server = None;
        let target: SocketAddr = if own_server && rank == 0 {
            let s = RendezvousServer::bind(host_port)?;
            let mut a = s.local_addr();
            if a.ip().is_unspecified() {
                a.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
            }
            server = Some(s);
            a
        } else {
            rendezvous::resolve(host_port)?
        };
        let rv = rendezvous::connect_retry(target, deadline)?;
        let _ = rv.set_nodelay(true);
        let local_ip = rv
            .local_addr()
            .map_err(|e| {
                CommError::io("reading the local address of the rendezvous connection", e)
            })?
            .ip();
        let listener = TcpListener::bind(SocketAddr::new(local_ip, 0))
            .map_err(|e| CommError::io(format!("binding the mesh listener on {local_ip}"), e))?;
        let listen = listener
            .local_addr()
            .map_err(|e| CommError::io("reading the mesh listener address", e))?;
        let me = RankInfo {
            listen: listen.to_string(),
            host_id: rendezvous::host_id(),
            pid: std::process::id(),
        };
        let mut rv = match options.rendezvous_cert.as_deref() {
            Some(print) if !own_server && !print.is_empty() => rendezvous::client_tls(rv, print)?,
            _ => rendezvous::Conn::Plain(rv),
        };
        let table = rendezvous::join(&mut rv, &key, rank, size, &me, deadline)?;
        drop(rv);
        let addrs: Vec<String> = table.iter().map(|t| t.listen.clone()).collect();
        let mesh = Mesh::build(listener, &key, rank, &addrs, options.timeout, deadline)?;
        let all_local = table.iter().all(|t| t.host_id == me.host_id);
        let local: Vec<bool> = table.iter().map(|t| t.host_id == me.host_id).collect();
        mesh.tune_local(&local)?;
        let want_shm = match options.transport {
            Transport::Tcp => false,
            Transport::Shm => {
                if !all_local {
                    return Err(CommError::InvalidArgument(
                        "transport Shm needs every rank on this host, but some ranks run elsewhere"
                            .into(),
                    ));
                }
                true
            }
            Transport::Auto => all_local,
        };
        let mut comm = Communicator {
            rank,
            size,
            transport: if want_shm {
                Transport::Shm
            } else {
                Transport::Tcp
            },
            options,
            mesh,
            shm: None,
            scratch: Scratch::default(),
            broken: None,
            _shm_file: None,
            _server: server,
        };
        if want_shm && size > 1 {
            let pids = table.iter().map(|t| t.pid).collect();
            let ok = comm.setup_shm(pids, deadline)?;
            if !ok {
                if comm.options.transport == Transport::Shm {
                    return Err(CommError::InvalidArgument(
                        "transport Shm requested but the shared memory segment could not be set up on every rank"
                            .into(),
                    ));
                }
                comm.transport = Transport::Tcp;
            }
        }
        comm.mesh.set_data_mode()?;
        Ok(comm)
    }

    /// Sets up the shared segment over the (still blocking) mesh; false when some rank could not
    /// map it (then every rank falls back to TCP).
    fn setup_shm(&mut self, pids: Vec<u32>, deadline: Instant) -> Result<bool> {
        let timeout = self.options.timeout;
        let set_timeouts = |mesh: &mut Mesh| -> Result<()> {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(100));
            for s in mesh.streams.iter().flatten() {
                s.set_read_timeout(Some(left)).map_err(|e| {
                    CommError::io("setting a read timeout for shared memory setup", e)
                })?;
            }
            Ok(())
        };
        set_timeouts(&mut self.mesh)?;
        let lost = |peer: usize| {
            move |e: std::io::Error| CommError::PeerLost {
                peer,
                op: "connect",
                detail: format!("shared memory setup: {e}"),
            }
        };
        if self.rank == 0 {
            let created = Segment::create(self.size, pids, timeout);
            let (seg, mut guard) = match created {
                Ok(x) => (Some(x.0), Some(x.1)),
                Err(_) => (None, None),
            };
            let path = guard
                .as_ref()
                .and_then(|g| g.0.as_ref())
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            for j in 1..self.size {
                let s = self.mesh.stream(j)?;
                wire::write_frame(s, &Writer::default().str(&path).finish()).map_err(lost(j))?;
            }
            let mut all_ok = seg.is_some();
            for j in 1..self.size {
                let s = self.mesh.stream(j)?;
                let f = wire::read_frame(s).map_err(lost(j))?;
                all_ok &= Reader::new(&f).u64() == Some(1);
            }
            for j in 1..self.size {
                let s = self.mesh.stream(j)?;
                wire::write_frame(s, &Writer::default().u64(u64::from(all_ok)).finish())
                    .map_err(lost(j))?;
            }
            if let Some(g) = guard.as_mut() {
                g.unlink_now();
            }
            if all_ok {
                self.shm = seg;
            }
            Ok(all_ok)
        } else {
            let s = self.mesh.stream(0)?;
            let f = wire::read_frame(s).map_err(lost(0))?;
            let path = Reader::new(&f).str().unwrap_or_default();
            let seg = if path.is_empty() {
                None
            } else {
                Segment::open(&PathBuf::from(path), self.size, self.rank, pids, timeout).ok()
            };
            let s = self.mesh.stream(0)?;
            wire::write_frame(s, &Writer::default().u64(u64::from(seg.is_some())).finish())
                .map_err(lost(0))?;
            let f = wire::read_frame(s).map_err(lost(0))?;
            let all_ok = Reader::new(&f).u64() == Some(1);
            if all_ok {
                self.shm = seg;
            }
            Ok(all_ok)
        }
    }

    /// Joins using `FLOTILLA_RANK`, `FLOTILLA_WORLD_SIZE` and `FLOTILLA_RENDEZVOUS` (and
    /// `FLOTILLA_RENDEZVOUS_CERT`, when set: the rendezvous speaks TLS with that certificate).
    pub fn from_env() -> Result<Communicator> {
        Self::from_env_with(Options::default())
    }

    /// Like [`Communicator::from_env`] with explicit options.
    pub fn from_env_with(options: Options) -> Result<Communicator> {
        let rank = env_usize("FLOTILLA_RANK")?;
        let size = env_usize("FLOTILLA_WORLD_SIZE")?;
        let rv = env_var("FLOTILLA_RENDEZVOUS")?;
        let mut options = options;
        if let Ok(print) = std::env::var("FLOTILLA_RENDEZVOUS_CERT") {
            if !print.is_empty() {
                options.rendezvous_cert = Some(print);
            }
        }
        Self::connect_with(&rv, rank, size, options)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The transport in use: [`Transport::Tcp`] or [`Transport::Shm`].
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// The options it was created with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Breaks the communicator on purpose, as an error inside a collective does: every
    /// later call here fails with [`CommError::Aborted`], and every peer's pending or next
    /// call fails within moments instead of waiting for its timeout (NCCL's
    /// `ncclCommAbort`). For a rank that cannot take part in a collective its peers have
    /// entered (its device copy failed, its buffer is too small).
    pub fn abort(&mut self) {
        if self.broken.is_none() {
            self.broken = Some(Broken::Aborted { by: self.rank });
            if let Some(seg) = &self.shm {
                seg.abort();
            }
            self.mesh.shutdown_all();
        }
    }

    /// Runs `f` unless broken; on error breaks the communicator and tells the peers.
    fn guarded<R>(
        &mut self,
        op: &'static str,
        f: impl FnOnce(&mut Self) -> Result<R>,
    ) -> Result<R> {
        if let Some(b) = &self.broken {
            return Err(match b.clone() {
                Broken::PeerLost { peer, detail } => CommError::PeerLost {
                    peer,
                    op,
                    detail: format!("communicator broken earlier: {detail}"),
                },
                Broken::Timeout { peer, after } => CommError::Timeout { peer, op, after },
                Broken::Aborted { by } => CommError::Aborted { by },
                Broken::Local { op: first, detail } => CommError::BrokenEarlier {
                    op,
                    detail: format!("{first}: {detail}"),
                },
            });
        }
        let r = f(self);
        if let Err(e) = &r {
            self.broken = Some(match e {
                CommError::PeerLost { peer, detail, .. } => Broken::PeerLost {
                    peer: *peer,
                    detail: detail.clone(),
                },
                CommError::Timeout { peer, after, .. } => Broken::Timeout {
                    peer: *peer,
                    after: *after,
                },
                CommError::Aborted { by } => Broken::Aborted { by: *by },
                other => Broken::Local {
                    op,
                    detail: other.to_string(),
                },
            });
            if let Some(seg) = &self.shm {
                seg.abort();
            }
            self.mesh.shutdown_all();
        }
        r
    }

    fn check_root(&self, root: usize, what: &str) -> Result<()> {
        if root >= self.size {
            return Err(CommError::InvalidArgument(format!(
                "{what} {root} is out of range for a group of size {}",
                self.size
            )));
        }
        Ok(())
    }

    /// Reduces `buf` element-wise across all ranks; every rank gets the result in `buf`.
    pub fn allreduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.guarded("allreduce", |c| {
            if c.size == 1 || buf.is_empty() {
                return Ok(());
            }
            if let Some(seg) = c.shm.as_mut() {
                return shm_ops::allreduce(seg, &c.mesh, buf, op, None, "allreduce");
            }
            if c.options.deterministic {
                return algo::det_allreduce(&c.mesh, &mut c.scratch, buf, op);
            }
            let algorithm = match c.options.algorithm {
                Algorithm::Auto if std::mem::size_of_val(buf) < RD_THRESHOLD_BYTES => {
                    Algorithm::RecursiveDoubling
                }
                Algorithm::Auto => Algorithm::Ring,
                a => a,
            };
            match algorithm {
                Algorithm::RecursiveDoubling => {
                    algo::rd_allreduce(&c.mesh, &mut c.scratch, buf, op)
                }
                _ => algo::ring_allreduce(&c.mesh, &mut c.scratch, buf, op),
            }
        })
    }

    /// Reduces `send` (length `recv.len() * size`) across ranks; rank `r` gets block `r` of the
    /// result in `recv`.
    pub fn reduce_scatter<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.guarded("reduce_scatter", |c| {
            if send.len() != recv.len() * c.size {
                return Err(CommError::InvalidArgument(format!(
                    "reduce_scatter: send has {} elements, expected recv length {} x size {}",
                    send.len(),
                    recv.len(),
                    c.size
                )));
            }
            if c.size == 1 || recv.is_empty() {
                recv.copy_from_slice(send);
                return Ok(());
            }
            if let Some(seg) = c.shm.as_mut() {
                return shm_ops::reduce_scatter(seg, &c.mesh, send, recv, op);
            }
            let m = recv.len();
            let blocks: Vec<_> = (0..c.size).map(|j| j * m..(j + 1) * m).collect();
            let mut work = send.to_vec();
            if c.options.deterministic {
                algo::direct_reduce_scatter(
                    &c.mesh,
                    &mut c.scratch,
                    &mut work,
                    &blocks,
                    op,
                    "reduce_scatter",
                )?;
            } else {
                algo::ring_reduce_scatter(
                    &c.mesh,
                    &mut c.scratch,
                    &mut work,
                    &blocks,
                    op,
                    "reduce_scatter",
                )?;
            }
            recv.copy_from_slice(&work[blocks[c.rank].clone()]);
            Ok(())
        })
    }

    /// Gathers every rank's `send` into `recv` (length `send.len() * size`), block `r` from
    /// rank `r`.
    pub fn allgather<T: Element>(&mut self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.guarded("allgather", |c| {
            if recv.len() != send.len() * c.size {
                return Err(CommError::InvalidArgument(format!(
                    "allgather: recv has {} elements, expected send length {} x size {}",
                    recv.len(),
                    send.len(),
                    c.size
                )));
            }
            if c.size == 1 || send.is_empty() {
                recv.copy_from_slice(send);
                return Ok(());
            }
            if let Some(seg) = c.shm.as_mut() {
                return shm_ops::allgather(seg, &c.mesh, send, recv);
            }
            let m = send.len();
            let blocks: Vec<_> = (0..c.size).map(|j| j * m..(j + 1) * m).collect();
            recv[blocks[c.rank].clone()].copy_from_slice(send);
            algo::ring_allgather(&c.mesh, recv, &blocks, "allgather")
        })
    }

    /// Copies `root`'s `buf` into every rank's `buf`.
    pub fn broadcast<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        self.guarded("broadcast", |c| {
            c.check_root(root, "broadcast root")?;
            if c.size == 1 || buf.is_empty() {
                return Ok(());
            }
            if let Some(seg) = c.shm.as_mut() {
                return shm_ops::broadcast(seg, &c.mesh, buf, root);
            }
            algo::broadcast(&c.mesh, buf, root)
        })
    }

    /// Reduces `buf` across ranks into `root`'s `buf`; other ranks' buffers are left unchanged.
    pub fn reduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        self.guarded("reduce", |c| {
            c.check_root(root, "reduce root")?;
            if c.size == 1 || buf.is_empty() {
                return Ok(());
            }
            if let Some(seg) = c.shm.as_mut() {
                return shm_ops::allreduce(seg, &c.mesh, buf, op, Some(root), "reduce");
            }
            let blocks = partition(buf.len(), c.size);
            let mut work = buf.to_vec();
            if c.options.deterministic {
                algo::direct_reduce_scatter(
                    &c.mesh,
                    &mut c.scratch,
                    &mut work,
                    &blocks,
                    op,
                    "reduce",
                )?;
            } else {
                algo::ring_reduce_scatter(
                    &c.mesh,
                    &mut c.scratch,
                    &mut work,
                    &blocks,
                    op,
                    "reduce",
                )?;
            }
            algo::gather_blocks(&c.mesh, &work, buf, &blocks, root, "reduce")
        })
    }

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&mut self) -> Result<()> {
        self.guarded("barrier", |c| {
            if c.size == 1 {
                return Ok(());
            }
            if let Some(seg) = c.shm.as_mut() {
                return shm_ops::barrier(seg, &c.mesh);
            }
            algo::barrier(&c.mesh)
        })
    }

    /// Sends `buf` to rank `dest`, which must call [`Communicator::recv`] with the same length.
    /// Always over TCP. Returns once the data is handed to the kernel.
    pub fn send<T: Element>(&mut self, buf: &[T], dest: usize) -> Result<()> {
        self.guarded("send", |c| {
            c.check_root(dest, "send destination")?;
            if dest == c.rank {
                return Err(CommError::InvalidArgument(format!(
                    "send: rank {dest} cannot send to itself"
                )));
            }
            c.mesh.exchange::<T>(
                &mut [SendReq {
                    peer: dest,
                    data: algo::bytes_of(buf),
                }],
                &mut [],
                "send",
            )
        })
    }

    /// Receives exactly `buf.len()` elements sent by rank `src`.
    pub fn recv<T: Element>(&mut self, buf: &mut [T], src: usize) -> Result<()> {
        self.guarded("recv", |c| {
            c.check_root(src, "recv source")?;
            if src == c.rank {
                return Err(CommError::InvalidArgument(format!(
                    "recv: rank {src} cannot receive from itself"
                )));
            }
            c.mesh.exchange(
                &mut [],
                &mut [RecvReq {
                    peer: src,
                    sink: Sink::Copy(buf),
                }],
                "recv",
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn communicator_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<Communicator>();
    }

    #[test]
    fn a_group_of_one_needs_no_peers() {
        let mut c = Communicator::connect("127.0.0.1:0", 0, 1).unwrap();
        let mut v = [3.5f64, -1.0];
        c.allreduce(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v, [3.5, -1.0]);
        let mut out = [0.0f64; 2];
        c.allgather(&v, &mut out).unwrap();
        assert_eq!(out, v);
        c.barrier().unwrap();
        assert!(matches!(c.send(&v, 0), Err(CommError::InvalidArgument(_))));
        // any error breaks the communicator, and later calls say it was this rank's own
        // (they said "aborted by rank 0", an abort never called)
        let later = c.barrier().unwrap_err();
        assert!(
            matches!(&later, CommError::BrokenEarlier { op: "barrier", detail } if detail.starts_with("send: invalid argument")),
            "{later}"
        );
    }
}

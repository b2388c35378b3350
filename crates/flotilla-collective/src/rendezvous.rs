//! The rendezvous: ranks announce themselves and receive the table of all ranks.
//!
//! Protocol (one TCP connection per rank, frames from [`crate::wire`]):
//! the rank sends `MAGIC, key, rank, size, listen_addr, host_id, pid`; the server holds the
//! connection until all `size` ranks of `key` have arrived, then answers every rank with
//! `0, size x (listen_addr, host_id, pid)`, or answers one rank with `1, message` when it is
//! rejected (duplicate rank, size mismatch, rank out of range, bad magic). A completed group is
//! forgotten, so the key can be reused by a later group. Members whose connection died while
//! waiting are pruned, so a restarted rank can take its place.
//!
//! A server made with [`RendezvousServer::bind_restricted`] (the coordinator's) serves only
//! the keys it was told to expect ([`RendezvousServer::expect`]: the key, the group size and
//! how long it is good for): any other key, an expired one, or a size other than announced is
//! refused, so the service is not open to whoever reaches its port, and a key does not live
//! forever. Every server holds at most [`MAX_CONNECTIONS`] connections at once (one thread
//! each); more are closed at once.
//!
//! With [`RendezvousServer::bind_restricted_tls`] the connections are TLS (the coordinator's
//! certificate); a rank reaches it with [`crate::Options::rendezvous_cert`] (the
//! certificate's fingerprint, `FLOTILLA_RENDEZVOUS_CERT`) and trusts that certificate only.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::ops::{Deref, DerefMut};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};
use crate::wire::{self, Reader, Writer, MAGIC};

/// Connections a rendezvous server holds at once.
pub const MAX_CONNECTIONS: usize = 1024;

/// Keys a restricted server accepts: group size and expiry.
type Expected = Arc<Mutex<HashMap<String, (usize, Instant)>>>;

/// A rendezvous connection: plain TCP, or TLS over it (server or client side).
pub(crate) enum Conn<C> {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS.
    Tls(Box<rustls::StreamOwned<C, TcpStream>>),
}

/// The server side.
type ServerConn = Conn<rustls::ServerConnection>;

impl<C> Conn<C> {
    /// The TCP connection underneath.
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(t) => &t.sock,
        }
    }
}

impl<C, S> Read for Conn<C>
where
    C: DerefMut + Deref<Target = rustls::ConnectionCommon<S>>,
    S: rustls::SideData,
{
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(t) => t.read(buf),
        }
    }
}

impl<C, S> Write for Conn<C>
where
    C: DerefMut + Deref<Target = rustls::ConnectionCommon<S>>,
    S: rustls::SideData,
{
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(t) => t.flush(),
        }
    }
}

/// What every rank tells the others about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RankInfo {
    pub(crate) listen: String,
    pub(crate) host_id: String,
    pub(crate) pid: u32,
}

/// A rendezvous service for many groups at once (the coordinator hosts one; ranks pass
/// `"HOST:PORT/KEY"` to [`crate::Communicator::connect`]).
///
/// It serves from a background thread until dropped.
pub struct RendezvousServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// `Some` for a restricted server.
    expected: Option<Expected>,
}

struct Member {
    info: RankInfo,
    stream: ServerConn,
}

struct Group {
    size: usize,
    members: BTreeMap<usize, Member>,
}

type Groups = Arc<Mutex<HashMap<String, Group>>>;

impl RendezvousServer {
    /// Binds `addr` (`"HOST:PORT"`, port 0 for an ephemeral one) and starts serving any key.
    pub fn bind(addr: &str) -> Result<RendezvousServer> {
        Self::start(addr, None, None)
    }

    /// Like [`RendezvousServer::bind`], but serving only the keys given to
    /// [`RendezvousServer::expect`].
    pub fn bind_restricted(addr: &str) -> Result<RendezvousServer> {
        Self::start(addr, Some(Arc::new(Mutex::new(HashMap::new()))), None)
    }

    /// Like [`RendezvousServer::bind_restricted`], over TLS with `tls` (ranks connect with
    /// the fingerprint of its certificate, [`crate::Options::rendezvous_cert`]). The
    /// handshake counts in the time a connection has to send its request.
    pub fn bind_restricted_tls(
        addr: &str,
        tls: Arc<rustls::ServerConfig>,
    ) -> Result<RendezvousServer> {
        Self::start(addr, Some(Arc::new(Mutex::new(HashMap::new()))), Some(tls))
    }

    /// A restricted server will accept the group `key` of `size` ranks for `ttl` from now
    /// (expired keys are dropped here, so the list stays bounded). No effect on an open server.
    pub fn expect(&self, key: &str, size: usize, ttl: Duration) {
        let Some(expected) = &self.expected else {
            return;
        };
        let Ok(mut map) = expected.lock() else { return };
        let now = Instant::now();
        map.retain(|_, (_, until)| *until > now);
        map.insert(key.to_string(), (size, now + ttl));
    }

    fn start(
        addr: &str,
        expected: Option<Expected>,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Result<RendezvousServer> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| CommError::Rendezvous(format!("cannot bind rendezvous at {addr}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| CommError::io(format!("local address of rendezvous {addr}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| CommError::io(format!("configuring rendezvous listener {local}"), e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let groups: Groups = Arc::new(Mutex::new(HashMap::new()));
        let stop2 = stop.clone();
        let exp2 = expected.clone();
        let thread = std::thread::Builder::new()
            .name(format!("flotilla-rendezvous-{}", local.port()))
            .spawn(move || accept_loop(listener, stop2, groups, exp2, tls))
            .map_err(|e| CommError::io("spawning the rendezvous thread", e))?;
        Ok(RendezvousServer {
            addr: local,
            stop,
            thread: Some(thread),
            expected,
        })
    }

    /// The address it listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for RendezvousServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for RendezvousServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RendezvousServer")
            .field("addr", &self.addr)
            .finish()
    }
}

fn accept_loop(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    groups: Groups,
    expected: Option<Expected>,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let fd = listener.as_raw_fd();
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    while !stop.load(Ordering::SeqCst) {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, count 1.
        let _ = unsafe { libc::poll(&mut pfd, 1, 50) };
        loop {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    if open.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                        reply_error(&mut stream, "too many connections, try again");
                        continue;
                    }
                    open.fetch_add(1, Ordering::SeqCst);
                    let (groups, stop, expected, held, tls) = (
                        groups.clone(),
                        stop.clone(),
                        expected.clone(),
                        open.clone(),
                        tls.clone(),
                    );
                    let spawned = std::thread::Builder::new()
                        .name("flotilla-rendezvous-conn".into())
                        .spawn(move || {
                            let conn = match tls {
                                None => Some(Conn::Plain(stream)),
                                Some(cfg) => rustls::ServerConnection::new(cfg).ok().map(|c| {
                                    Conn::Tls(Box::new(rustls::StreamOwned::new(c, stream)))
                                }),
                            };
                            if let Some(conn) = conn {
                                handle_conn(conn, groups, stop, expected.as_ref());
                            }
                            held.fetch_sub(1, Ordering::SeqCst);
                        });
                    if spawned.is_err() {
                        open.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    // e.g. out of file descriptors: back off instead of spinning
                    std::thread::sleep(Duration::from_millis(50));
                    break;
                }
            }
        }
    }
}

fn reply_error(stream: &mut impl Write, msg: &str) {
    let p = Writer::default().u64(1).str(msg).finish();
    let _ = wire::write_frame(stream, &p);
}

fn handle_conn(
    mut stream: ServerConn,
    groups: Groups,
    stop: Arc<AtomicBool>,
    expected: Option<&Expected>,
) {
    let _ = stream.tcp().set_nonblocking(false);
    let _ = stream.tcp().set_nodelay(true);
    // A rank sends its request right after connecting (a TLS one its handshake first); poll
    // so that a silent client does not keep this thread past the server's lifetime.
    let _ = stream
        .tcp()
        .set_read_timeout(Some(Duration::from_millis(200)));
    let started = Instant::now();
    let frame = loop {
        match wire::read_frame(&mut stream) {
            Ok(f) => break f,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) && !stop.load(Ordering::SeqCst)
                    && started.elapsed() < Duration::from_secs(30) =>
            {
                continue
            }
            Err(_) => return,
        }
    };
    let _ = stream.tcp().set_read_timeout(None);
    let mut r = Reader::new(&frame);
    let parsed = (|| {
        if r.u64()? != MAGIC {
            return None;
        }
        let key = r.str()?;
        let rank = r.usize()?;
        let size = r.usize()?;
        let listen = r.str()?;
        let host_id = r.str()?;
        let pid = u32::try_from(r.u64()?).ok()?;
        Some((
            key,
            rank,
            size,
            RankInfo {
                listen,
                host_id,
                pid,
            },
        ))
    })();
    let Some((key, rank, size, info)) = parsed else {
        reply_error(
            &mut stream,
            "malformed request or protocol version mismatch",
        );
        return;
    };
    if size == 0 || rank >= size {
        reply_error(
            &mut stream,
            &format!("rank {rank} is out of range for group {key:?} of size {size}"),
        );
        return;
    }
    if let Some(expected) = expected {
        let known = expected
            .lock()
            .ok()
            .and_then(|m| m.get(&key).copied())
            .filter(|(_, until)| *until > Instant::now());
        match known {
            None => {
                reply_error(&mut stream, "unknown or expired group key");
                return;
            }
            Some((n, _)) if n != size => {
                let msg = format!("group {key:?} has {n} ranks, not {size}");
                reply_error(&mut stream, &msg);
                return;
            }
            Some(_) => {}
        }
    }
    let complete = {
        let Ok(mut map) = groups.lock() else { return };
        if let Some(g) = map.get_mut(&key) {
            g.members.retain(|_, m| stream_alive(m.stream.tcp()));
            if g.members.is_empty() {
                map.remove(&key);
            }
        }
        let g = map.entry(key.clone()).or_insert_with(|| Group {
            size,
            members: BTreeMap::new(),
        });
        if g.size != size {
            let msg = format!(
                "size mismatch in group {key:?}: rank {rank} says size {size}, earlier ranks said {}",
                g.size
            );
            drop(map);
            reply_error(&mut stream, &msg);
            return;
        }
        if g.members.contains_key(&rank) {
            let msg = format!("duplicate rank {rank} in group {key:?} (size {size})");
            drop(map);
            reply_error(&mut stream, &msg);
            return;
        }
        g.members.insert(rank, Member { info, stream });
        if g.members.len() == size {
            map.remove(&key)
        } else {
            None
        }
    };
    if let Some(g) = complete {
        let mut w = Writer::default().u64(0);
        for m in g.members.values() {
            w = w
                .str(&m.info.listen)
                .str(&m.info.host_id)
                .u64(u64::from(m.info.pid));
        }
        let table = w.finish();
        for mut m in g.members.into_values() {
            let _ = wire::write_frame(&mut m.stream, &table);
        }
    }
}

/// Whether a waiting member's connection is still open (no EOF or error pending).
pub(crate) fn stream_alive(s: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: valid fd and a 1-byte buffer.
    let n = unsafe {
        libc::recv(
            s.as_raw_fd(),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n > 0 {
        return true;
    }
    if n == 0 {
        return false;
    }
    let e = std::io::Error::last_os_error();
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
    )
}

/// Resolves `"HOST:PORT"` to its first address.
pub(crate) fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(|e| CommError::Rendezvous(format!("bad rendezvous address {addr:?}: {e}")))?
        .next()
        .ok_or_else(|| {
            CommError::Rendezvous(format!("rendezvous address {addr:?} resolves to nothing"))
        })
}

/// Connects to the rendezvous at `addr`, retrying until `deadline` while it is not up yet.
pub(crate) fn connect_retry(addr: SocketAddr, deadline: Instant) -> Result<TcpStream> {
    let mut backoff = Duration::from_millis(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(CommError::Rendezvous(format!(
                "timed out connecting to the rendezvous at {addr}"
            )));
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(s) => return Ok(s),
            Err(_) => {
                std::thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
                backoff = (backoff * 2).min(Duration::from_millis(100));
            }
        }
    }
}

/// Opens TLS to the rendezvous over `stream`, trusting only the certificate with
/// `fingerprint` (the handshake happens with the first write).
pub(crate) fn client_tls(
    stream: TcpStream,
    fingerprint: &str,
) -> Result<Conn<rustls::ClientConnection>> {
    let config = crate::tls::pinned_client_config(fingerprint)?;
    let conn = rustls::ClientConnection::new(config, crate::tls::pinned_name()?)
        .map_err(|e| CommError::Rendezvous(format!("TLS to the rendezvous: {e}")))?;
    Ok(Conn::Tls(Box::new(rustls::StreamOwned::new(conn, stream))))
}

/// Sends this rank's entry on an open rendezvous connection and waits for the table.
pub(crate) fn join<C, S>(
    stream: &mut Conn<C>,
    key: &str,
    rank: usize,
    size: usize,
    me: &RankInfo,
    deadline: Instant,
) -> Result<Vec<RankInfo>>
where
    C: DerefMut + Deref<Target = rustls::ConnectionCommon<S>>,
    S: rustls::SideData,
{
    let req = Writer::default()
        .u64(MAGIC)
        .str(key)
        .u64(rank as u64)
        .u64(size as u64)
        .str(&me.listen)
        .str(&me.host_id)
        .u64(u64::from(me.pid))
        .finish();
    let peer = stream
        .tcp()
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    wire::write_frame(stream, &req).map_err(|e| {
        CommError::Rendezvous(format!("sending join of rank {rank} to {peer}: {e}"))
    })?;
    let left = deadline.saturating_duration_since(Instant::now());
    stream
        .tcp()
        .set_read_timeout(Some(left.max(Duration::from_millis(1))))
        .map_err(|e| CommError::io("setting rendezvous read timeout", e))?;
    let frame = wire::read_frame(stream).map_err(|e| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            CommError::Rendezvous(format!(
                "timed out waiting for all {size} ranks of group {key:?} at {peer} (this is rank {rank})"
            ))
        } else {
            CommError::Rendezvous(format!("reading the rank table from {peer}: {e}"))
        }
    })?;
    let bad = || CommError::Rendezvous(format!("malformed rank table from {peer}"));
    let mut r = Reader::new(&frame);
    match r.u64().ok_or_else(bad)? {
        0 => {}
        _ => {
            let msg = r.str().unwrap_or_default();
            return Err(CommError::Rendezvous(msg));
        }
    }
    let mut table = Vec::with_capacity(size);
    for _ in 0..size {
        let listen = r.str().ok_or_else(bad)?;
        let host_id = r.str().ok_or_else(bad)?;
        let pid = r
            .u64()
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(bad)?;
        table.push(RankInfo {
            listen,
            host_id,
            pid,
        });
    }
    Ok(table)
}

/// `hostname/boot_id`: equal for two processes exactly when they share a kernel (and so
/// `/dev/shm`).
pub(crate) fn host_id() -> String {
    let host = flotilla_core::host::hostname();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    format!("{host}/{boot}")
}

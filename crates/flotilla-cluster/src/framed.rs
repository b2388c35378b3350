//! Framed TCP for bulk data: how workers serve the objects they hold to other workers and to
//! clients gathering outputs. Measured against gRPC's `Objects.Fetch` (1 MiB messages on a
//! server stream) by `flotilla bench transfer`: 2.2–2.8× the throughput on loopback with the
//! same blake3 check (BENCHMARKS.md), so the bulk path is this one; gRPC stays for the
//! coordinator's API and the files uploaded with a job (served on the coordinator's port, over
//! TLS when it has TLS). The framed path is plain TCP with a ticket, or TLS when the
//! coordinator has TLS: each worker's object server then has a self-signed certificate made
//! at start ([`DataTls`]), whose fingerprint the worker registers and the coordinator hands
//! out with the server's address; a fetcher accepts that certificate only (pinning, so no CA
//! has to be run for the workers). See ARCHITECTURE.md.
//!
//! Protocol: the client sends one frame `token \0 hash` (at most [`MAX_REQUEST`] bytes, within
//! [`AUTH_TIMEOUT`] of connecting, or the connection is closed); the server answers one status
//! frame, `\x01` (then frames of up to 1 MiB of the object, then an empty frame) or `\0`
//! followed by the error message. Frames are `u32` big-endian length + bytes (tokio-util's
//! length-delimited codec). The status frame is separate so that no object, whatever its
//! bytes, can be mistaken for an error. A server holds at most [`MAX_CONNECTIONS`] at once; a
//! client gives up on a server silent for [`FRAME_TIMEOUT`] and on an object larger than
//! announced. `flotilla bench transfer` moves the same object through both paths in one run;
//! BENCHMARKS.md has the figures and ARCHITECTURE.md the decision.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use crate::error::{ClusterError, Result};
use crate::objects::ObjectStore;
use crate::proto;
use crate::proto::objects_client::ObjectsClient;
use crate::transport::Remote;

const CHUNK: usize = 1 << 20;

/// The largest request frame (`token \0 hash`): nothing large is read before the token is
/// checked.
pub const MAX_REQUEST: usize = 1024;

/// How long a new connection has to send its request.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a fetch waits for the next frame.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(60);

/// Connections one framed server serves at once; more are told so and closed.
pub const MAX_CONNECTIONS: usize = 256;

const OK: u8 = 1;
const ERR: u8 = 0;

fn codec(max: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .max_frame_length(max)
        .new_codec()
}

fn fail(m: &str) -> Bytes {
    let mut v = vec![ERR];
    v.extend_from_slice(m.as_bytes());
    Bytes::from(v)
}

/// Who a framed server serves.
#[derive(Clone)]
pub enum Gate {
    /// Whoever presents this token (benchmarks and tests).
    Token(Arc<String>),
    /// Whoever presents a ticket for the object under one of these keys: a worker's data
    /// keys (one per registration of its process), set from its registration replies.
    Tickets(Arc<parking_lot::RwLock<Vec<[u8; 32]>>>),
}

impl Gate {
    /// A gate that admits `token`.
    pub fn token(token: impl Into<String>) -> Gate {
        Gate::Token(Arc::new(token.into()))
    }

    fn admits(&self, credential: &[u8], hash: &str) -> bool {
        match self {
            Gate::Token(t) => crate::auth::ct_eq(credential, t.as_bytes()),
            Gate::Tickets(keys) => keys
                .read()
                .iter()
                .any(|k| crate::auth::ct_eq(credential, crate::access::ticket(k, hash).as_bytes())),
        }
    }
}

pub use flotilla_collective::tls::fingerprint as cert_fingerprint;

/// The TLS identity of a worker's object server: a self-signed certificate made at start,
/// known to others by its fingerprint.
pub struct DataTls {
    config: Arc<rustls::ServerConfig>,
    fingerprint: String,
}

impl std::fmt::Debug for DataTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataTls")
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

impl DataTls {
    /// Makes a new key and self-signed certificate.
    pub fn generate() -> Result<DataTls> {
        let tls = |e: &dyn std::fmt::Display| {
            ClusterError::Config(format!("object server certificate: {e}"))
        };
        let ck = rcgen::generate_simple_self_signed(vec![
            flotilla_collective::tls::PINNED_NAME.to_string()
        ])
        .map_err(|e| tls(&e))?;
        let cert = CertificateDer::from(ck.cert.der().to_vec());
        let fingerprint = cert_fingerprint(&cert);
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
        let config =
            rustls::ServerConfig::builder_with_provider(flotilla_collective::tls::provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| tls(&e))?
                .with_no_client_auth()
                .with_single_cert(vec![cert], key)
                .map_err(|e| tls(&e))?;
        Ok(DataTls {
            config: Arc::new(config),
            fingerprint,
        })
    }

    /// Its certificate's fingerprint ([`cert_fingerprint`]).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
}

fn pinned_client(fingerprint: &str) -> Result<tokio_rustls::TlsConnector> {
    let config = flotilla_collective::tls::pinned_client_config(fingerprint)
        .map_err(|e| ClusterError::Config(e.to_string()))?;
    Ok(tokio_rustls::TlsConnector::from(config))
}

/// Serves `store` over framed TCP on `addr` (port 0 picks one) to whom `gate` admits;
/// returns the bound address.
pub fn serve_framed(
    addr: SocketAddr,
    store: Arc<ObjectStore>,
    gate: Gate,
) -> crate::Boxed<'static, Result<SocketAddr>> {
    serve_framed_tls(addr, store, gate, None)
}

/// [`serve_framed`], over TLS with `tls` when given: a connection that does not complete
/// the handshake within [`AUTH_TIMEOUT`] is closed.
pub fn serve_framed_tls(
    addr: SocketAddr,
    store: Arc<ObjectStore>,
    gate: Gate,
    tls: Option<Arc<DataTls>>,
) -> crate::Boxed<'static, Result<SocketAddr>> {
    crate::boxed(async move {
        let acceptor = tls.map(|t| tokio_rustls::TlsAcceptor::from(t.config.clone()));
        let (listener, local) = crate::transport::bind(addr).await?;
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        tokio::spawn(async move {
            while let Ok((sock, peer)) = listener.accept().await {
                let _ = sock.set_nodelay(true);
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::warn!(
                        "framed object server: {peer} refused, {MAX_CONNECTIONS} connections open"
                    );
                    tokio::spawn(async move {
                        let mut framed = Framed::new(sock, codec(MAX_REQUEST));
                        let _ = framed.send(fail("too many connections, try again")).await;
                    });
                    continue;
                };
                let (store, gate, acceptor) = (store.clone(), gate.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let served = match acceptor {
                        None => serve_one(sock, &store, &gate).await,
                        Some(a) => match tokio::time::timeout(AUTH_TIMEOUT, a.accept(sock)).await {
                            Ok(Ok(tls)) => serve_one(tls, &store, &gate).await,
                            Ok(Err(e)) => Err(ClusterError::Rpc(format!("TLS handshake: {e}"))),
                            Err(_) => Err(ClusterError::Rpc("no TLS handshake in time".into())),
                        },
                    };
                    if let Err(e) = served {
                        tracing::debug!("framed object request from {peer}: {e}");
                    }
                    drop(slot);
                });
            }
        });
        Ok(local)
    })
}

async fn serve_one<S: AsyncRead + AsyncWrite + Unpin>(
    sock: S,
    store: &ObjectStore,
    gate: &Gate,
) -> Result<()> {
    let mut framed = Framed::new(sock, codec(MAX_REQUEST));
    let io = |e: std::io::Error| ClusterError::Rpc(format!("framed transfer: {e}"));
    let req = match tokio::time::timeout(AUTH_TIMEOUT, framed.next()).await {
        Err(_) => return Err(ClusterError::Rpc("no request in time".into())),
        Ok(None) => return Ok(()),
        Ok(Some(req)) => req.map_err(io)?,
    };
    let mut parts = req.splitn(2, |&b| b == 0);
    let (t, hash) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let hash = String::from_utf8_lossy(hash).into_owned();
    if !gate.admits(t, &hash) {
        framed
            .send(fail("invalid token or ticket"))
            .await
            .map_err(io)?;
        return Ok(());
    }
    if !store.has(&hash) {
        framed
            .send(fail(&format!("object {hash} is not held here")))
            .await
            .map_err(io)?;
        return Ok(());
    }
    let mut f = tokio::fs::File::open(store.path(&hash)).await.map_err(io)?;
    framed.codec_mut().set_max_frame_length(CHUNK);
    framed.feed(Bytes::from_static(&[OK])).await.map_err(io)?;
    loop {
        let mut buf = vec![0u8; CHUNK];
        let n = f.read(&mut buf).await.map_err(io)?;
        buf.truncate(n);
        let end = n == 0;
        framed.feed(Bytes::from(buf)).await.map_err(io)?;
        if end {
            break;
        }
    }
    SinkExt::<Bytes>::flush(&mut framed).await.map_err(io)
}

/// Fetches `hash` from a framed server into memory, hashing it (what a real fetch does
/// besides writing the file); returns the bytes received.
pub fn fetch_framed<'a>(
    addr: SocketAddr,
    token: &'a str,
    hash: &'a str,
) -> crate::Boxed<'a, Result<u64>> {
    crate::boxed(async move {
        fetch_framed_into(&addr.to_string(), (token, ""), hash, u64::MAX, |_| Ok(())).await
    })
}

/// [`fetch_framed`] over TLS, from the server whose certificate has fingerprint `cert`.
pub fn fetch_framed_pinned<'a>(
    addr: SocketAddr,
    token: &'a str,
    cert: &'a str,
    hash: &'a str,
) -> crate::Boxed<'a, Result<u64>> {
    crate::boxed(async move {
        fetch_framed_into(&addr.to_string(), (token, cert), hash, u64::MAX, |_| Ok(())).await
    })
}

/// Fetches `hash` from the framed server at `addr` (`host:port`) into `tmp`, checks its
/// blake3 hash, syncs it, then renames it to `dst` (same folder): `dst` is never partial.
/// More than `size` bytes (the size the coordinator knows) is an error. `credentials` are
/// the ticket and the server's certificate fingerprint (`""`: plain TCP).
pub(crate) async fn fetch_framed_to(
    addr: &str,
    credentials: (&str, &str),
    (hash, size): (&str, u64),
    tmp: &Path,
    dst: &Path,
) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(tmp).map_err(|e| ClusterError::io(tmp, e))?;
    let copied = fetch_framed_into(addr, credentials, hash, size, |chunk| {
        f.write_all(chunk).map_err(|e| ClusterError::io(tmp, e))
    })
    .await
    .and_then(|_| f.sync_all().map_err(|e| ClusterError::io(tmp, e)));
    if let Err(e) = copied {
        let _ = std::fs::remove_file(tmp);
        return Err(e);
    }
    std::fs::rename(tmp, dst).map_err(|e| ClusterError::io(dst, e))
}

/// The client side: each chunk goes to `sink` and into the hash; the hash is checked at the
/// end; more than `max_bytes` is an error.
async fn fetch_framed_into(
    addr: &str,
    (token, cert): (&str, &str),
    hash: &str,
    max_bytes: u64,
    sink: impl FnMut(&[u8]) -> Result<()>,
) -> Result<u64> {
    let io = |e: std::io::Error| ClusterError::Rpc(format!("framed transfer from {addr}: {e}"));
    let sock = tokio::time::timeout(FRAME_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| ClusterError::Rpc(format!("{addr}: no connection in {FRAME_TIMEOUT:?}")))?
        .map_err(io)?;
    sock.set_nodelay(true).map_err(io)?;
    if cert.is_empty() {
        return fetch_over(sock, addr, token, hash, max_bytes, sink).await;
    }
    let name =
        flotilla_collective::tls::pinned_name().map_err(|e| ClusterError::Config(e.to_string()))?;
    let tls = tokio::time::timeout(FRAME_TIMEOUT, pinned_client(cert)?.connect(name, sock))
        .await
        .map_err(|_| ClusterError::Rpc(format!("{addr}: no TLS handshake in {FRAME_TIMEOUT:?}")))?
        .map_err(|e| ClusterError::Rpc(format!("TLS with the object server {addr}: {e}")))?;
    fetch_over(tls, addr, token, hash, max_bytes, sink).await
}

/// The request and the object's frames over an open connection.
async fn fetch_over<S: AsyncRead + AsyncWrite + Unpin>(
    sock: S,
    addr: &str,
    token: &str,
    hash: &str,
    max_bytes: u64,
    mut sink: impl FnMut(&[u8]) -> Result<()>,
) -> Result<u64> {
    let io = |e: std::io::Error| ClusterError::Rpc(format!("framed transfer from {addr}: {e}"));
    let mut framed = Framed::new(sock, codec(CHUNK + 4096));
    let mut req = token.as_bytes().to_vec();
    req.push(0);
    req.extend_from_slice(hash.as_bytes());
    framed.send(Bytes::from(req)).await.map_err(io)?;
    let mut next = async || match tokio::time::timeout(FRAME_TIMEOUT, framed.next()).await {
        Err(_) => Err(ClusterError::Rpc(format!(
            "{addr} sent nothing for {FRAME_TIMEOUT:?} while sending {hash}"
        ))),
        Ok(None) => Err(ClusterError::Rpc(format!(
            "{addr} closed before the end of {hash}"
        ))),
        Ok(Some(f)) => f.map_err(io),
    };
    let status = next().await?;
    match status.first() {
        Some(&OK) if status.len() == 1 => {}
        Some(&ERR) => {
            return Err(ClusterError::Rpc(format!(
                "{addr}: {}",
                String::from_utf8_lossy(&status[1..])
            )))
        }
        _ => {
            return Err(ClusterError::Rpc(format!(
                "{addr}: not a Flotilla object server (bad status frame)"
            )))
        }
    }
    let mut h = blake3::Hasher::new();
    let mut total = 0u64;
    loop {
        let frame = next().await?;
        if frame.is_empty() {
            let got = h.finalize().to_hex().to_string();
            if got != hash {
                return Err(ClusterError::Rpc(format!(
                    "object from {addr} has hash {got}, expected {hash}"
                )));
            }
            return Ok(total);
        }
        total += frame.len() as u64;
        if total > max_bytes {
            return Err(ClusterError::Rpc(format!(
                "{addr} sent more than the {max_bytes} bytes of {hash}"
            )));
        }
        h.update(&frame);
        sink(&frame)?;
    }
}

/// Fuzzing ([`crate::fuzz::framed`]): `data` as the bytes a client sends an object server
/// (token `t`, holding the object `b"fuzz"`), then as the bytes a server answers a client
/// fetching that object; neither end may panic or hang.
pub(crate) async fn fuzz_both_ends(data: &[u8]) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::io::AsyncWriteExt as _;
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "flotilla-fuzz-objects-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let served = async {
        let store = ObjectStore::open(&dir).ok()?;
        let (hash, _) = store.put_bytes(b"fuzz").ok()?;
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let gate = Gate::token("t");
        let serve = serve_one(server, &store, &gate);
        let talk = async {
            let _ = client.write_all(data).await;
            let _ = client.shutdown().await;
            let mut sink = Vec::new();
            let _ = client.read_to_end(&mut sink).await;
        };
        let _ =
            tokio::time::timeout(Duration::from_secs(5), async { tokio::join!(serve, talk) }).await;
        Some(hash)
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    let hash = served.unwrap_or_default();
    let (client, mut server) = tokio::io::duplex(1 << 16);
    let answer = async {
        let mut request = vec![0u8; MAX_REQUEST + 4];
        let _ = server.read(&mut request).await;
        let _ = server.write_all(data).await;
        let _ = server.shutdown().await;
    };
    let fetch = fetch_over(client, "fuzz", "t", &hash, 1 << 20, |_| Ok(()));
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::join!(answer, fetch)
    })
    .await;
}

/// Fetches `hash` over gRPC (`Objects.Fetch`) into memory, hashing it; returns the bytes.
pub fn fetch_grpc<'a>(from: &'a Remote, hash: &'a str) -> crate::Boxed<'a, Result<u64>> {
    crate::boxed(async move {
        let ch = from.channel().await?;
        let mut client =
            ObjectsClient::with_interceptor(ch, crate::auth::TokenAdd::new(&from.token)?)
                .max_decoding_message_size(CHUNK + 4096);
        let mut s = client
            .fetch(proto::FetchRequest {
                hash: hash.to_string(),
                ticket: String::new(),
            })
            .await?
            .into_inner();
        let mut h = blake3::Hasher::new();
        let mut total = 0u64;
        while let Some(c) = s.message().await? {
            h.update(&c.data);
            total += c.data.len() as u64;
        }
        let got = h.finalize().to_hex().to_string();
        if got != hash {
            return Err(ClusterError::Rpc(format!(
                "object has hash {got}, expected {hash}"
            )));
        }
        Ok(total)
    })
}

/// One side-by-side measurement: GB/s (1e9 B/s) of gRPC, of framed TCP and of framed TCP
/// over TLS (a pinned certificate, as workers use with a TLS coordinator) moving the same
/// object of `bytes` bytes over loopback, the median of `reps` fetches each, alternated.
pub fn compare(bytes: usize, reps: usize) -> crate::Boxed<'static, Result<(f64, f64, f64)>> {
    crate::boxed(async move {
        let dir = std::env::temp_dir().join(format!("flotilla-transfer-{}", std::process::id()));
        let store = Arc::new(ObjectStore::open(&dir)?);
        let data: Vec<u8> = (0..bytes)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let (hash, _) = store.put_bytes(&data)?;
        drop(data);
        let token = "bench-token".to_string();
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let grpc = crate::objects::serve_objects(any, store.clone(), token.clone()).await?;
        let framed = serve_framed(any, store.clone(), Gate::token(token.clone())).await?;
        let tls = Arc::new(DataTls::generate()?);
        let print = tls.fingerprint().to_string();
        let framed_tls =
            serve_framed_tls(any, store.clone(), Gate::token(token.clone()), Some(tls)).await?;
        let remote = Remote::new(grpc.to_string(), token.clone());
        let (mut g, mut f, mut s): (Vec<Duration>, Vec<Duration>, Vec<Duration>) =
            (Vec::new(), Vec::new(), Vec::new());
        // One warm-up each: connections, page cache.
        fetch_grpc(&remote, &hash).await?;
        fetch_framed(framed, &token, &hash).await?;
        fetch_framed_pinned(framed_tls, &token, &print, &hash).await?;
        for _ in 0..reps.max(1) {
            let t = Instant::now();
            fetch_grpc(&remote, &hash).await?;
            g.push(t.elapsed());
            let t = Instant::now();
            fetch_framed(framed, &token, &hash).await?;
            f.push(t.elapsed());
            let t = Instant::now();
            fetch_framed_pinned(framed_tls, &token, &print, &hash).await?;
            s.push(t.elapsed());
        }
        let _ = std::fs::remove_dir_all(&dir);
        let med = |v: &mut Vec<Duration>| {
            v.sort();
            v[v.len() / 2].as_secs_f64()
        };
        Ok((
            bytes as f64 / med(&mut g) / 1e9,
            bytes as f64 / med(&mut f) / 1e9,
            bytes as f64 / med(&mut s) / 1e9,
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn both_paths_move_an_object_intact_and_refuse_a_wrong_token() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(ObjectStore::open(dir.path()).unwrap());
        let data: Vec<u8> = (0..3 * CHUNK + 17).map(|i| (i % 251) as u8).collect();
        let (hash, _) = store.put_bytes(&data).unwrap();
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let framed = serve_framed(any, store.clone(), Gate::token("t"))
            .await
            .unwrap();
        assert_eq!(
            fetch_framed(framed, "t", &hash).await.unwrap(),
            data.len() as u64
        );
        let e = fetch_framed(framed, "x", &hash)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid token"), "{e}");
        let grpc = crate::objects::serve_objects(any, store, "t".into())
            .await
            .unwrap();
        let remote = Remote::new(grpc.to_string(), "t");
        assert_eq!(fetch_grpc(&remote, &hash).await.unwrap(), data.len() as u64);
    }

    #[tokio::test]
    async fn a_worker_serves_an_object_only_for_its_ticket() {
        // Workers once served any object to whoever held the cluster's one token.
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(ObjectStore::open(dir.path()).unwrap());
        let (hash, _) = store.put_bytes(b"an output").unwrap();
        let (other, _) = store.put_bytes(b"another output").unwrap();
        let key = [7u8; 32];
        let keys = Arc::new(parking_lot::RwLock::new(vec![key]));
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let framed = serve_framed(any, store, Gate::Tickets(keys.clone()))
            .await
            .unwrap();
        let ticket = crate::access::ticket(&key, &hash);
        assert_eq!(fetch_framed(framed, &ticket, &hash).await.unwrap(), 9);
        for (t, h) in [
            (ticket.as_str(), other.as_str()),
            ("", hash.as_str()),
            (&crate::access::ticket(&[8u8; 32], &hash), hash.as_str()),
        ] {
            let e = fetch_framed(framed, t, h).await.unwrap_err().to_string();
            assert!(e.contains("invalid token or ticket"), "{e}");
        }
        // A key of the worker's next registration is added; the old one still serves.
        keys.write().push([9u8; 32]);
        let t2 = crate::access::ticket(&[9u8; 32], &other);
        assert_eq!(fetch_framed(framed, &t2, &other).await.unwrap(), 14);
        assert_eq!(fetch_framed(framed, &ticket, &hash).await.unwrap(), 9);
    }

    #[tokio::test]
    async fn small_objects_that_look_like_error_frames_are_fetched_intact() {
        // A small file starting with a 0 byte and otherwise UTF-8 (all zeros) was read as an
        // error frame: every fetch of it failed.
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(ObjectStore::open(dir.path()).unwrap());
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let framed = serve_framed(any, store.clone(), Gate::token("t"))
            .await
            .unwrap();
        for data in [
            vec![0u8; 100],
            b"\0invalid token".to_vec(),
            vec![1u8],
            Vec::new(),
        ] {
            let (hash, _) = store.put_bytes(&data).unwrap();
            assert_eq!(
                fetch_framed(framed, "t", &hash).await.unwrap(),
                data.len() as u64,
                "{data:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_fetch_stops_at_the_announced_size_and_unknown_objects_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(ObjectStore::open(dir.path()).unwrap());
        let (hash, _) = store.put_bytes(&[7u8; 5000]).unwrap();
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let addr = serve_framed(any, store, Gate::token("t"))
            .await
            .unwrap()
            .to_string();
        let e = fetch_framed_into(&addr, ("t", ""), &hash, 4999, |_| Ok(()))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("more than the 4999 bytes"), "{e}");
        assert_eq!(
            fetch_framed_into(&addr, ("t", ""), &hash, 5000, |_| Ok(()))
                .await
                .unwrap(),
            5000
        );
        let missing = "ab".repeat(32);
        let e = fetch_framed_into(&addr, ("t", ""), &missing, 10, |_| Ok(()))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("is not held here"), "{e}");
    }

    #[tokio::test]
    async fn a_request_larger_than_a_token_and_a_hash_is_not_read() {
        // The server once reserved a 1 MiB frame before checking the token.
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(ObjectStore::open(dir.path()).unwrap());
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let addr = serve_framed(any, store, Gate::token("t")).await.unwrap();
        let sock = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut framed = Framed::new(sock, codec(CHUNK + 4096));
        framed
            .send(Bytes::from(vec![b'x'; MAX_REQUEST + 1]))
            .await
            .unwrap();
        // The server closes the connection without answering.
        let answer = framed.next().await;
        assert!(
            matches!(answer, None | Some(Err(_))),
            "the server answered an oversized request: {answer:?}"
        );
    }

    #[tokio::test]
    async fn over_tls_only_the_announced_certificate_is_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(ObjectStore::open(dir.path()).unwrap());
        let data: Vec<u8> = (0..2 * CHUNK + 5).map(|i| (i % 241) as u8).collect();
        let (hash, _) = store.put_bytes(&data).unwrap();
        let tls = Arc::new(DataTls::generate().unwrap());
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let addr = serve_framed_tls(any, store, Gate::token("t"), Some(tls.clone()))
            .await
            .unwrap();
        assert_eq!(
            fetch_framed_pinned(addr, "t", tls.fingerprint(), &hash)
                .await
                .unwrap(),
            data.len() as u64
        );
        // Another certificate's fingerprint (a server in the middle): refused.
        let other = DataTls::generate().unwrap();
        let e = fetch_framed_pinned(addr, "t", other.fingerprint(), &hash)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("not the one the coordinator announced"), "{e}");
        // Plain TCP to a TLS server: no object comes back.
        assert!(fetch_framed(addr, "t", &hash).await.is_err());
        // The ticket is still checked inside TLS.
        let e = fetch_framed_pinned(addr, "x", tls.fingerprint(), &hash)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid token"), "{e}");
    }
}

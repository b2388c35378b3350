//! Framed TCP for bulk data: how workers serve the objects they hold to other workers and to
//! clients gathering outputs. Measured against gRPC's `Objects.Fetch` (1 MiB messages on a
//! server stream) by `flotilla bench transfer`: 2.2–2.8× the throughput on loopback with the
//! same blake3 check (BENCHMARKS.md), so the bulk path is this one; gRPC stays for the
//! coordinator's API and the files uploaded with a job (served on the coordinator's port, over
//! TLS when it has TLS). The framed path is plain TCP with the token (see ARCHITECTURE.md).
//!
//! Protocol: the client sends one frame `token \0 hash`; the server answers frames of up to
//! 1 MiB of the object, then an empty frame; an error is a frame starting with `\0` followed by
//! the message. Frames are `u32` big-endian length + bytes (tokio-util's length-delimited
//! codec). `flotilla bench transfer` moves the same object through both paths in one run;
//! BENCHMARKS.md has the figures and ARCHITECTURE.md the decision.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::io::AsyncReadExt;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use crate::error::{ClusterError, Result};
use crate::objects::ObjectStore;
use crate::proto;
use crate::proto::objects_client::ObjectsClient;
use crate::transport::Remote;

const CHUNK: usize = 1 << 20;

fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .max_frame_length(CHUNK + 4096)
        .new_codec()
}

/// Serves `store` over framed TCP on `addr` (port 0 picks one); returns the bound address.
pub async fn serve_framed(
    addr: SocketAddr,
    store: Arc<ObjectStore>,
    token: String,
) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ClusterError::Bind {
            addr: addr.to_string(),
            source,
        })?;
    let local = listener
        .local_addr()
        .map_err(|e| ClusterError::Config(format!("listener address: {e}")))?;
    let token = Arc::new(token);
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let _ = sock.set_nodelay(true);
            let (store, token) = (store.clone(), token.clone());
            tokio::spawn(async move {
                if let Err(e) = serve_one(sock, &store, &token).await {
                    tracing::debug!("framed object request: {e}");
                }
            });
        }
    });
    Ok(local)
}

async fn serve_one(sock: tokio::net::TcpStream, store: &ObjectStore, token: &str) -> Result<()> {
    let mut framed = Framed::new(sock, codec());
    let io = |e: std::io::Error| ClusterError::Rpc(format!("framed transfer: {e}"));
    let Some(req) = framed.next().await else {
        return Ok(());
    };
    let req = req.map_err(io)?;
    let mut parts = req.splitn(2, |&b| b == 0);
    let (t, hash) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let fail = |m: String| {
        let mut v = vec![0u8];
        v.extend_from_slice(m.as_bytes());
        Bytes::from(v)
    };
    if !crate::auth::ct_eq(t, token.as_bytes()) {
        framed
            .send(fail("invalid token".into()))
            .await
            .map_err(io)?;
        return Ok(());
    }
    let hash = String::from_utf8_lossy(hash).into_owned();
    if !store.has(&hash) {
        framed
            .send(fail(format!("object {hash} is not held here")))
            .await
            .map_err(io)?;
        return Ok(());
    }
    let mut f = tokio::fs::File::open(store.path(&hash)).await.map_err(io)?;
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
pub async fn fetch_framed(addr: SocketAddr, token: &str, hash: &str) -> Result<u64> {
    fetch_framed_into(&addr.to_string(), token, hash, |_| Ok(())).await
}

/// Fetches `hash` from the framed server at `addr` (`host:port`) into `tmp`, checks its
/// blake3 hash, syncs it, then renames it to `dst` (same folder): `dst` is never partial.
pub(crate) async fn fetch_framed_to(
    addr: &str,
    token: &str,
    hash: &str,
    tmp: &Path,
    dst: &Path,
) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(tmp).map_err(|e| ClusterError::io(tmp, e))?;
    let copied = fetch_framed_into(addr, token, hash, |chunk| {
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

/// The client side: each chunk goes to `sink` and into the hash; the hash is checked at the end.
async fn fetch_framed_into(
    addr: &str,
    token: &str,
    hash: &str,
    mut sink: impl FnMut(&[u8]) -> Result<()>,
) -> Result<u64> {
    let io = |e: std::io::Error| ClusterError::Rpc(format!("framed transfer from {addr}: {e}"));
    let sock = tokio::net::TcpStream::connect(addr).await.map_err(io)?;
    sock.set_nodelay(true).map_err(io)?;
    let mut framed = Framed::new(sock, codec());
    let mut req = token.as_bytes().to_vec();
    req.push(0);
    req.extend_from_slice(hash.as_bytes());
    framed.send(Bytes::from(req)).await.map_err(io)?;
    let mut h = blake3::Hasher::new();
    let mut total = 0u64;
    while let Some(frame) = framed.next().await {
        let frame = frame.map_err(io)?;
        if frame.is_empty() {
            let got = h.finalize().to_hex().to_string();
            if got != hash {
                return Err(ClusterError::Rpc(format!(
                    "object from {addr} has hash {got}, expected {hash}"
                )));
            }
            return Ok(total);
        }
        if frame[0] == 0 && total == 0 && frame.len() < 4096 {
            if let Ok(m) = std::str::from_utf8(&frame[1..]) {
                return Err(ClusterError::Rpc(format!("{addr}: {m}")));
            }
        }
        h.update(&frame);
        sink(&frame)?;
        total += frame.len() as u64;
    }
    Err(ClusterError::Rpc(format!(
        "{addr} closed before the end of {hash}"
    )))
}

/// Fetches `hash` over gRPC (`Objects.Fetch`) into memory, hashing it; returns the bytes.
pub async fn fetch_grpc(from: &Remote, hash: &str) -> Result<u64> {
    let ch = from.channel().await?;
    let mut client = ObjectsClient::with_interceptor(ch, crate::auth::TokenAdd::new(&from.token)?)
        .max_decoding_message_size(CHUNK + 4096);
    let mut s = client
        .fetch(proto::FetchRequest {
            hash: hash.to_string(),
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
}

/// One side-by-side measurement: GB/s (1e9 B/s) of gRPC and of framed TCP moving the same
/// object of `bytes` bytes over loopback, the median of `reps` fetches each, alternated.
pub async fn compare(bytes: usize, reps: usize) -> Result<(f64, f64)> {
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
    let framed = serve_framed(any, store.clone(), token.clone()).await?;
    let remote = Remote::new(grpc.to_string(), token.clone());
    let (mut g, mut f): (Vec<Duration>, Vec<Duration>) = (Vec::new(), Vec::new());
    // One warm-up each: connections, page cache.
    fetch_grpc(&remote, &hash).await?;
    fetch_framed(framed, &token, &hash).await?;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        fetch_grpc(&remote, &hash).await?;
        g.push(t.elapsed());
        let t = Instant::now();
        fetch_framed(framed, &token, &hash).await?;
        f.push(t.elapsed());
    }
    let _ = std::fs::remove_dir_all(&dir);
    let med = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64()
    };
    Ok((
        bytes as f64 / med(&mut g) / 1e9,
        bytes as f64 / med(&mut f) / 1e9,
    ))
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
        let framed = serve_framed(any, store.clone(), "t".into()).await.unwrap();
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
}

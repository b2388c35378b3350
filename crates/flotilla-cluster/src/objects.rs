//! Objects: task outputs as content-addressed files (blake3), held by the worker that made
//! them and fetched peer to peer by the workers that need them (staging = "transfer").
//!
//! Each worker serves its objects on its data address over framed TCP ([`crate::framed`],
//! measured 2.2–2.8× gRPC's throughput), behind the same token as the coordinator; the
//! coordinator serves uploaded job files through `Objects.Fetch` on its gRPC port. Fetched and produced objects live in `WORK/objects/<hash>`; a task's
//! sandbox gets hard links (or copies) at the paths the job expects.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use parking_lot::Mutex;
use tonic::{Request, Response, Status};

use crate::auth::{TokenAdd, TokenCheck};
use crate::error::{ClusterError, Result};
use crate::proto::objects_client::ObjectsClient;
use crate::proto::objects_server::{Objects, ObjectsServer};
use crate::proto::{self, Assignment};
use crate::transport::Remote;

const CHUNK: usize = 1 << 20;

/// A directory of content-addressed files.
pub struct ObjectStore {
    dir: PathBuf,
    /// Objects produced here, by the task that made them (reported at registration).
    produced: Mutex<Vec<proto::HeldObject>>,
    /// The jobs each object here serves (produced or fetched for them): an object is
    /// deleted when the last of them is removed.
    users: Mutex<HashMap<String, std::collections::HashSet<u64>>>,
    sizes: Mutex<Sizes>,
    /// The most bytes it may hold, and the option that says so (for the error).
    cap: Option<(u64, &'static str)>,
}

/// The size of every object in a store, and their sum.
#[derive(Clone, Default)]
struct Sizes {
    of: HashMap<String, u64>,
    total: u64,
    /// Objects admitted whose file is still being written.
    arriving: std::collections::HashSet<String>,
}

/// The objects in `dir`, by their files.
fn count(dir: &Path) -> Result<Sizes> {
    let mut sizes = Sizes::default();
    for e in std::fs::read_dir(dir)
        .map_err(|e| ClusterError::io(dir, e))?
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if valid_hash(&name) {
            if let Ok(md) = e.metadata() {
                sizes.insert(name, md.len());
            }
        }
    }
    Ok(sizes)
}

impl Sizes {
    fn insert(&mut self, hash: String, size: u64) {
        if let Some(old) = self.of.insert(hash, size) {
            self.total -= old.min(self.total);
        }
        self.total += size;
    }

    fn remove(&mut self, hash: &str) {
        if let Some(old) = self.of.remove(hash) {
            self.total -= old.min(self.total);
        }
    }
}

impl ObjectStore {
    /// Opens (creating) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_capped(dir, None)
    }

    /// Opens (creating) the store in `dir`, holding at most `cap` bytes (`(bytes, the option
    /// that set it)`): an object that would go beyond is refused with
    /// [`ClusterError::StoreFull`]. Objects already in the folder count.
    pub fn open_capped(dir: &Path, cap: Option<(u64, &'static str)>) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| ClusterError::io(dir, e))?;
        let sizes = count(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            produced: Mutex::new(Vec::new()),
            users: Mutex::new(HashMap::new()),
            sizes: Mutex::new(sizes),
            cap,
        })
    }

    /// Bytes of the objects held.
    pub fn used(&self) -> u64 {
        self.sizes.lock().total
    }

    /// Whether object `hash` of `size` bytes may come in: it is here already, or there is
    /// room for it under the cap. Counted at once (two objects let in together cannot both
    /// take the last room); [`ObjectStore::unadmit`] gives the room back if it does not come.
    fn admit(&self, hash: &str, size: u64) -> Result<()> {
        let mut sizes = self.sizes.lock();
        if sizes.of.contains_key(hash) {
            return Ok(());
        }
        if let Some((cap, flag)) = self.cap {
            if size > cap {
                // Said as such: "full" with nothing in it, and `rm` to make room, misled.
                return Err(ClusterError::ObjectTooLarge {
                    dir: self.dir.display().to_string(),
                    cap,
                    wanted: size,
                    flag,
                });
            }
            if sizes.total.saturating_add(size) > cap {
                // Others may have removed files meanwhile (in a group, the removal of a job
                // on every node): count the folder again before refusing.
                *sizes = self.recounted(&sizes);
            }
            if sizes.total.saturating_add(size) > cap {
                return Err(ClusterError::StoreFull {
                    dir: self.dir.display().to_string(),
                    used: sizes.total,
                    cap,
                    wanted: size,
                    flag,
                });
            }
        }
        sizes.insert(hash.to_string(), size);
        sizes.arriving.insert(hash.to_string());
        Ok(())
    }

    /// The folder's objects as its files say, with the room of those still arriving.
    fn recounted(&self, now: &Sizes) -> Sizes {
        let Ok(mut fresh) = count(&self.dir) else {
            return now.clone();
        };
        for h in &now.arriving {
            if !fresh.of.contains_key(h) {
                fresh.insert(h.clone(), now.of.get(h).copied().unwrap_or(0));
            }
        }
        fresh.arriving = now.arriving.clone();
        fresh
    }

    /// Counts the folder again (files another store on it wrote or removed: in a group,
    /// the objects this node took while it led).
    pub fn recount(&self) {
        let mut sizes = self.sizes.lock();
        *sizes = self.recounted(&sizes);
    }

    /// Gives back the room of an object admitted that did not arrive.
    fn unadmit(&self, hash: &str) {
        let mut sizes = self.sizes.lock();
        sizes.arriving.remove(hash);
        if !self.path(hash).is_file() {
            sizes.remove(hash);
        }
    }

    /// The file of an object.
    pub fn path(&self, hash: &str) -> PathBuf {
        self.dir.join(hash)
    }

    /// Whether the object is here.
    pub fn has(&self, hash: &str) -> bool {
        valid_hash(hash) && self.path(hash).is_file()
    }

    /// Outputs produced here, for re-registration.
    pub fn held(&self) -> Vec<proto::HeldObject> {
        self.produced.lock().clone()
    }

    /// Hashes `file` and stores a copy under its hash. A copy, never a hard link: a task
    /// that goes on writing the file it produced (a process it left behind) must not change
    /// the stored object. `std::fs::copy` uses `copy_file_range`, a reflink on file systems
    /// that share extents.
    pub fn put_file(&self, file: &Path) -> Result<(String, u64)> {
        let mut f = std::fs::File::open(file).map_err(|e| ClusterError::io(file, e))?;
        let mut h = blake3::Hasher::new();
        let mut buf = vec![0u8; CHUNK];
        let mut size = 0u64;
        loop {
            let n = f.read(&mut buf).map_err(|e| ClusterError::io(file, e))?;
            if n == 0 {
                break;
            }
            size += n as u64;
            h.update(&buf[..n]);
        }
        let hash = h.finalize().to_hex().to_string();
        let dst = self.path(&hash);
        if !dst.exists() {
            self.admit(&hash, size)?;
            let tmp = self
                .dir
                .join(format!(".{hash}.tmp{}", rand::random::<u32>()));
            let copied = std::fs::copy(file, &tmp)
                .map_err(|e| ClusterError::io(&tmp, e))
                .and_then(|_| {
                    // The copy must be what was hashed (the file may have changed since).
                    if blake3_file(&tmp)? != hash {
                        return Err(ClusterError::Rpc(format!(
                            "{} changed while it was being stored",
                            file.display()
                        )));
                    }
                    std::fs::rename(&tmp, &dst).map_err(|e| ClusterError::io(&dst, e))
                });
            if let Err(e) = copied {
                let _ = std::fs::remove_file(&tmp);
                self.unadmit(&hash);
                return Err(e);
            }
        }
        let mut sizes = self.sizes.lock();
        sizes.insert(hash.clone(), size);
        sizes.arriving.remove(&hash);
        drop(sizes);
        Ok((hash, size))
    }

    /// Stores `data` under its hash; returns (hash, size).
    pub fn put_bytes(&self, data: &[u8]) -> Result<(String, u64)> {
        let hash = blake3::hash(data).to_hex().to_string();
        let dst = self.path(&hash);
        if !dst.exists() {
            self.admit(&hash, data.len() as u64)?;
            let tmp = self
                .dir
                .join(format!(".{hash}.put{}", rand::random::<u32>()));
            let written = std::fs::write(&tmp, data)
                .map_err(|e| ClusterError::io(&tmp, e))
                .and_then(|()| std::fs::rename(&tmp, &dst).map_err(|e| ClusterError::io(&dst, e)));
            if let Err(e) = written {
                let _ = std::fs::remove_file(&tmp);
                self.unadmit(&hash);
                return Err(e);
            }
        }
        let mut sizes = self.sizes.lock();
        sizes.insert(hash.clone(), data.len() as u64);
        sizes.arriving.remove(&hash);
        drop(sizes);
        Ok((hash, data.len() as u64))
    }

    fn note_produced(&self, task: Option<proto::TaskKey>, obj: &proto::Object) {
        if let Some(k) = &task {
            self.note_use(&obj.hash, k.job);
        }
        self.produced.lock().push(proto::HeldObject {
            task,
            object: Some(obj.clone()),
        });
    }

    /// Object `hash` serves job `job` here.
    pub fn note_use(&self, hash: &str, job: u64) {
        self.users
            .lock()
            .entry(hash.to_string())
            .or_default()
            .insert(job);
    }

    /// Job `job` was removed: its objects that serve no other job are deleted, and it is no
    /// longer reported as holding any. Returns how many files were deleted.
    pub fn forget_job(&self, job: u64) -> usize {
        let mut gone = Vec::new();
        {
            let mut users = self.users.lock();
            users.retain(|hash, jobs| {
                jobs.remove(&job);
                if jobs.is_empty() {
                    gone.push(hash.clone());
                    false
                } else {
                    true
                }
            });
        }
        self.produced
            .lock()
            .retain(|h| h.task.is_none_or(|k| k.job != job));
        let mut n = 0;
        for hash in gone {
            if std::fs::remove_file(self.path(&hash)).is_ok() {
                n += 1;
            }
            self.sizes.lock().remove(&hash);
        }
        n
    }
}

/// The blake3 hash of a file, hex.
fn blake3_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| ClusterError::io(path, e))?;
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut f, &mut h).map_err(|e| ClusterError::io(path, e))?;
    Ok(h.finalize().to_hex().to_string())
}

/// Refuses an object whose hash is not one (it names a file in the store).
fn check_object_hash(obj: &proto::Object) -> Result<()> {
    if valid_hash(&obj.hash) {
        return Ok(());
    }
    Err(ClusterError::Rpc(format!(
        "bad object hash {:?} for {}",
        obj.hash, obj.path
    )))
}

pub(crate) fn valid_hash(h: &str) -> bool {
    h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The `Objects` service over a store (the coordinator's uploads; a worker's store in the
/// transfer benchmark).
pub(crate) struct ObjectsService {
    store: Arc<ObjectStore>,
    /// The coordinator's: a fetch needs the admin token or a ticket for the object.
    tickets: Option<Arc<crate::access::Access>>,
    /// In a group: the node, which asks the others for an upload this one lacks.
    group: Option<Arc<crate::ha::Node>>,
}

type ChunkStream =
    Pin<Box<dyn Stream<Item = std::result::Result<proto::ObjectChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Objects for ObjectsService {
    type FetchStream = ChunkStream;
    async fn fetch(
        &self,
        req: Request<proto::FetchRequest>,
    ) -> std::result::Result<Response<ChunkStream>, Status> {
        if let Some(access) = &self.tickets {
            let admin = req
                .extensions()
                .get::<crate::access::Principal>()
                .is_some_and(|p| p.is_admin());
            let r = req.get_ref();
            let want = access.ticket(crate::server::COORDINATOR_HOLDER, &r.hash);
            if !admin && !crate::auth::ct_eq(r.ticket.as_bytes(), want.as_bytes()) {
                return Err(Status::permission_denied(format!(
                    "no ticket for object {}: objects are fetched with the ticket of an \
                     assignment",
                    r.hash
                )));
            }
        }
        let hash = req.into_inner().hash;
        if !self.store.has(&hash) {
            // Uploaded to an earlier leader: a majority of the group holds it.
            let recovered = match &self.group {
                Some(node) if valid_hash(&hash) => node.recover_object(&hash).await,
                _ => None,
            };
            let kept = match recovered {
                Some(data) => {
                    let store = self.store.clone();
                    tokio::task::spawn_blocking(move || store.put_bytes(&data))
                        .await
                        .map_err(|e| Status::internal(e.to_string()))?
                        .map_err(|e| Status::internal(format!("keeping object {hash}: {e}")))?;
                    true
                }
                None => false,
            };
            if !kept {
                return Err(Status::not_found(format!("object {hash} is not held here")));
            }
        }
        let path = self.store.path(&hash);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            let mut f = match std::fs::File::open(&path) {
                Ok(f) => f,
                Err(e) => {
                    let _ =
                        tx.blocking_send(Err(Status::internal(format!("{}: {e}", path.display()))));
                    return;
                }
            };
            let mut buf = vec![0u8; CHUNK];
            loop {
                match f.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => {
                        if tx
                            .blocking_send(Ok(proto::ObjectChunk {
                                data: buf[..n].to_vec(),
                            }))
                            .is_err()
                        {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = tx.blocking_send(Err(Status::internal(e.to_string())));
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// The coordinator's `Objects` service over `store`: behind `check`, and each fetch needs the
/// admin token or a ticket.
pub(crate) fn objects_service(
    store: Arc<ObjectStore>,
    check: crate::auth::Authn,
    access: Arc<crate::access::Access>,
    group: Option<Arc<crate::ha::Node>>,
) -> tonic::codegen::InterceptedService<ObjectsServer<ObjectsService>, crate::auth::Authn> {
    ObjectsServer::with_interceptor(
        ObjectsService {
            store,
            tickets: Some(access),
            group,
        },
        check,
    )
}

/// Serves `store` over gRPC (`Objects.Fetch`) on `addr` (port 0 picks one); returns the bound
/// address. Workers serve their objects over framed TCP instead ([`crate::framed`]); this one
/// is kept for measuring the two side by side.
pub fn serve_objects(
    addr: SocketAddr,
    store: Arc<ObjectStore>,
    token: String,
) -> crate::Boxed<'static, Result<SocketAddr>> {
    crate::boxed(async move {
        let (listener, local) = crate::transport::bind(addr).await?;
        let svc = ObjectsServer::with_interceptor(
            ObjectsService {
                store,
                tickets: None,
                group: None,
            },
            TokenCheck::new(token),
        );
        tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            if let Err(e) = tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .add_service(svc)
                .serve_with_incoming(incoming)
                .await
            {
                tracing::error!("object server stopped: {e}");
            }
        });
        Ok(local)
    })
}

/// Fetches `hash` into the store: from a worker's data server (framed TCP, `from.token` is
/// the ticket), or from the coordinator (`Objects.Fetch` over gRPC) with `coordinator_ticket`.
async fn fetch_from(
    store: &ObjectStore,
    from: &Remote,
    (hash, size): (&str, u64),
    coordinator_ticket: Option<&str>,
    cert: &str,
) -> Result<()> {
    let tmp = store
        .dir
        .join(format!(".{hash}.fetch{}", rand::random::<u32>()));
    store.admit(hash, size)?;
    let fetched = if let Some(ticket) = coordinator_ticket {
        fetch_to(from, (hash, ticket), &tmp, &store.path(hash)).await
    } else {
        crate::framed::fetch_framed_to(
            &from.addr,
            (&from.token, cert),
            (hash, size),
            &tmp,
            &store.path(hash),
        )
        .await
    };
    if fetched.is_err() {
        store.unadmit(hash);
    }
    fetched
}

/// Fetches object `hash` from `from` (a worker's data server or the coordinator) into `tmp`,
/// checks its blake3 hash, then renames it to `dst` (same folder as `tmp`): `dst` is never
/// partial.
pub(crate) async fn fetch_to(
    from: &Remote,
    (hash, ticket): (&str, &str),
    tmp: &Path,
    dst: &Path,
) -> Result<()> {
    if !valid_hash(hash) {
        return Err(ClusterError::Rpc(format!("bad object hash {hash:?}")));
    }
    let ch = from.channel().await?;
    let mut client = ObjectsClient::with_interceptor(ch, TokenAdd::new(&from.token)?);
    let mut s = client
        .fetch(proto::FetchRequest {
            hash: hash.to_string(),
            ticket: ticket.to_string(),
        })
        .await?
        .into_inner();
    let mut f = std::fs::File::create(tmp).map_err(|e| ClusterError::io(tmp, e))?;
    let mut h = blake3::Hasher::new();
    let copied: Result<()> = async {
        while let Some(c) = s.message().await? {
            h.update(&c.data);
            f.write_all(&c.data).map_err(|e| ClusterError::io(tmp, e))?;
        }
        f.sync_all().map_err(|e| ClusterError::io(tmp, e))
    }
    .await;
    if let Err(e) = copied {
        let _ = std::fs::remove_file(tmp);
        return Err(e);
    }
    let got = h.finalize().to_hex().to_string();
    if got != hash {
        let _ = std::fs::remove_file(tmp);
        return Err(ClusterError::Rpc(format!(
            "object from {} has hash {got}, expected {hash}",
            from.addr
        )));
    }
    std::fs::rename(tmp, dst).map_err(|e| ClusterError::io(dst, e))
}

/// Fetches the outputs of one done task from the leaving worker that holds them (`order`,
/// [`proto::CopyOrder`]) into `store`, and keeps them as held here: reported at
/// re-registration, forgotten with their job. The objects now held.
pub(crate) async fn copy_in(
    store: &ObjectStore,
    order: &proto::CopyOrder,
) -> Result<Vec<proto::HeldObject>> {
    let mut held = Vec::new();
    for input in &order.inputs {
        let Some(obj) = &input.object else { continue };
        check_object_hash(obj)?;
        if !store.has(&obj.hash) {
            let from = Remote::new(input.from.clone(), input.ticket.clone());
            fetch_from(store, &from, (&obj.hash, obj.size), None, &input.from_cert).await?;
        }
        held.push(proto::HeldObject {
            task: order.task,
            object: Some(obj.clone()),
        });
    }
    for h in &held {
        let known = store.produced.lock().contains(h);
        if let (false, Some(obj)) = (known, &h.object) {
            store.note_produced(h.task, obj);
        }
    }
    Ok(held)
}

/// Makes the sandbox of an attempt and puts each input at its path, fetching what is not
/// held here from the worker that holds it (or, for an uploaded file of the job folder, from
/// the coordinator, `coordinator`).
pub(crate) fn stage_inputs(
    store: &ObjectStore,
    work: &Path,
    a: &Assignment,
    coordinator: &Remote,
) -> Result<PathBuf> {
    let dir = sandbox_dir(work, &a.task.unwrap_or_default());
    if dir.exists() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    std::fs::create_dir_all(&dir).map_err(|e| ClusterError::io(&dir, e))?;
    for input in &a.inputs {
        let Some(obj) = &input.object else { continue };
        check_object_hash(obj)?;
        if !store.has(&obj.hash) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| ClusterError::Config(format!("runtime for a fetch: {e}")))?;
            // A peer is shown the ticket the coordinator gave for this object; the
            // coordinator is shown this worker's credential and the ticket.
            let from = if input.from.is_empty() {
                coordinator.clone()
            } else {
                Remote::new(input.from.clone(), input.ticket.clone())
            };
            rt.block_on(fetch_from(
                store,
                &from,
                (&obj.hash, obj.size),
                (input.from.is_empty()).then_some(input.ticket.as_str()),
                &input.from_cert,
            ))?;
        }
        if let Some(k) = &a.task {
            store.note_use(&obj.hash, k.job);
        }
        let rel = safe_relative(&obj.path)?;
        let dst = dir.join(rel);
        if let Some(p) = dst.parent() {
            std::fs::create_dir_all(p).map_err(|e| ClusterError::io(p, e))?;
        }
        // A copy (a reflink where the file system can), never a hard link: a task that
        // writes to its input must not change the object for later tasks.
        let src = store.path(&obj.hash);
        std::fs::copy(&src, &dst).map_err(|e| ClusterError::io(&dst, e))?;
    }
    Ok(dir)
}

/// The sandbox of one attempt in transfer staging: `WORK/sandbox/<job>-<task>-<attempt>`.
pub(crate) fn sandbox_dir(work: &Path, k: &proto::TaskKey) -> PathBuf {
    work.join("sandbox")
        .join(format!("{}-{}-{}", k.job, k.task, k.attempt))
}

/// A job-relative path that stays inside the job folder.
pub(crate) fn safe_relative(p: &str) -> Result<PathBuf> {
    let path = Path::new(p);
    if path.is_absolute()
        || path
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(ClusterError::Rpc(format!(
            "object path {p:?} leaves the job folder"
        )));
    }
    Ok(path.to_path_buf())
}

/// An output must be a regular file inside `root`: not a symbolic link (it would publish
/// whatever it points to, a private key as well as a result), nor under a linked folder.
fn inside(root: &Path, file: &Path, pat: &str) -> Result<()> {
    let refuse = |why: &str| {
        Err(ClusterError::Rpc(format!(
            "output {pat:?} ({}) refused: {why}",
            file.display()
        )))
    };
    let md = std::fs::symlink_metadata(file).map_err(|e| ClusterError::io(file, e))?;
    if md.file_type().is_symlink() {
        return refuse("it is a symbolic link");
    }
    let real_root = std::fs::canonicalize(root).map_err(|e| ClusterError::io(root, e))?;
    let real = std::fs::canonicalize(file).map_err(|e| ClusterError::io(file, e))?;
    if !real.starts_with(&real_root) {
        return refuse("it is outside the task's folder (through a linked folder)");
    }
    Ok(())
}

/// Checks that every declared output exists under `root` (patterns may use `*`, `?`, `[..]`)
/// and, in transfer staging, hashes each into the store, noted as produced by `task` (so a
/// re-registration after a coordinator restart reports it held).
pub(crate) fn collect_outputs(
    store: &ObjectStore,
    root: &Path,
    declared: &[String],
    transfer: bool,
    task: Option<proto::TaskKey>,
) -> Result<Vec<proto::Object>> {
    let mut out = Vec::new();
    for pat in declared {
        safe_relative(pat)?;
        let full = root.join(pat);
        let full_s = full.display().to_string();
        let matches: Vec<PathBuf> = if pat.contains(['*', '?', '[']) {
            glob::glob(&full_s)
                .map_err(|e| ClusterError::Config(format!("output pattern {pat:?}: {e}")))?
                .filter_map(|m| m.ok())
                .filter(|p| p.is_file())
                .collect()
        } else if full.is_file() {
            vec![full.clone()]
        } else {
            Vec::new()
        };
        if matches.is_empty() {
            if full.is_dir() {
                return Err(ClusterError::MissingOutput(format!(
                    "declared output {pat:?} is a folder, not a file (in {}): declare the \
                     files in it, e.g. \"{}/*\"",
                    root.display(),
                    pat.trim_end_matches('/')
                )));
            }
            return Err(ClusterError::MissingOutput(format!(
                "missing declared output {pat:?} (looked in {})",
                root.display()
            )));
        }
        for m in matches {
            inside(root, &m, pat)?;
            let rel = m.strip_prefix(root).unwrap_or(&m).display().to_string();
            let obj = if transfer {
                let (hash, size) = store.put_file(&m)?;
                proto::Object {
                    path: rel,
                    hash,
                    size,
                }
            } else {
                let size = std::fs::metadata(&m).map(|md| md.len()).unwrap_or(0);
                proto::Object {
                    path: rel,
                    hash: String::new(),
                    size,
                }
            };
            if transfer {
                store.note_produced(task, &obj);
            }
            out.push(obj);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assignment(inputs: &[(&str, &str, u64)], attempt: u32) -> Assignment {
        Assignment {
            task: Some(proto::TaskKey {
                job: 1,
                task: 2,
                attempt,
            }),
            inputs: inputs
                .iter()
                .map(|&(path, hash, size)| proto::Input {
                    object: Some(proto::Object {
                        path: path.into(),
                        hash: hash.into(),
                        size,
                    }),
                    from: "127.0.0.1:1".into(),
                    ticket: String::new(),
                    from_cert: String::new(),
                })
                .collect(),
            ..Assignment::default()
        }
    }

    #[test]
    fn a_task_that_writes_to_its_input_does_not_change_the_object() {
        // Inputs were hard-linked into sandboxes: a task that appended to its input
        // corrupted that object for every later task on the worker, in any job.
        let dir = tempfile::tempdir().unwrap();
        let store = ObjectStore::open(&dir.path().join("objects")).unwrap();
        let (hash, size) = store.put_bytes(b"pristine").unwrap();
        let remote = Remote::new("127.0.0.1:1", "t");
        let a = assignment(&[("in/data", &hash, size)], 1);
        let sandbox = stage_inputs(&store, dir.path(), &a, &remote).unwrap();
        let staged = sandbox.join("in/data");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&staged)
            .unwrap();
        std::io::Write::write_all(&mut f, b" vandalised").unwrap();
        drop(f);
        assert_eq!(std::fs::read(store.path(&hash)).unwrap(), b"pristine");
        let b = assignment(&[("in/data", &hash, size)], 2);
        let next = stage_inputs(&store, dir.path(), &b, &remote).unwrap();
        assert_eq!(std::fs::read(next.join("in/data")).unwrap(), b"pristine");
    }

    #[test]
    fn an_output_stored_then_rewritten_by_its_task_leaves_the_object_intact() {
        let dir = tempfile::tempdir().unwrap();
        let store = ObjectStore::open(&dir.path().join("objects")).unwrap();
        let sandbox = dir.path().join("sandbox");
        std::fs::create_dir_all(&sandbox).unwrap();
        std::fs::write(sandbox.join("out"), b"result").unwrap();
        let outs = collect_outputs(&store, &sandbox, &["out".into()], true, None).unwrap();
        std::fs::write(sandbox.join("out"), b"rewritten later").unwrap();
        assert_eq!(std::fs::read(store.path(&outs[0].hash)).unwrap(), b"result");
    }

    #[test]
    fn a_declared_output_that_is_a_folder_is_said_to_be_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = ObjectStore::open(&dir.path().join("objects")).unwrap();
        let sandbox = dir.path().join("sandbox");
        std::fs::create_dir_all(sandbox.join("outdir")).unwrap();
        std::fs::write(sandbox.join("outdir/a.txt"), b"a").unwrap();
        for transfer in [true, false] {
            let e = collect_outputs(&store, &sandbox, &["outdir".into()], transfer, None)
                .unwrap_err()
                .to_string();
            assert!(e.contains("is a folder, not a file"), "{e}");
            assert!(e.contains("\"outdir/*\""), "{e}");
            let files =
                collect_outputs(&store, &sandbox, &["outdir/*".into()], transfer, None).unwrap();
            assert_eq!(files.len(), 1);
        }
    }

    #[test]
    fn outputs_that_are_links_or_lead_out_of_the_sandbox_are_refused() {
        // A link to a private key was hashed, stored and served to whoever gathered outputs.
        let dir = tempfile::tempdir().unwrap();
        let store = ObjectStore::open(&dir.path().join("objects")).unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"private key").unwrap();
        let outside = dir.path().join("elsewhere");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("f"), b"not the task's").unwrap();
        let sandbox = dir.path().join("sandbox");
        std::fs::create_dir_all(&sandbox).unwrap();
        std::os::unix::fs::symlink(&secret, sandbox.join("key")).unwrap();
        std::os::unix::fs::symlink(&outside, sandbox.join("dir")).unwrap();
        std::fs::write(sandbox.join("ok"), b"fine").unwrap();
        for transfer in [true, false] {
            for pat in ["key", "k*", "dir/f"] {
                let e = collect_outputs(&store, &sandbox, &[pat.into()], transfer, None)
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("refused"), "{pat}: {e}");
                assert!(e.contains(pat), "{pat}: {e}");
            }
            let ok = collect_outputs(&store, &sandbox, &["ok".into()], transfer, None).unwrap();
            assert_eq!(ok.len(), 1);
        }
        assert!(!store
            .path(blake3::hash(b"private key").to_hex().as_ref())
            .exists());
    }

    #[test]
    fn a_capped_store_counts_its_folder_again_when_others_change_it() {
        // In a group, a node's group port and its coordinator (while it leads) write to one
        // folder, and the removal of a job removes files from it directly.
        let dir = tempfile::tempdir().unwrap();
        let objects = dir.path().join("objects");
        let store = ObjectStore::open_capped(&objects, Some((1000, "--max-test"))).unwrap();
        let (a, _) = store.put_bytes(&[1u8; 600]).unwrap();
        // Removed behind its back: the room is found again when it would refuse.
        std::fs::remove_file(store.path(&a)).unwrap();
        store
            .put_bytes(&[2u8; 600])
            .expect("fits once the folder is counted again");
        assert_eq!(store.used(), 600);
        // Written by another store on the folder: counted by `recount`.
        let other = ObjectStore::open(&objects).unwrap();
        other.put_bytes(&[3u8; 300]).unwrap();
        store.recount();
        assert_eq!(store.used(), 900);
        assert!(matches!(
            store.put_bytes(&[4u8; 200]),
            Err(ClusterError::StoreFull { used: 900, .. })
        ));
        // Larger than the whole cap: said as such, not "full" with `rm` to make room.
        let e = store.put_bytes(&[5u8; 1001]).unwrap_err();
        assert!(
            matches!(
                e,
                ClusterError::ObjectTooLarge {
                    cap: 1000,
                    wanted: 1001,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("raise --max-test"), "{e}");
    }

    #[test]
    fn a_capped_store_refuses_what_does_not_fit_and_frees_room_when_jobs_go() {
        // Before, nothing bounded a worker's store or the coordinator's uploads: a job could
        // fill the disk.
        let dir = tempfile::tempdir().unwrap();
        let objects = dir.path().join("objects");
        let first = ObjectStore::open(&objects).unwrap();
        let (old, _) = first.put_bytes(&[1u8; 400]).unwrap();
        drop(first);
        // What is already there counts.
        let store = ObjectStore::open_capped(&objects, Some((1000, "--max-test"))).unwrap();
        assert_eq!(store.used(), 400);
        let sandbox = dir.path().join("sandbox");
        std::fs::create_dir_all(&sandbox).unwrap();
        std::fs::write(sandbox.join("a"), [2u8; 500]).unwrap();
        std::fs::write(sandbox.join("b"), [3u8; 500]).unwrap();
        let key = proto::TaskKey {
            job: 5,
            task: 0,
            attempt: 1,
        };
        let a = collect_outputs(&store, &sandbox, &["a".into()], true, Some(key)).unwrap();
        assert_eq!(store.used(), 900);
        // The same object again takes no more room.
        assert!(store.put_bytes(&[2u8; 500]).is_ok());
        let e = collect_outputs(&store, &sandbox, &["b".into()], true, Some(key)).unwrap_err();
        assert!(matches!(
            e,
            ClusterError::StoreFull {
                used: 900,
                cap: 1000,
                wanted: 500,
                ..
            }
        ));
        let msg = e.to_string();
        assert!(
            msg.contains("is full") && msg.contains("--max-test"),
            "{msg}"
        );
        assert_eq!(store.used(), 900, "the refused object holds no room");
        let leftovers = std::fs::read_dir(&objects).unwrap().count();
        assert_eq!(leftovers, 2, "nothing half-written is left");
        // The job is removed: its object goes, and the next one fits.
        store.note_use(&old, 4);
        assert_eq!(store.forget_job(5), 1);
        assert!(!store.has(&a[0].hash));
        assert_eq!(store.used(), 400);
        collect_outputs(&store, &sandbox, &["b".into()], true, Some(key)).unwrap();
        assert_eq!(store.used(), 900);
    }
}

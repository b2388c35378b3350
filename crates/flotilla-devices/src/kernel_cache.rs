//! A disk cache of compiled device kernels.
//!
//! Compiling kernels from source costs from a few hundred milliseconds (PoCL) to seconds (a
//! GPU driver compiling a large program), paid again by every process that opens the device.
//! [`KernelCache`] keeps the compiled binary on disk, keyed by everything that determines it,
//! so the next process loads it instead.
//!
//! # Design
//!
//! - **Key.** A [`CacheKey`] is the SHA-256 of the key parts, each prefixed with its length so
//!   that `["ab", "c"]` and `["a", "bc"]` differ. Callers pass the backend, the device's name
//!   and driver version, the compiler options and the source: a new driver, other options or
//!   an edited kernel is a different key, so an entry is never stale, only unused.
//! - **Entry.** One file per key, `<hex key>.bin`: a fixed header (magic, format version, the
//!   key again, the payload length and the payload's SHA-256) and the payload. A file that is
//!   truncated, has the wrong length, checksum, key or version is treated as absent, and the
//!   next store overwrites it.
//! - **Atomic writes.** An entry is written to a temporary file in the same folder, synced and
//!   renamed over the final name, so a reader sees the old entry, the new one or none, never
//!   half of one, even when two processes store the same key at once.
//! - **Never fatal.** The cache is an optimisation: a folder that cannot be created or written
//!   makes [`KernelCache::get_or_build`] return the freshly built binary with
//!   [`CacheOutcome::NotStored`]. Nothing is logged; the caller decides what to report.
//! - **No eviction.** Entries are small (tens to hundreds of KiB) and only change with the
//!   driver or the kernels; deleting the folder is always safe.
//!
//! The folder defaults to `$FLOTILLA_HOME/kernels`, `FLOTILLA_HOME` defaulting to
//! `~/.flotilla` like the runtime's performance models ([`KernelCacheDir::Default`]).
//!
//! ```
//! use flotilla_devices::kernel_cache::{CacheOutcome, KernelCache};
//!
//! let dir = tempfile::tempdir()?;
//! let cache = KernelCache::new(dir.path());
//! let compile = || Ok::<_, std::io::Error>(b"compiled".to_vec());
//! let parts: [&[u8]; 3] = [b"opencl", b"-DUSE_FP64", b"__kernel void k() {}"];
//! let (bin, outcome) = cache.get_or_build(&parts, compile)?;
//! assert_eq!((bin.as_slice(), outcome), (&b"compiled"[..], CacheOutcome::Stored));
//! let (_, outcome) = cache.get_or_build(&parts, compile)?;
//! assert_eq!(outcome, CacheOutcome::Hit);
//! # Ok::<(), std::io::Error>(())
//! ```

use std::fmt;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

/// The first bytes of every entry.
const MAGIC: &[u8; 8] = b"FLKCACHE";
/// The entry format's version; an entry of another version is ignored.
const FORMAT_VERSION: u32 = 1;
/// Magic, version, reserved word, key, payload length, payload checksum.
const HEADER_LEN: usize = 8 + 4 + 4 + 32 + 8 + 32;

/// Where a backend keeps its compiled kernels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KernelCacheDir {
    /// `$FLOTILLA_HOME/kernels`, `FLOTILLA_HOME` defaulting to `~/.flotilla`; no cache when
    /// neither `FLOTILLA_HOME` nor `HOME` is set.
    #[default]
    Default,
    /// This folder (created on the first store).
    At(PathBuf),
    /// No disk cache: kernels are compiled from source every time.
    Off,
}

impl KernelCacheDir {
    /// The folder this setting names, or `None` for [`KernelCacheDir::Off`] or when the
    /// default cannot be resolved.
    pub fn resolve(&self) -> Option<PathBuf> {
        match self {
            KernelCacheDir::Default => Some(flotilla_core::host::flotilla_home()?.join("kernels")),
            KernelCacheDir::At(dir) => Some(dir.clone()),
            KernelCacheDir::Off => None,
        }
    }

    /// The cache this setting names, if any.
    pub fn open(&self) -> Option<KernelCache> {
        self.resolve().map(KernelCache::new)
    }
}

/// The identity of one compiled kernel binary: the SHA-256 of its key parts.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey([u8; 32]);

impl CacheKey {
    /// The key of `parts` (backend, device, driver version, options, source, ...). Each part
    /// is hashed with its length, so splitting the same bytes differently gives another key.
    pub fn new(parts: &[&[u8]]) -> Self {
        let mut h = Sha256::new();
        h.update((parts.len() as u64).to_le_bytes());
        for p in parts {
            h.update((p.len() as u64).to_le_bytes());
            h.update(p);
        }
        CacheKey(h.finalize().into())
    }

    /// The key as 64 lowercase hex digits (the entry's file name without `.bin`).
    pub fn to_hex(&self) -> String {
        use fmt::Write as _;
        let mut s = String::with_capacity(64);
        for b in self.0 {
            // Writing into a String cannot fail.
            let _ = write!(s, "{b:02x}");
        }
        s
    }
}

impl fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CacheKey({})", self.to_hex())
    }
}

/// Where [`KernelCache::get_or_build`]'s binary came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheOutcome {
    /// Read from the cache; nothing was built.
    Hit,
    /// Built, and stored for the next time.
    Stored,
    /// Built, but could not be stored (the folder is missing and cannot be created, is
    /// read-only, or the disk is full): the next lookup builds again.
    NotStored,
}

impl CacheOutcome {
    /// Whether the binary was read from the cache.
    pub fn is_hit(self) -> bool {
        self == CacheOutcome::Hit
    }
}

/// A folder of compiled kernel binaries; see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelCache {
    dir: PathBuf,
}

impl KernelCache {
    /// A cache in `dir`. Nothing is touched until the first lookup or store; the folder is
    /// created on the first store.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        KernelCache { dir: dir.into() }
    }

    /// The cache's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file that holds `key`'s entry.
    pub fn path_of(&self, key: &CacheKey) -> PathBuf {
        self.dir.join(format!("{}.bin", key.to_hex()))
    }

    /// The stored binary of `key`, or `None` when there is none or the entry cannot be read,
    /// is truncated or is corrupt.
    pub fn load(&self, key: &CacheKey) -> Option<Vec<u8>> {
        let data = fs::read(self.path_of(key)).ok()?;
        decode(key, data)
    }

    /// Stores `binary` as `key`'s entry, replacing any old one atomically.
    ///
    /// # Errors
    /// The I/O error that stopped the folder's creation or the write; nothing is left behind.
    pub fn store(&self, key: &CacheKey, binary: &[u8]) -> std::io::Result<()> {
        static NEXT_TMP: AtomicU64 = AtomicU64::new(0);
        fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!(
            ".{}.{}.{}.tmp",
            key.to_hex(),
            std::process::id(),
            NEXT_TMP.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&header(key, binary))?;
            f.write_all(binary)?;
            f.sync_all()?;
            fs::rename(&tmp, self.path_of(key))
        })();
        if written.is_err() {
            // Best effort: the temporary file may not even exist.
            let _ = fs::remove_file(&tmp);
        }
        written
    }

    /// The binary of the kernel described by `key_parts`: from the cache when it holds a
    /// valid entry, otherwise from `build`, which is then stored.
    ///
    /// # Errors
    /// Only `build`'s error; cache I/O failures give [`CacheOutcome::NotStored`].
    pub fn get_or_build<E>(
        &self,
        key_parts: &[&[u8]],
        build: impl FnOnce() -> Result<Vec<u8>, E>,
    ) -> Result<(Vec<u8>, CacheOutcome), E> {
        let key = CacheKey::new(key_parts);
        if let Some(binary) = self.load(&key) {
            return Ok((binary, CacheOutcome::Hit));
        }
        let binary = build()?;
        let outcome = match self.store(&key, &binary) {
            Ok(()) => CacheOutcome::Stored,
            Err(_) => CacheOutcome::NotStored,
        };
        Ok((binary, outcome))
    }
}

fn checksum(payload: &[u8]) -> [u8; 32] {
    Sha256::digest(payload).into()
}

fn header(key: &CacheKey, payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_LEN);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&key.0);
    h.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    h.extend_from_slice(&checksum(payload));
    h
}

/// The payload of an entry read from disk, if the entry is whole and belongs to `key`.
fn decode(key: &CacheKey, mut data: Vec<u8>) -> Option<Vec<u8>> {
    let head = data.get(..HEADER_LEN)?;
    let (magic, rest) = head.split_at(8);
    let (version, rest) = rest.split_at(4);
    let (_reserved, rest) = rest.split_at(4);
    let (stored_key, rest) = rest.split_at(32);
    let (len, sum) = rest.split_at(8);
    let len = u64::from_le_bytes(len.try_into().ok()?);
    let ok = magic == MAGIC
        && version == FORMAT_VERSION.to_le_bytes()
        && stored_key == key.0
        && (data.len() - HEADER_LEN) as u64 == len
        && sum == checksum(&data[HEADER_LEN..]);
    if !ok {
        return None;
    }
    data.drain(..HEADER_LEN);
    Some(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn parts<'a>(device: &'a str, options: &'a str, source: &'a str) -> [&'a [u8]; 4] {
        [
            b"opencl",
            device.as_bytes(),
            options.as_bytes(),
            source.as_bytes(),
        ]
    }

    /// A fake compiler: counts its calls and returns a binary derived from its input.
    fn compiler<'c>(
        calls: &'c Cell<u32>,
        parts: &'c [&'c [u8]],
    ) -> impl FnOnce() -> Result<Vec<u8>, String> + 'c {
        move || {
            calls.set(calls.get() + 1);
            Ok(parts.concat())
        }
    }

    #[test]
    fn second_lookup_is_a_hit_and_returns_the_same_binary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = KernelCache::new(dir.path().join("kernels"));
        let calls = Cell::new(0);
        let p = parts("dev", "", "src");
        let (b1, o1) = cache.get_or_build(&p, compiler(&calls, &p)).expect("build");
        let (b2, o2) = cache.get_or_build(&p, compiler(&calls, &p)).expect("build");
        assert_eq!((o1, o2), (CacheOutcome::Stored, CacheOutcome::Hit));
        assert_eq!(calls.get(), 1);
        assert_eq!(b1, p.concat());
        assert_eq!(b1, b2);
        // A second cache object on the same folder (another process) sees the entry too.
        let again = KernelCache::new(dir.path().join("kernels"));
        let (b3, o3) = again.get_or_build(&p, compiler(&calls, &p)).expect("build");
        assert_eq!((o3, calls.get()), (CacheOutcome::Hit, 1));
        assert_eq!(b3, b1);
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(cache.dir())
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn other_source_options_or_device_is_a_miss() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = KernelCache::new(dir.path());
        let calls = Cell::new(0);
        let variants = [
            parts("dev", "", "src"),
            parts("dev", "", "src2"),
            parts("dev", "-DUSE_FP64", "src"),
            parts("dev2", "", "src"),
            // The same bytes split differently.
            parts("de", "v", "src"),
        ];
        for p in &variants {
            let (bin, o) = cache.get_or_build(p, compiler(&calls, p)).expect("build");
            assert_eq!(o, CacheOutcome::Stored);
            assert_eq!(bin, p.concat());
        }
        assert_eq!(calls.get(), variants.len() as u32);
        for p in &variants {
            let (bin, o) = cache.get_or_build(p, compiler(&calls, p)).expect("build");
            assert_eq!((o, bin), (CacheOutcome::Hit, p.concat()));
        }
        assert_eq!(calls.get(), variants.len() as u32);
    }

    #[test]
    fn truncated_or_corrupt_entries_are_rebuilt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = KernelCache::new(dir.path());
        let calls = Cell::new(0);
        let p = parts("dev", "", "a longer source so the payload has some bytes");
        let key = CacheKey::new(&p);
        cache.get_or_build(&p, compiler(&calls, &p)).expect("build");
        let good = fs::read(cache.path_of(&key)).expect("entry");
        let damaged: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("header only", good[..HEADER_LEN].to_vec()),
            ("truncated payload", good[..good.len() - 1].to_vec()),
            ("trailing garbage", [good.clone(), vec![0]].concat()),
            ("flipped payload byte", {
                let mut d = good.clone();
                let last = d.len() - 1;
                d[last] ^= 1;
                d
            }),
            ("bad magic", {
                let mut d = good.clone();
                d[0] ^= 1;
                d
            }),
            ("other version", {
                let mut d = good.clone();
                d[8] ^= 1;
                d
            }),
        ];
        for (i, (what, bytes)) in damaged.iter().enumerate() {
            fs::write(cache.path_of(&key), bytes).expect("damage");
            assert_eq!(cache.load(&key), None, "{what}");
            let (bin, o) = cache.get_or_build(&p, compiler(&calls, &p)).expect("build");
            assert_eq!((o, bin), (CacheOutcome::Stored, p.concat()), "{what}");
            assert_eq!(calls.get(), i as u32 + 2, "{what}");
            assert_eq!(
                fs::read(cache.path_of(&key)).expect("entry"),
                good,
                "{what}"
            );
        }
        // An entry copied under another key's name is not that key's entry.
        let q = parts("dev", "", "other");
        let other = CacheKey::new(&q);
        fs::copy(cache.path_of(&key), cache.path_of(&other)).expect("copy");
        assert_eq!(cache.load(&other), None);
    }

    #[test]
    fn unwritable_folder_still_returns_the_binary() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A folder below a regular file can never be created, even by root.
        let file = dir.path().join("not-a-folder");
        fs::write(&file, b"x").expect("file");
        let cache = KernelCache::new(file.join("kernels"));
        let calls = Cell::new(0);
        let p = parts("dev", "", "src");
        for round in 1..=2 {
            let (bin, o) = cache.get_or_build(&p, compiler(&calls, &p)).expect("build");
            assert_eq!((o, bin), (CacheOutcome::NotStored, p.concat()));
            assert_eq!(calls.get(), round);
        }
        assert!(cache.store(&CacheKey::new(&p), b"x").is_err());
    }

    #[cfg(unix)]
    #[test]
    fn read_only_folder_still_returns_the_binary() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let ro = dir.path().join("ro");
        fs::create_dir(&ro).expect("mkdir");
        fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).expect("chmod");
        if fs::write(ro.join("probe"), b"x").is_ok() {
            // Root ignores the mode; `unwritable_folder_still_returns_the_binary` covers it.
            eprintln!("folder mode not enforced (running as root?), skipping");
            return;
        }
        let cache = KernelCache::new(&ro);
        let calls = Cell::new(0);
        let p = parts("dev", "", "src");
        let (bin, o) = cache.get_or_build(&p, compiler(&calls, &p)).expect("build");
        assert_eq!((o, bin), (CacheOutcome::NotStored, p.concat()));
        assert_eq!(fs::read_dir(&ro).expect("read_dir").count(), 0);
    }

    #[test]
    fn build_errors_pass_through_and_store_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = KernelCache::new(dir.path());
        let p = parts("dev", "", "src");
        let err = cache
            .get_or_build(&p, || Err::<Vec<u8>, _>("syntax error".to_string()))
            .expect_err("build fails");
        assert_eq!(err, "syntax error");
        assert_eq!(cache.load(&CacheKey::new(&p)), None);
    }

    #[test]
    fn cache_dir_settings_resolve() {
        let at = PathBuf::from("/some/where");
        assert_eq!(KernelCacheDir::At(at.clone()).resolve(), Some(at));
        assert_eq!(KernelCacheDir::Off.resolve(), None);
        assert!(KernelCacheDir::Off.open().is_none());
        // The default ends in `kernels` below FLOTILLA_HOME or ~/.flotilla (not created).
        if let Some(d) = KernelCacheDir::Default.resolve() {
            assert!(d.ends_with("kernels"), "{d:?}");
            match std::env::var_os("FLOTILLA_HOME").filter(|h| !h.is_empty()) {
                Some(h) => assert_eq!(d, PathBuf::from(h).join("kernels")),
                None => assert!(d.ends_with(".flotilla/kernels"), "{d:?}"),
            }
        }
        assert_eq!(CacheKey::new(&[b"a"]).to_hex().len(), 64);
    }
}

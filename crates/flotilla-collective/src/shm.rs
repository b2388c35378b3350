//! The shared-memory transport: one segment per communicator, mapped by every rank.
//!
//! Layout (all offsets page or cache-line aligned):
//! ```text
//! [0, 4096)             header: magic, size, slot bytes; abort word at 64
//! [4096, ...)           per rank r at 4096 + 256 r: `ready` (+0) and `reduced` (+128) counters,
//!                       the call's signature per parity (+64, +72)
//! slots                 per rank r and parity s: slot(r, s) of SLOT bytes
//! res                   per parity s: res(s) of SLOT bytes
//! ```
//! Every collective is cut into chunks; chunk number `g` (a per-communicator sequence shared
//! by all ranks, never reset) uses parity `s = g % 2` (double buffering):
//! 1. each rank copies its contribution into `slot(me, s)` and stores `ready[me] = g + 1`
//!    (release);
//! 2. it waits until every `ready[i] >= g + 1` (acquire);
//! 3. it reads: an allreduce rank reduces its own block's piece across all slots in rank order
//!    `0..n` into `res(s)`, stores `reduced[me] = g + 1`, waits for all `reduced`, and copies
//!    the other blocks' pieces out of `res(s)`; gathers copy peers' slots out directly.
//!
//! Why parity reuse is safe: a rank writes `slot(me, s)` / `res(s)` for chunk `g + 2` only
//! after step 2 of chunk `g + 1`, i.e. after every rank stored `ready >= g + 2`, which each did
//! after finishing all its reads of chunk `g`. So a rank is at most one chunk ahead of the
//! slowest, and copying chunk `g + 1` in overlaps with peers still reducing chunk `g`.
//!
//! The reduction of every element is `x0 op x1 op ... op x(n-1)`, left to right, so the shared
//! memory results are always bitwise equal to the deterministic TCP path.
//!
//! Waiting spins briefly, then yields, then sleeps; while waiting it checks the abort word,
//! whether peers' TCP connections (kept for point-to-point and for exactly this) are still
//! open, whether their processes exist (`kill(pid, 0)`), and the timeout.
//!
//! Lifetime: rank 0 creates the file, every rank maps it and acknowledges over TCP, then rank
//! 0 unlinks it, so nothing is left behind even if a rank is killed later; if setup fails,
//! rank 0 unlinks the file when its guard drops.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};

use crate::error::{CommError, Result};
use crate::mesh::Mesh;

const SHM_MAGIC: u64 = 0x464c_4f53_484d_0001;
const HEADER: usize = 4096;
const COUNTER_STRIDE: usize = 256;

/// Bytes of one slot: the chunk each rank contributes per step. Measured on the 2-core
/// development machine with 2 ranks: 256 KiB (the whole segment then fits in the 2 MiB L2)
/// beat 128 KiB, 512 KiB and 1 MiB at 1 MB to 256 MB. Ranks that open a segment take the
/// value from its header.
pub(crate) const SLOT_BYTES: usize = 256 << 10;

/// How long a waiter spins before it sleeps on the futex.
const SPIN: Duration = Duration::from_micros(50);
/// How often a sleeping waiter wakes up to check the abort flag, its peers and the timeout.
const CHECK_EVERY: Duration = Duration::from_millis(5);

/// The low 32 bits of a counter (little-endian), the futex word.
fn futex_word(c: &AtomicU64) -> *const u32 {
    (c as *const AtomicU64).cast::<u32>()
}

fn futex_wait(c: &AtomicU64, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: the futex word lies in a live shared mapping; a shared (non-private) futex, so
    // waiters in other processes are woken too. Spurious returns are handled by the caller.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            futex_word(c),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0,
        );
    }
}

fn futex_wake(c: &AtomicU64) {
    // SAFETY: as above; wakes every waiter on the word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            futex_word(c),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0,
        );
    }
}

pub(crate) struct Segment {
    map: MmapRaw,
    pub(crate) n: usize,
    pub(crate) me: usize,
    slot_bytes: usize,
    slots_off: usize,
    res_off: usize,
    pids: Vec<u32>,
    my_pid: u32,
    pub(crate) seq: u64,
    pub(crate) timeout: Duration,
}

/// Removes the file on drop unless disarmed (rank 0 only).
pub(crate) struct UnlinkGuard(pub(crate) Option<PathBuf>);

impl UnlinkGuard {
    pub(crate) fn unlink_now(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for UnlinkGuard {
    fn drop(&mut self) {
        self.unlink_now();
    }
}

fn layout(n: usize, slot_bytes: usize) -> (usize, usize, usize) {
    let counters = (HEADER + n * COUNTER_STRIDE).div_ceil(4096) * 4096;
    let slots_off = counters;
    let res_off = slots_off + 2 * n * slot_bytes;
    let total = res_off + 2 * slot_bytes;
    (slots_off, res_off, total)
}

fn shm_dir() -> PathBuf {
    let p = Path::new("/dev/shm");
    if p.is_dir() {
        p.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

impl Segment {
    /// Rank 0: creates and initialises a new segment file.
    pub(crate) fn create(
        n: usize,
        pids: Vec<u32>,
        timeout: Duration,
    ) -> Result<(Segment, UnlinkGuard)> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let path = shm_dir().join(format!(
            "flotilla-collective-{}-{}-{}",
            std::process::id(),
            nanos,
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| {
                CommError::io(format!("creating shared memory file {}", path.display()), e)
            })?;
        let guard = UnlinkGuard(Some(path.clone()));
        let slot_bytes = SLOT_BYTES;
        let (slots_off, res_off, total) = layout(n, slot_bytes);
        file.set_len(total as u64).map_err(|e| {
            CommError::io(format!("sizing shared memory file {}", path.display()), e)
        })?;
        let map = MmapOptions::new().len(total).map_raw(&file).map_err(|e| {
            CommError::io(format!("mapping shared memory file {}", path.display()), e)
        })?;
        let seg = Segment {
            map,
            n,
            me: 0,
            slot_bytes,
            slots_off,
            res_off,
            my_pid: std::process::id(),
            pids,
            seq: 0,
            timeout,
        };
        seg.header(1).store(n as u64, Ordering::Relaxed);
        seg.header(2).store(slot_bytes as u64, Ordering::Relaxed);
        seg.header(0).store(SHM_MAGIC, Ordering::Release);
        Ok((seg, guard))
    }

    /// Other ranks: maps the segment rank 0 created.
    pub(crate) fn open(
        path: &Path,
        n: usize,
        me: usize,
        pids: Vec<u32>,
        timeout: Duration,
    ) -> Result<Segment> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| {
                CommError::io(format!("opening shared memory file {}", path.display()), e)
            })?;
        let len = file
            .metadata()
            .map_err(|e| CommError::io(format!("reading size of {}", path.display()), e))?
            .len() as usize;
        if len < HEADER {
            return Err(CommError::InvalidArgument(format!(
                "shared memory file {} is too small ({len} bytes)",
                path.display()
            )));
        }
        let map = MmapOptions::new().len(len).map_raw(&file).map_err(|e| {
            CommError::io(format!("mapping shared memory file {}", path.display()), e)
        })?;
        let mut seg = Segment {
            map,
            n,
            me,
            slot_bytes: 0,
            slots_off: 0,
            res_off: 0,
            my_pid: std::process::id(),
            pids,
            seq: 0,
            timeout,
        };
        let slot_bytes = seg.header(2).load(Ordering::Relaxed) as usize;
        let (slots_off, res_off, total) = layout(n, slot_bytes);
        if seg.header(0).load(Ordering::Acquire) != SHM_MAGIC
            || seg.header(1).load(Ordering::Relaxed) != n as u64
            || slot_bytes < 4096
            || !slot_bytes.is_multiple_of(4096)
            || total != len
        {
            return Err(CommError::InvalidArgument(format!(
                "shared memory file {} has a foreign header",
                path.display()
            )));
        }
        seg.slot_bytes = slot_bytes;
        seg.slots_off = slots_off;
        seg.res_off = res_off;
        Ok(seg)
    }

    fn atomic(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= self.map.len());
        // SAFETY: the offset is 8-aligned inside the live mapping (page aligned base), and
        // every process accesses these words only atomically.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU64) }
    }

    fn header(&self, word: usize) -> &AtomicU64 {
        self.atomic(word * 8)
    }

    fn abort_word(&self) -> &AtomicU64 {
        self.atomic(64)
    }

    fn ready(&self, r: usize) -> &AtomicU64 {
        self.atomic(HEADER + r * COUNTER_STRIDE)
    }

    fn reduced(&self, r: usize) -> &AtomicU64 {
        self.atomic(HEADER + r * COUNTER_STRIDE + 128)
    }

    fn signature(&self, r: usize, s: usize) -> &AtomicU64 {
        self.atomic(HEADER + r * COUNTER_STRIDE + 64 + 8 * s)
    }

    /// States what this rank's collective is (its first chunk, of parity `s`), before
    /// `publish_ready`: the peers compare it after their `wait_ready`. One word per parity,
    /// so a rank one chunk ahead does not overwrite what a slower one still reads.
    pub(crate) fn set_signature(&self, s: usize, sig: u64) {
        self.signature(self.me, s).store(sig, Ordering::SeqCst);
    }

    /// The first peer whose stated collective (parity `s`, after `wait_ready`) is not
    /// `sig`, with what it stated.
    pub(crate) fn other_signature(&self, s: usize, sig: u64) -> Option<(usize, u64)> {
        (0..self.n)
            .filter(|&i| i != self.me)
            .map(|i| (i, self.signature(i, s).load(Ordering::SeqCst)))
            .find(|&(_, v)| v != sig)
    }

    /// Raises the abort flag (first rank to abort wins).
    pub(crate) fn abort(&self) {
        let _ = self.abort_word().compare_exchange(
            0,
            self.me as u64 + 1,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    /// Bytes of one slot.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Pointer to `len` elements of `T` at byte offset `off` in `slot(r, s)`.
    ///
    /// # Safety
    /// The caller must follow the chunk protocol: only the owner writes a slot, and only
    /// between the moments described in the module docs.
    pub(crate) unsafe fn slot<T>(&self, r: usize, s: usize, off: usize, len: usize) -> *mut T {
        debug_assert!(off + len * std::mem::size_of::<T>() <= self.slot_bytes);
        debug_assert!(off.is_multiple_of(std::mem::align_of::<T>()));
        let base = self.slots_off + (r * 2 + s) * self.slot_bytes + off;
        // SAFETY: in bounds by the assertion above (the caller keeps off + len within a slot).
        unsafe { self.map.as_mut_ptr().add(base).cast() }
    }

    /// Pointer into `res(s)` at byte offset `off`.
    ///
    /// # Safety
    /// As for [`Segment::slot`].
    pub(crate) unsafe fn res<T>(&self, s: usize, off: usize, len: usize) -> *mut T {
        debug_assert!(off + len * std::mem::size_of::<T>() <= self.slot_bytes);
        let base = self.res_off + s * self.slot_bytes + off;
        // SAFETY: in bounds, see above.
        unsafe { self.map.as_mut_ptr().add(base).cast() }
    }

    /// Starts a new chunk: returns its sequence number.
    pub(crate) fn next_chunk(&mut self) -> u64 {
        let g = self.seq;
        self.seq += 1;
        g
    }

    /// The waiter count next to a counter (same cache line, +8).
    fn sleepers(&self, counter: &AtomicU64) -> &std::sync::atomic::AtomicU32 {
        // SAFETY: every counter is followed by a 4-byte aligned word in the same 128-byte
        // block of the mapping, accessed only atomically.
        unsafe {
            &*((counter as *const AtomicU64).cast::<u8>().add(8)
                as *const std::sync::atomic::AtomicU32)
        }
    }

    fn publish(&self, c: &AtomicU64, value: u64) {
        c.store(value, Ordering::SeqCst);
        if self.sleepers(c).load(Ordering::SeqCst) != 0 {
            futex_wake(c);
        }
    }

    pub(crate) fn publish_ready(&self, g: u64) {
        self.publish(self.ready(self.me), g + 1);
    }

    pub(crate) fn publish_reduced(&self, g: u64) {
        self.publish(self.reduced(self.me), g + 1);
    }

    pub(crate) fn wait_ready(&self, g: u64, mesh: &Mesh, op: &'static str) -> Result<()> {
        self.wait_all(false, g + 1, mesh, op)
    }

    pub(crate) fn wait_reduced(&self, g: u64, mesh: &Mesh, op: &'static str) -> Result<()> {
        self.wait_all(true, g + 1, mesh, op)
    }

    fn wait_all(&self, reduced: bool, target: u64, mesh: &Mesh, op: &'static str) -> Result<()> {
        for i in 0..self.n {
            if i == self.me {
                continue;
            }
            let c = if reduced {
                self.reduced(i)
            } else {
                self.ready(i)
            };
            if c.load(Ordering::Acquire) >= target {
                continue;
            }
            self.wait_one(c, i, target, mesh, op)?;
        }
        Ok(())
    }

    /// Spins for [`SPIN`], then sleeps on a futex (woken by `publish`), waking every
    /// [`CHECK_EVERY`] to check the abort flag, the peers and the timeout.
    #[cold]
    fn wait_one(
        &self,
        c: &AtomicU64,
        peer: usize,
        target: u64,
        mesh: &Mesh,
        op: &'static str,
    ) -> Result<()> {
        let start = Instant::now();
        let mut iter: u64 = 0;
        loop {
            if c.load(Ordering::Acquire) >= target {
                return Ok(());
            }
            std::hint::spin_loop();
            iter += 1;
            if iter.is_multiple_of(64)
                && (self.abort_word().load(Ordering::Relaxed) != 0 || start.elapsed() >= SPIN)
            {
                break;
            }
        }
        let sleepers = self.sleepers(c);
        loop {
            let by = self.abort_word().load(Ordering::SeqCst);
            if by != 0 {
                return Err(CommError::Aborted {
                    by: (by - 1) as usize,
                });
            }
            sleepers.fetch_add(1, Ordering::SeqCst);
            let v = c.load(Ordering::SeqCst);
            if v < target {
                futex_wait(c, v as u32, CHECK_EVERY);
            }
            sleepers.fetch_sub(1, Ordering::SeqCst);
            if c.load(Ordering::Acquire) >= target {
                return Ok(());
            }
            if let Err(e) = self.check_peers(mesh, op) {
                // The peer may have finished its part and exited normally.
                if c.load(Ordering::Acquire) >= target {
                    return Ok(());
                }
                return Err(e);
            }
            if start.elapsed() >= self.timeout {
                return Err(CommError::Timeout {
                    peer: Some(peer),
                    op,
                    after: self.timeout,
                });
            }
        }
    }

    fn check_peers(&self, mesh: &Mesh, op: &'static str) -> Result<()> {
        mesh.check_alive(op)?;
        for (i, &pid) in self.pids.iter().enumerate() {
            if i == self.me || pid == self.my_pid {
                continue;
            }
            let Ok(p) = libc::pid_t::try_from(pid) else {
                continue;
            };
            // SAFETY: signal 0 only checks for existence.
            let rc = unsafe { libc::kill(p, 0) };
            if rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
                return Err(CommError::PeerLost {
                    peer: i,
                    op,
                    detail: format!("process {pid} is gone"),
                });
            }
        }
        Ok(())
    }
}

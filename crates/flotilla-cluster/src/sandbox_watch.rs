//! The size of transfer-staging sandboxes, watched (`flotilla worker --max-sandbox`): a
//! thread walks each running attempt's folder twice a second and stops an attempt whose
//! folder has grown past the cap (its disk blocks, so sparse files count for what they use).
//! Files larger than the cap are stopped at once by `RLIMIT_FSIZE`; this catches many
//! smaller ones. HTCondor's disk policy works the same way (periodic checks).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use flotilla_exec::CancelHandle;
use parking_lot::Mutex;

/// How often the folders are measured.
const EVERY: Duration = Duration::from_millis(500);

/// The most entries one measurement walks (beyond, the folder counts as over the cap).
const MAX_ENTRIES: usize = 1_000_000;

struct Watched {
    dir: PathBuf,
    cancel: CancelHandle,
    over: Arc<AtomicU64>,
}

/// The watcher: the attempts' folders and their cap.
pub(crate) struct SandboxWatch {
    cap: u64,
    live: Mutex<HashMap<u64, Watched>>,
    next: AtomicU64,
}

/// One attempt's folder under watch, until dropped.
pub(crate) struct Watch {
    id: u64,
    over: Arc<AtomicU64>,
    of: Arc<SandboxWatch>,
}

impl Watch {
    /// The size that went past the cap, if the attempt was stopped for it.
    pub(crate) fn over(&self) -> Option<u64> {
        match self.over.load(Ordering::SeqCst) {
            0 => None,
            n => Some(n),
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.of.live.lock().remove(&self.id);
    }
}

impl SandboxWatch {
    /// A watcher for folders of at most `cap` bytes, with its thread (which ends when the
    /// watcher is dropped).
    pub(crate) fn start(cap: u64) -> std::io::Result<Arc<SandboxWatch>> {
        let w = Arc::new(SandboxWatch {
            cap,
            live: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        });
        let weak = Arc::downgrade(&w);
        std::thread::Builder::new()
            .name("flotilla-sandbox-watch".into())
            .spawn(move || run(weak))?;
        Ok(w)
    }

    /// The cap, bytes.
    pub(crate) fn cap(&self) -> u64 {
        self.cap
    }

    /// Watches `dir` for the attempt that `cancel` stops.
    pub(crate) fn watch(self: &Arc<Self>, dir: &Path, cancel: &CancelHandle) -> Watch {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let over = Arc::new(AtomicU64::new(0));
        self.live.lock().insert(
            id,
            Watched {
                dir: dir.to_path_buf(),
                cancel: cancel.clone(),
                over: over.clone(),
            },
        );
        Watch {
            id,
            over,
            of: self.clone(),
        }
    }
}

fn run(weak: Weak<SandboxWatch>) {
    loop {
        std::thread::sleep(EVERY);
        let Some(w) = weak.upgrade() else { return };
        let dirs: Vec<(u64, PathBuf)> = w
            .live
            .lock()
            .iter()
            .map(|(id, x)| (*id, x.dir.clone()))
            .collect();
        for (id, dir) in dirs {
            let size = disk_usage(&dir);
            if size > w.cap {
                if let Some(x) = w.live.lock().remove(&id) {
                    x.over.store(size, Ordering::SeqCst);
                    x.cancel.cancel();
                }
            }
        }
    }
}

/// Calls `f` with the metadata of every entry under `dir`, not following links; `false`
/// when it stopped past [`MAX_ENTRIES`] entries.
fn each_entry(dir: &Path, mut f: impl FnMut(&std::fs::Metadata)) -> bool {
    let mut seen = 0usize;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            seen += 1;
            if seen > MAX_ENTRIES {
                return false;
            }
            let Ok(md) = e.path().symlink_metadata() else {
                continue;
            };
            f(&md);
            if md.is_dir() {
                stack.push(e.path());
            }
        }
    }
    true
}

/// The disk blocks used under `dir` (bytes), not following links; `u64::MAX` past
/// [`MAX_ENTRIES`] entries.
pub(crate) fn disk_usage(dir: &Path) -> u64 {
    let mut total = 0u64;
    let whole = each_entry(dir, |md| {
        total = total.saturating_add(md.blocks().saturating_mul(512));
    });
    if whole {
        total
    } else {
        u64::MAX
    }
}

/// The length of the largest file under `dir` (not following links; stops at
/// [`MAX_ENTRIES`] entries): a file as long as the cap was cut there by `RLIMIT_FSIZE`.
pub(crate) fn largest_file(dir: &Path) -> u64 {
    let mut largest = 0u64;
    each_entry(dir, |md| {
        if md.is_file() {
            largest = largest.max(md.len());
        }
    });
    largest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_file_is_found_in_subfolders() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("small"), [0u8; 10]).unwrap();
        std::fs::write(dir.path().join("a/b/big"), [0u8; 300]).unwrap();
        assert_eq!(largest_file(dir.path()), 300);
        assert_eq!(largest_file(&dir.path().join("missing")), 0);
    }

    #[test]
    fn a_folder_past_the_cap_stops_its_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let w = SandboxWatch::start(64 << 10).unwrap();
        let cancel = CancelHandle::new();
        let watch = w.watch(dir.path(), &cancel);
        std::fs::create_dir_all(dir.path().join("sub")).unwrap();
        for i in 0..4 {
            std::fs::write(dir.path().join(format!("sub/f{i}")), vec![7u8; 32 << 10]).unwrap();
        }
        // Waits for the watcher's verdict (twice a second), not for a fixed time.
        for _ in 0..600 {
            if cancel.is_cancelled() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(cancel.is_cancelled(), "the attempt was not stopped");
        assert!(watch.over().unwrap() > 64 << 10);
        // A folder under the cap is left alone.
        let small = tempfile::tempdir().unwrap();
        std::fs::write(small.path().join("f"), b"tiny").unwrap();
        let c2 = CancelHandle::new();
        let w2 = w.watch(small.path(), &c2);
        assert!(disk_usage(small.path()) < 64 << 10);
        drop(w2);
        assert!(!c2.is_cancelled());
        assert_eq!(w.live.lock().len(), 0, "dropped watches are forgotten");
    }
}

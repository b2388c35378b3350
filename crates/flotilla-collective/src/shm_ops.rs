//! Collectives over the shared memory segment (protocol in [`crate::shm`]).

use std::ops::Range;

use crate::element::{partition, reduce_rank_order, Element, ReduceOp};
use crate::error::{CommError, Result};
use crate::mesh::Mesh;
use crate::shm::Segment;

/// The collectives, as [`signature`] codes them.
const OPS: [&str; 6] = [
    "allreduce",
    "reduce",
    "reduce_scatter",
    "allgather",
    "broadcast",
    "barrier",
];
/// The element types, as [`signature`] codes them.
const TYPES: [&str; 5] = ["f32", "f64", "i32", "i64", "bf16"];

/// What a rank's collective is, in one word: the operation, the element type, the root and
/// the length (what every rank must agree on; over TCP a mismatch loses the connection,
/// over shared memory it returned wrong values as `Ok`).
fn signature<T>(op: &str, len: usize, root: Option<usize>) -> u64 {
    let name = std::any::type_name::<T>();
    let elem = TYPES
        .iter()
        .position(|t| name == *t || name.ends_with(&format!("::{t}")))
        .map_or(0, |i| i + 1) as u64;
    let op = OPS.iter().position(|o| *o == op).map_or(0, |i| i + 1) as u64;
    let root = root.map_or(0, |r| (r as u64 + 1).min(0xff));
    (op << 56) | (elem << 48) | (root << 40) | (len as u64 & 0xff_ffff_ffff)
}

/// A [`signature`] as words: "allreduce of 100 f32", "broadcast of 8 f64 from rank 0".
fn describe(sig: u64) -> String {
    let op = OPS
        .get(((sig >> 56) as usize).wrapping_sub(1))
        .unwrap_or(&"a collective");
    let elem = TYPES
        .get((((sig >> 48) & 0xff) as usize).wrapping_sub(1))
        .unwrap_or(&"elements");
    let root = (sig >> 40) & 0xff;
    let len = sig & 0xff_ffff_ffff;
    let mut s = format!("{op} of {len} {elem}");
    if root > 0 {
        s.push_str(&format!(" to/from rank {}", root - 1));
    }
    s
}

/// Publishes this rank's signature for the chunk of parity `s` (call before
/// `publish_ready`).
fn state_call(seg: &Segment, s: usize, sig: u64) {
    seg.set_signature(s, sig);
}

/// After `wait_ready` of a collective's first chunk: every rank called the same one.
fn check_call(seg: &Segment, s: usize, sig: u64, name: &'static str) -> Result<()> {
    match seg.other_signature(s, sig) {
        None => Ok(()),
        Some((rank, theirs)) => Err(CommError::InvalidArgument(format!(
            "{name}: rank {rank} called {}, this rank {}: every rank must call the same \
             collectives in the same order, with the same lengths and element type",
            describe(theirs),
            describe(sig)
        ))),
    }
}

/// Sub-chunk bytes per block when a slot holds one piece of each of the `n` blocks.
fn sub_bytes(seg: &Segment) -> usize {
    (seg.slot_bytes() / seg.n) / 64 * 64
}

fn piece(b: &Range<usize>, lo: usize, c: usize) -> Range<usize> {
    let a = (b.start + lo).min(b.end);
    a..(b.start + lo + c).min(b.end)
}

/// Copies `src` into `slot(me, s)` at byte offset `off`.
fn put<T: Element>(seg: &Segment, s: usize, off: usize, src: &[T]) {
    // SAFETY: the chunk protocol gives this rank exclusive write access to its slot of
    // parity `s` until it publishes `ready`; the range stays inside the slot.
    unsafe {
        std::ptr::copy_nonoverlapping(
            src.as_ptr(),
            seg.slot::<T>(seg.me, s, off, src.len()),
            src.len(),
        )
    }
}

/// A view of `len` elements of `slot(r, s)` at byte offset `off`.
///
/// # Safety
/// Only between `wait_ready` of a chunk and this rank's next `publish_ready`.
unsafe fn view<T: Element>(seg: &Segment, r: usize, s: usize, off: usize, len: usize) -> &[T] {
    // SAFETY: in bounds of the mapping; the protocol guarantees no writer meanwhile.
    unsafe { std::slice::from_raw_parts(seg.slot::<T>(r, s, off, len), len) }
}

/// Allreduce (`root == None`) or reduce to `root`.
pub(crate) fn allreduce<T: Element>(
    seg: &mut Segment,
    mesh: &Mesh,
    buf: &mut [T],
    op: ReduceOp,
    root: Option<usize>,
    name: &'static str,
) -> Result<()> {
    let (n, me) = (seg.n, seg.me);
    let sb = sub_bytes(seg);
    let c = sb / std::mem::size_of::<T>();
    let blocks = partition(buf.len(), n);
    let maxlen = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    let writes_own = root.is_none() || root == Some(me);
    let sig = signature::<T>(name, buf.len(), root);
    for k in 0..maxlen.div_ceil(c) {
        let g = seg.next_chunk();
        let s = (g % 2) as usize;
        let lo = k * c;
        for (j, b) in blocks.iter().enumerate() {
            if j != me {
                put(seg, s, j * sb, &buf[piece(b, lo, c)]);
            }
        }
        if k == 0 {
            state_call(seg, s, sig);
        }
        seg.publish_ready(g);
        seg.wait_ready(g, mesh, name)?;
        if k == 0 {
            check_call(seg, s, sig, name)?;
        }
        let mine = piece(&blocks[me], lo, c);
        let m = mine.len();
        {
            // SAFETY: this rank alone writes its own piece of res(s) in this phase; nobody
            // reads it before `reduced` is published.
            let res: &mut [T] =
                unsafe { std::slice::from_raw_parts_mut(seg.res::<T>(s, me * sb, m), m) };
            let own: &[T] = &buf[mine.clone()];
            let segr: &Segment = seg;
            reduce_rank_order(res, n, op, |i| {
                if i == me {
                    own
                } else {
                    // SAFETY: between wait_ready and the next publish_ready.
                    unsafe { view(segr, i, s, me * sb, m) }
                }
            });
            if writes_own {
                buf[mine].copy_from_slice(res);
            }
        }
        seg.publish_reduced(g);
        if root.is_none() || root == Some(me) {
            seg.wait_reduced(g, mesh, name)?;
            for (j, b) in blocks.iter().enumerate() {
                if j != me {
                    let p = piece(b, lo, c);
                    let len = p.len();
                    // SAFETY: every rank published `reduced` for chunk g, so res(s) is
                    // complete and is not rewritten before this rank's next publish_ready.
                    let src =
                        unsafe { std::slice::from_raw_parts(seg.res::<T>(s, j * sb, len), len) };
                    buf[p].copy_from_slice(src);
                }
            }
        }
    }
    Ok(())
}

/// Reduce-scatter: `recv` (length `m`) gets block `me` of `send` (length `m * n`), reduced.
pub(crate) fn reduce_scatter<T: Element>(
    seg: &mut Segment,
    mesh: &Mesh,
    send: &[T],
    recv: &mut [T],
    op: ReduceOp,
) -> Result<()> {
    let (n, me) = (seg.n, seg.me);
    let sb = sub_bytes(seg);
    let c = sb / std::mem::size_of::<T>();
    let m = recv.len();
    let sig = signature::<T>("reduce_scatter", m, None);
    for k in 0..m.div_ceil(c) {
        let g = seg.next_chunk();
        let s = (g % 2) as usize;
        let lo = k * c;
        let hi = (lo + c).min(m);
        for j in 0..n {
            if j != me {
                put(seg, s, j * sb, &send[j * m + lo..j * m + hi]);
            }
        }
        if k == 0 {
            state_call(seg, s, sig);
        }
        seg.publish_ready(g);
        seg.wait_ready(g, mesh, "reduce_scatter")?;
        if k == 0 {
            check_call(seg, s, sig, "reduce_scatter")?;
        }
        let own = &send[me * m + lo..me * m + hi];
        let segr: &Segment = seg;
        reduce_rank_order(&mut recv[lo..hi], n, op, |i| {
            if i == me {
                own
            } else {
                // SAFETY: between wait_ready and the next publish_ready.
                unsafe { view(segr, i, s, me * sb, hi - lo) }
            }
        });
    }
    Ok(())
}

/// Allgather: block `j` of `recv` is rank `j`'s `send`.
pub(crate) fn allgather<T: Element>(
    seg: &mut Segment,
    mesh: &Mesh,
    send: &[T],
    recv: &mut [T],
) -> Result<()> {
    let (n, me) = (seg.n, seg.me);
    let c = seg.slot_bytes() / std::mem::size_of::<T>();
    let m = send.len();
    recv[me * m..(me + 1) * m].copy_from_slice(send);
    let sig = signature::<T>("allgather", m, None);
    for k in 0..m.div_ceil(c) {
        let g = seg.next_chunk();
        let s = (g % 2) as usize;
        let lo = k * c;
        let hi = (lo + c).min(m);
        put(seg, s, 0, &send[lo..hi]);
        if k == 0 {
            state_call(seg, s, sig);
        }
        seg.publish_ready(g);
        seg.wait_ready(g, mesh, "allgather")?;
        if k == 0 {
            check_call(seg, s, sig, "allgather")?;
        }
        for j in 0..n {
            if j != me {
                // SAFETY: between wait_ready and the next publish_ready.
                let src = unsafe { view::<T>(seg, j, s, 0, hi - lo) };
                recv[j * m + lo..j * m + hi].copy_from_slice(src);
            }
        }
    }
    Ok(())
}

pub(crate) fn broadcast<T: Element>(
    seg: &mut Segment,
    mesh: &Mesh,
    buf: &mut [T],
    root: usize,
) -> Result<()> {
    let me = seg.me;
    let c = seg.slot_bytes() / std::mem::size_of::<T>();
    let m = buf.len();
    let sig = signature::<T>("broadcast", m, Some(root));
    for k in 0..m.div_ceil(c) {
        let g = seg.next_chunk();
        let s = (g % 2) as usize;
        let lo = k * c;
        let hi = (lo + c).min(m);
        if me == root {
            put(seg, s, 0, &buf[lo..hi]);
        }
        if k == 0 {
            state_call(seg, s, sig);
        }
        seg.publish_ready(g);
        seg.wait_ready(g, mesh, "broadcast")?;
        if k == 0 {
            check_call(seg, s, sig, "broadcast")?;
        }
        if me != root {
            // SAFETY: between wait_ready and the next publish_ready.
            let src = unsafe { view::<T>(seg, root, s, 0, hi - lo) };
            buf[lo..hi].copy_from_slice(src);
        }
    }
    Ok(())
}

pub(crate) fn barrier(seg: &mut Segment, mesh: &Mesh) -> Result<()> {
    let g = seg.next_chunk();
    let s = (g % 2) as usize;
    let sig = signature::<u8>("barrier", 0, None);
    state_call(seg, s, sig);
    seg.publish_ready(g);
    seg.wait_ready(g, mesh, "barrier")?;
    check_call(seg, s, sig, "barrier")
}

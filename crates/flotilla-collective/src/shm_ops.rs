//! Collectives over the shared memory segment (protocol in [`crate::shm`]).

use std::ops::Range;

use crate::element::{partition, reduce_rank_order, Element, ReduceOp};
use crate::error::Result;
use crate::mesh::Mesh;
use crate::shm::Segment;

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
    for k in 0..maxlen.div_ceil(c) {
        let g = seg.next_chunk();
        let s = (g % 2) as usize;
        let lo = k * c;
        for (j, b) in blocks.iter().enumerate() {
            if j != me {
                put(seg, s, j * sb, &buf[piece(b, lo, c)]);
            }
        }
        seg.publish_ready(g);
        seg.wait_ready(g, mesh, name)?;
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
        seg.publish_ready(g);
        seg.wait_ready(g, mesh, "reduce_scatter")?;
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
    for k in 0..m.div_ceil(c) {
        let g = seg.next_chunk();
        let s = (g % 2) as usize;
        let lo = k * c;
        let hi = (lo + c).min(m);
        put(seg, s, 0, &send[lo..hi]);
        seg.publish_ready(g);
        seg.wait_ready(g, mesh, "allgather")?;
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
    for k in 0..m.div_ceil(c) {
        let g = seg.next_chunk();
        let s = (g % 2) as usize;
        let lo = k * c;
        let hi = (lo + c).min(m);
        if me == root {
            put(seg, s, 0, &buf[lo..hi]);
        }
        seg.publish_ready(g);
        seg.wait_ready(g, mesh, "broadcast")?;
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
    seg.publish_ready(g);
    seg.wait_ready(g, mesh, "barrier")
}

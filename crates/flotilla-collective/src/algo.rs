//! Collective algorithms over the TCP mesh.
//!
//! - Ring allreduce: a ring reduce-scatter (`n - 1` steps; at step `s` rank `r` sends block
//!   `r - s - 1` to `r + 1` and reduces block `r - s - 2` arriving from `r - 1`, chunk by chunk
//!   as it arrives) leaves rank `r` with block `r` reduced; a ring allgather spreads the blocks.
//! - Recursive doubling: `log2(p)` pairwise exchanges of the whole buffer, where `p` is the
//!   largest power of two `<= n`; the first `2 (n - p)` ranks fold pairwise first (even ranks
//!   hand their data to the odd neighbour and get the result back at the end).
//! - Deterministic: a direct reduce-scatter (every rank sends block `j` straight to rank `j`,
//!   which reduces its block in rank order `0..n`), in pieces of [`DET_PIECE_BYTES`], then a
//!   ring allgather.
//! - Broadcast: binomial tree. Reduce: reduce-scatter, then the blocks are gathered at the
//!   root. Barrier: dissemination with one-element messages.

use std::ops::Range;

use crate::element::{partition, Element, ReduceOp};
use crate::error::Result;
use crate::mesh::{Mesh, RecvReq, SendReq, Sink};

/// Largest pipelined reduction chunk on TCP (see [`tcp_chunk_bytes`]).
pub(crate) const TCP_CHUNK_BYTES: usize = 4 << 20;
/// Smallest pipelined reduction chunk on TCP.
pub(crate) const TCP_MIN_CHUNK_BYTES: usize = 128 << 10;

/// Bytes received per pipelined reduction chunk for a ring segment of `segment_bytes`:
/// an eighth of the segment, clamped to [`TCP_MIN_CHUNK_BYTES`, `TCP_CHUNK_BYTES`]. Measured with
/// 2 ranks on loopback (median µs per call, this vs a fixed 4 MiB chunk): 1 MB 207 vs 238,
/// 4 MB 809 vs 1427, 16 MB 4890 vs 5940, 64 MB 20800 vs 23900. A quarter of the segment, a
/// sixteenth, and fixed 128 KiB or 512 KiB chunks were each worse at some size (fixed 128 KiB:
/// 30% slower at 64 MB, where the larger receives cost fewer system calls).
///
/// The result is a multiple of 64 bytes, so whole elements of every [`Element`] type fit.
pub(crate) fn tcp_chunk_bytes(segment_bytes: usize) -> usize {
    (segment_bytes / 8).clamp(TCP_MIN_CHUNK_BYTES, TCP_CHUNK_BYTES) / 64 * 64
}
/// Bytes per piece of the deterministic direct reduce-scatter (all peers together).
pub(crate) const DET_PIECE_BYTES: usize = 1 << 20;

/// Scratch space reused across calls (8-byte aligned, so it can hold any element type).
#[derive(Default)]
pub(crate) struct Scratch {
    words: Vec<u64>,
}

impl Scratch {
    pub(crate) fn bytes(&mut self, n: usize) -> &mut [u8] {
        let words = n.div_ceil(8);
        if self.words.len() < words {
            self.words.resize(words, 0);
        }
        &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.words[..words])[..n]
    }
    pub(crate) fn elems<T: Element>(&mut self, n: usize) -> &mut [T] {
        let esz = std::mem::size_of::<T>();
        let words = (n * esz).div_ceil(8);
        if self.words.len() < words {
            self.words.resize(words, 0);
        }
        let all: &mut [T] = bytemuck::cast_slice_mut(&mut self.words[..words]);
        &mut all[..n]
    }
}

pub(crate) fn bytes_of<T: Element>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

/// Disjoint `(&buf[a], &mut buf[b])`.
pub(crate) fn split_pair<T>(buf: &mut [T], a: Range<usize>, b: Range<usize>) -> (&[T], &mut [T]) {
    if a.is_empty() {
        return (&[], &mut buf[b]);
    }
    if b.is_empty() {
        return (&buf[a], &mut []);
    }
    if a.start >= b.end {
        let (lo, hi) = buf.split_at_mut(a.start);
        (&hi[..a.len()], &mut lo[b])
    } else {
        assert!(a.end <= b.start, "split_pair: overlapping ranges");
        let (lo, hi) = buf.split_at_mut(b.start);
        (&lo[a], &mut hi[..b.len()])
    }
}

fn sendrecv<T: Element>(
    mesh: &Mesh,
    to: usize,
    data: &[T],
    from: usize,
    sink: Sink<'_, T>,
    op: &'static str,
) -> Result<()> {
    mesh.exchange(
        &mut [SendReq {
            peer: to,
            data: bytes_of(data),
        }],
        &mut [RecvReq { peer: from, sink }],
        op,
    )
}

/// Ring reduce-scatter over `blocks`: afterwards `buf[blocks[rank]]` holds the reduction.
pub(crate) fn ring_reduce_scatter<T: Element>(
    mesh: &Mesh,
    scratch: &mut Scratch,
    buf: &mut [T],
    blocks: &[Range<usize>],
    op: ReduceOp,
    name: &'static str,
) -> Result<()> {
    let (n, r) = (mesh.size, mesh.rank);
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    let segment = blocks.iter().map(|b| b.len()).max().unwrap_or(0) * std::mem::size_of::<T>();
    let tmp = scratch.bytes(tcp_chunk_bytes(segment));
    for s in 0..n - 1 {
        let sb = (r + 2 * n - s - 1) % n;
        let rb = (r + 2 * n - s - 2) % n;
        let (send, recv) = split_pair(buf, blocks[sb].clone(), blocks[rb].clone());
        sendrecv(
            mesh,
            next,
            send,
            prev,
            Sink::Reduce {
                dst: recv,
                op,
                tmp: &mut *tmp,
            },
            name,
        )?;
    }
    Ok(())
}

/// Ring allgather over `blocks`: rank `r` contributes `buf[blocks[r]]`.
pub(crate) fn ring_allgather<T: Element>(
    mesh: &Mesh,
    buf: &mut [T],
    blocks: &[Range<usize>],
    name: &'static str,
) -> Result<()> {
    let (n, r) = (mesh.size, mesh.rank);
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    for s in 0..n - 1 {
        let sb = (r + n - s) % n;
        let rb = (r + 2 * n - s - 1) % n;
        let (send, recv) = split_pair(buf, blocks[sb].clone(), blocks[rb].clone());
        sendrecv(mesh, next, send, prev, Sink::Copy(recv), name)?;
    }
    Ok(())
}

pub(crate) fn ring_allreduce<T: Element>(
    mesh: &Mesh,
    scratch: &mut Scratch,
    buf: &mut [T],
    op: ReduceOp,
) -> Result<()> {
    let blocks = partition(buf.len(), mesh.size);
    ring_reduce_scatter(mesh, scratch, buf, &blocks, op, "allreduce")?;
    ring_allgather(mesh, buf, &blocks, "allreduce")
}

pub(crate) fn rd_allreduce<T: Element>(
    mesh: &Mesh,
    scratch: &mut Scratch,
    buf: &mut [T],
    op: ReduceOp,
) -> Result<()> {
    const NAME: &str = "allreduce";
    let (n, r) = (mesh.size, mesh.rank);
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let rem = n - p;
    let tmp = scratch.elems::<T>(buf.len());
    let vrank = if r < 2 * rem {
        if r % 2 == 0 {
            mesh.exchange::<T>(
                &mut [SendReq {
                    peer: r + 1,
                    data: bytes_of(buf),
                }],
                &mut [],
                NAME,
            )?;
            None
        } else {
            mesh.exchange(
                &mut [],
                &mut [RecvReq {
                    peer: r - 1,
                    sink: Sink::Copy(&mut *tmp),
                }],
                NAME,
            )?;
            T::combine(buf, tmp, op, true);
            Some(r / 2)
        }
    } else {
        Some(r - rem)
    };
    if let Some(v) = vrank {
        let mut mask = 1;
        while mask < p {
            let pv = v ^ mask;
            let peer = if pv < rem { pv * 2 + 1 } else { pv + rem };
            sendrecv(mesh, peer, buf, peer, Sink::Copy(&mut *tmp), NAME)?;
            T::combine(buf, tmp, op, pv < v);
            mask <<= 1;
        }
    }
    if r < 2 * rem {
        if r % 2 == 0 {
            mesh.exchange(
                &mut [],
                &mut [RecvReq {
                    peer: r + 1,
                    sink: Sink::Copy(buf),
                }],
                NAME,
            )?;
        } else {
            mesh.exchange::<T>(
                &mut [SendReq {
                    peer: r - 1,
                    data: bytes_of(buf),
                }],
                &mut [],
                NAME,
            )?;
        }
    }
    Ok(())
}

/// Direct reduce-scatter in rank order: afterwards `buf[blocks[rank]]` holds
/// `x0 op x1 op ... op x(n-1)` for every element, reduced strictly left to right.
pub(crate) fn direct_reduce_scatter<T: Element>(
    mesh: &Mesh,
    scratch: &mut Scratch,
    buf: &mut [T],
    blocks: &[Range<usize>],
    op: ReduceOp,
    name: &'static str,
) -> Result<()> {
    let (n, r) = (mesh.size, mesh.rank);
    if n == 1 {
        return Ok(());
    }
    let esz = std::mem::size_of::<T>();
    let piece = (DET_PIECE_BYTES / esz / (n - 1)).max(1);
    let maxlen = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    let tmp = scratch.elems::<T>(piece * (n - 1));
    let sub = |b: &Range<usize>, off: usize| {
        let a = (b.start + off).min(b.end);
        a..(a + piece).min(b.end)
    };
    let slot = |j: usize| if j < r { j } else { j - 1 };
    let mut off = 0;
    while off < maxlen {
        let mine = sub(&blocks[r], off);
        let m = mine.len();
        {
            let data: &[T] = buf;
            let mut sends: Vec<SendReq<'_>> = (0..n)
                .filter(|&j| j != r)
                .map(|j| SendReq {
                    peer: j,
                    data: bytes_of(&data[sub(&blocks[j], off)]),
                })
                .collect();
            let mut recvs: Vec<RecvReq<'_, T>> = tmp
                .chunks_mut(piece)
                .enumerate()
                .map(|(k, c)| RecvReq {
                    peer: if k < r { k } else { k + 1 },
                    sink: Sink::Copy(&mut c[..m]),
                })
                .collect();
            mesh.exchange(&mut sends, &mut recvs, name)?;
        }
        let own = &mut buf[mine];
        if r == 0 {
            for i in 1..n {
                let k = slot(i);
                T::combine(own, &tmp[k * piece..k * piece + m], op, false);
            }
        } else {
            let (acc, rest) = tmp.split_at_mut(piece);
            let acc = &mut acc[..m];
            for i in 1..n {
                if i == r {
                    T::combine(acc, own, op, false);
                } else {
                    let k = slot(i) - 1;
                    T::combine(acc, &rest[k * piece..k * piece + m], op, false);
                }
            }
            own.copy_from_slice(acc);
        }
        off += piece;
    }
    Ok(())
}

pub(crate) fn det_allreduce<T: Element>(
    mesh: &Mesh,
    scratch: &mut Scratch,
    buf: &mut [T],
    op: ReduceOp,
) -> Result<()> {
    let blocks = partition(buf.len(), mesh.size);
    direct_reduce_scatter(mesh, scratch, buf, &blocks, op, "allreduce")?;
    ring_allgather(mesh, buf, &blocks, "allreduce")
}

pub(crate) fn broadcast<T: Element>(mesh: &Mesh, buf: &mut [T], root: usize) -> Result<()> {
    const NAME: &str = "broadcast";
    let (n, r) = (mesh.size, mesh.rank);
    let vr = (r + n - root) % n;
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            let src = (vr - mask + root) % n;
            mesh.exchange(
                &mut [],
                &mut [RecvReq {
                    peer: src,
                    sink: Sink::Copy(&mut *buf),
                }],
                NAME,
            )?;
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if vr + mask < n {
            let dst = (vr + mask + root) % n;
            mesh.exchange::<T>(
                &mut [SendReq {
                    peer: dst,
                    data: bytes_of(buf),
                }],
                &mut [],
                NAME,
            )?;
        }
        mask >>= 1;
    }
    Ok(())
}

/// Gathers `work[blocks[j]]` from every rank `j` into `out[blocks[j]]` at `root`.
pub(crate) fn gather_blocks<T: Element>(
    mesh: &Mesh,
    work: &[T],
    out: &mut [T],
    blocks: &[Range<usize>],
    root: usize,
    name: &'static str,
) -> Result<()> {
    let r = mesh.rank;
    if r != root {
        return mesh.exchange::<T>(
            &mut [SendReq {
                peer: root,
                data: bytes_of(&work[blocks[r].clone()]),
            }],
            &mut [],
            name,
        );
    }
    out[blocks[r].clone()].copy_from_slice(&work[blocks[r].clone()]);
    let mut recvs: Vec<RecvReq<'_, T>> = Vec::with_capacity(mesh.size);
    let mut rest: &mut [T] = out;
    let mut consumed = 0;
    for (j, b) in blocks.iter().enumerate() {
        let (_, tail) = rest.split_at_mut(b.start - consumed);
        let (blk, tail) = tail.split_at_mut(b.len());
        consumed = b.end;
        rest = tail;
        if j != r {
            recvs.push(RecvReq {
                peer: j,
                sink: Sink::Copy(blk),
            });
        }
    }
    mesh.exchange(&mut [], &mut recvs, name)
}

pub(crate) fn barrier(mesh: &Mesh) -> Result<()> {
    let (n, r) = (mesh.size, mesh.rank);
    let mut k = 1;
    let token = [0i32];
    let mut got = [0i32];
    while k < n {
        sendrecv(
            mesh,
            (r + k) % n,
            &token,
            (r + n - k) % n,
            Sink::Copy(&mut got),
            "barrier",
        )?;
        k <<= 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_pair_gives_disjoint_views() {
        let mut v: Vec<i32> = (0..10).collect();
        let (a, b) = split_pair(&mut v, 6..9, 1..3);
        assert_eq!(a, &[6, 7, 8]);
        b[0] = -1;
        let (a, b) = split_pair(&mut v, 0..2, 5..6);
        assert_eq!(a, &[0, -1]);
        assert_eq!(b, &mut [5]);
        let (a, b) = split_pair(&mut v, 3..3, 2..4);
        assert!(a.is_empty());
        assert_eq!(b.len(), 2);
    }

    #[test]
    fn tcp_chunks_are_an_eighth_of_the_segment_within_bounds() {
        assert_eq!(tcp_chunk_bytes(0), TCP_MIN_CHUNK_BYTES);
        assert_eq!(tcp_chunk_bytes(512 << 10), TCP_MIN_CHUNK_BYTES);
        assert_eq!(tcp_chunk_bytes(2 << 20), 256 << 10);
        assert_eq!(tcp_chunk_bytes(16 << 20), 2 << 20);
        assert_eq!(tcp_chunk_bytes(1 << 30), TCP_CHUNK_BYTES);
        // odd segment lengths still give chunks of whole elements
        assert_eq!(tcp_chunk_bytes(1_120_008 * 8 + 8), 1_120_000);
        for seg in [1_048_583usize, 3_333_333, 9_999_991] {
            assert_eq!(tcp_chunk_bytes(seg) % 8, 0, "segment {seg}");
        }
    }

    #[test]
    fn scratch_is_aligned_for_f64() {
        let mut s = Scratch::default();
        let e = s.elems::<f64>(3);
        assert_eq!(e.len(), 3);
        assert_eq!(e.as_ptr() as usize % 8, 0);
    }
}

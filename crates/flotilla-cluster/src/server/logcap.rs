//! A task's captured output kept within the coordinator's cap (`--max-log-bytes`, per
//! stream and attempt): its head, up to the cap less a tail's room, and its last bytes,
//! kept in memory while the attempt runs and written after the head when it ends. What
//! fails is said at the end of a program's output (the last lines of a failed task's
//! stderr are what `submit --wait` shows): keeping the head alone showed a chatty task's
//! first lines as its "last lines".
//!
//! Pure: the server writes what [`split`] and [`Tail::flush`] give.

use std::borrow::Cow;
use std::collections::VecDeque;

/// The most kept of an output's end: a quarter of the cap, at most 64 KiB.
pub(super) fn tail_room(cap: u64) -> u64 {
    (cap / 4).min(64 << 10)
}

/// What of `data`, the next bytes of an output whose file holds `have` bytes, is written to
/// the file now, and what goes to its tail (see [`Tail`]). The head takes up to `cap -
/// tail_room(cap)` bytes; the first byte past it gets one line saying that the rest is kept
/// only in part (not when the head is filled to the byte and nothing more comes).
pub(super) fn split(have: u64, cap: u64, data: &[u8]) -> (Cow<'_, [u8]>, &[u8]) {
    let head = cap - tail_room(cap);
    let note = || {
        format!(
            "\n[flotilla: output over the cap of {cap} bytes (--max-log-bytes): its first {head} \
             are above; the rest is dropped but for its last {} bytes, written below when the \
             attempt ends]\n",
            tail_room(cap)
        )
        .into_bytes()
    };
    if have < head {
        let room = usize::try_from(head - have).unwrap_or(usize::MAX);
        if data.len() <= room {
            return (data.into(), &[]);
        }
        let mut w = data[..room].to_vec();
        w.extend_from_slice(&note());
        return (w.into(), &data[room..]);
    }
    if have == head && !data.is_empty() {
        return (note().into(), data);
    }
    (Cow::Borrowed(&[]), data)
}

/// The last bytes of an output past its head, and how many before them were dropped.
#[derive(Debug)]
pub(super) struct Tail {
    room: usize,
    ring: VecDeque<u8>,
    dropped: u64,
    /// Changed since it was last saved ([`Tail::saved`]).
    pub(super) dirty: bool,
}

impl Tail {
    pub(super) fn new(cap: u64) -> Tail {
        Tail {
            room: usize::try_from(tail_room(cap)).unwrap_or(usize::MAX),
            ring: VecDeque::new(),
            dropped: 0,
            dirty: false,
        }
    }

    /// What [`Tail::flush`] would write now, for a file beside the log that outlives a
    /// coordinator killed before the attempt ends (appended to the log when it starts
    /// again); it is no longer dirty.
    pub(super) fn saved(&mut self) -> Vec<u8> {
        self.dirty = false;
        let mut w = self.header();
        let (a, b) = self.ring.as_slices();
        w.extend_from_slice(a);
        w.extend_from_slice(b);
        w
    }

    fn header(&self) -> Vec<u8> {
        format!(
            "[flotilla: {} bytes dropped here; the last {} follow]\n",
            self.dropped,
            self.ring.len()
        )
        .into_bytes()
    }

    /// Takes the next bytes past the head, dropping the oldest beyond its room.
    pub(super) fn push(&mut self, data: &[u8]) {
        self.dirty = true;
        let data = if data.len() > self.room {
            let skip = data.len() - self.room;
            self.dropped += skip as u64;
            &data[skip..]
        } else {
            data
        };
        self.ring.extend(data);
        let over = self.ring.len().saturating_sub(self.room);
        if over > 0 {
            self.ring.drain(..over);
            self.dropped += over as u64;
        }
    }

    /// What is written after the head when the attempt ends: how much was dropped, then
    /// the last bytes.
    pub(super) fn flush(self) -> Vec<u8> {
        let mut w = self.header();
        w.extend(self.ring);
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `chunks` as the server does: the file's bytes and the tail, then the flush.
    fn keep(cap: u64, chunks: &[&[u8]]) -> String {
        let mut file: Vec<u8> = Vec::new();
        let mut tail: Option<Tail> = None;
        for c in chunks {
            let (now, rest) = split(file.len() as u64, cap, c);
            file.extend_from_slice(&now);
            if !rest.is_empty() {
                tail.get_or_insert_with(|| Tail::new(cap)).push(rest);
            }
        }
        if let Some(t) = tail {
            file.extend(t.flush());
        }
        String::from_utf8(file).unwrap()
    }

    #[test]
    fn what_is_saved_is_what_the_flush_writes() {
        let mut t = Tail::new(40);
        assert!(!t.dirty);
        t.push(b"0123456789abc");
        assert!(t.dirty);
        let saved = t.saved();
        assert!(!t.dirty);
        assert_eq!(saved, t.flush());
    }

    #[test]
    fn an_output_within_the_cap_is_kept_whole() {
        assert_eq!(keep(100, &[b"abc", b"def"]), "abcdef");
        // The head filled to the byte, nothing more: nothing is said.
        assert_eq!(keep(8, &[b"123456"]), "123456");
    }

    #[test]
    fn an_output_over_the_cap_keeps_its_head_and_its_last_bytes() {
        // cap 40: a head of 30 bytes, a tail of 10.
        let lines: Vec<String> = (0..20).map(|i| format!("line {i:02}\n")).collect();
        let chunks: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
        let kept = keep(40, &chunks);
        assert!(
            kept.starts_with("line 00\nline 01\nline 02\nline 0"),
            "{kept}"
        );
        assert!(
            kept.contains("[flotilla: output over the cap of 40 bytes (--max-log-bytes): its first 30 are above"),
            "{kept}"
        );
        assert!(
            kept.contains("bytes dropped here; the last 10 follow]\n"),
            "{kept}"
        );
        assert!(
            kept.ends_with("\nline 19\n"),
            "the last line is kept: {kept}"
        );
        // 160 bytes: 30 in the head, 10 in the tail, 120 dropped.
        assert!(kept.contains("[flotilla: 120 bytes dropped here"), "{kept}");
    }

    #[test]
    fn a_head_filled_to_the_byte_says_so_with_the_next_byte() {
        // cap 8: a head of 6.
        let kept = keep(8, &[b"123456", b"7", b"89"]);
        assert!(
            kept.starts_with("123456\n[flotilla: output over the cap of 8 bytes"),
            "{kept}"
        );
        assert!(
            kept.ends_with("[flotilla: 1 bytes dropped here; the last 2 follow]\n89"),
            "{kept}"
        );
    }

    #[test]
    fn one_chunk_larger_than_the_tail_keeps_its_end() {
        let big = vec![b'x'; 1000];
        let mut last = big.clone();
        last.extend_from_slice(b"END");
        let kept = keep(100, &[&last]);
        assert!(kept.ends_with("xxEND"), "{kept}");
        assert!(kept.contains("the last 25 follow"), "{kept}");
    }
}

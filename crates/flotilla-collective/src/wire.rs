//! Length-prefixed frames and a tiny field encoding for the rendezvous and the handshakes.
//!
//! A frame is a little-endian `u32` length followed by that many bytes. Fields inside are
//! little-endian `u64`s and strings as a `u32` length plus UTF-8 bytes.

use std::io::{Read, Write};

/// Protocol magic and version, checked on every rendezvous request and mesh handshake.
pub(crate) const MAGIC: u64 = 0x464c_4f43_4f4c_0001; // "FLOCOL" v1

/// The largest frame accepted (the rank table of a big group fits easily).
const MAX_FRAME: usize = 16 << 20;

/// Builds a frame payload.
#[derive(Default)]
pub(crate) struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn u64(mut self, v: u64) -> Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn str(mut self, s: &str) -> Self {
        self.buf.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(s.as_bytes());
        self
    }
    pub(crate) fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads fields from a frame payload.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Some(a)
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        let b = self.take(8)?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }
    pub(crate) fn usize(&mut self) -> Option<usize> {
        usize::try_from(self.u64()?).ok()
    }
    pub(crate) fn str(&mut self) -> Option<String> {
        let n = u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

pub(crate) fn write_frame(w: &mut impl Write, payload: &[u8]) -> std::io::Result<()> {
    let mut v = Vec::with_capacity(payload.len() + 4);
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    w.write_all(&v)?;
    w.flush()
}

pub(crate) fn read_frame(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is larger than the {MAX_FRAME} byte limit"),
        ));
    }
    let mut v = vec![0u8; len];
    r.read_exact(&mut v)?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_through_a_frame() {
        let p = Writer::default().u64(MAGIC).str("key/x").u64(7).finish();
        let mut wire = Vec::new();
        write_frame(&mut wire, &p).unwrap();
        let got = read_frame(&mut wire.as_slice()).unwrap();
        let mut r = Reader::new(&got);
        assert_eq!(r.u64(), Some(MAGIC));
        assert_eq!(r.str().as_deref(), Some("key/x"));
        assert_eq!(r.usize(), Some(7));
        assert_eq!(r.u64(), None);
    }

    #[test]
    fn oversized_frame_is_rejected() {
        let wire = (u32::MAX).to_le_bytes();
        assert!(read_frame(&mut wire.as_slice()).is_err());
    }
}

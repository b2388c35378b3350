//! Standard output that may be closed under us: `flotilla status | head` stops reading after
//! ten lines. `println!` panics there (with a backtrace); these writes fail instead, with
//! [`StdoutClosed`], which `main` turns into a quiet exit. SIGPIPE is not restored to its
//! default for this: the same commands write to sockets, where a closed peer must be an error,
//! not a silent death of the process.

use std::fmt;
use std::io::{self, Write};

/// Standard output was closed by its reader: nothing more can be shown, nothing went wrong.
#[derive(Debug, thiserror::Error)]
#[error("standard output was closed")]
pub(crate) struct StdoutClosed;

/// Writes `args` to standard output, then a newline when `newline`.
pub(crate) fn write(args: fmt::Arguments<'_>, newline: bool) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    let written = out.write_fmt(args).and_then(|()| {
        if newline {
            out.write_all(b"\n")
        } else {
            Ok(())
        }
    });
    checked(written)
}

/// Writes `bytes` to standard output and flushes it.
pub(crate) fn write_all(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    checked(out.write_all(bytes).and_then(|()| out.flush()))
}

/// A write's outcome: a closed pipe is [`StdoutClosed`], another error says where it was.
fn checked(written: io::Result<()>) -> anyhow::Result<()> {
    match written {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        Err(e) => Err(anyhow::Error::new(e).context("writing to standard output")),
    }
}

/// What is printed once a command's outcome is known (a job's summary after `run`, `submit
/// --wait`, `wait`): standard output closed by its reader (`| head -1`) ends the printing, not
/// the command, whose exit status stays the job's. Other errors pass.
pub(crate) fn after_outcome(r: anyhow::Result<()>) -> anyhow::Result<()> {
    match r {
        Err(e) if is_closed(&e) => Ok(()),
        r => r,
    }
}

/// Whether `e` is standard output closed by its reader (see [`StdoutClosed`]).
pub(crate) fn is_closed(e: &anyhow::Error) -> bool {
    e.downcast_ref::<StdoutClosed>().is_some()
}

/// `println!` that returns from the enclosing function (with `?`) when standard output fails.
macro_rules! outln {
    () => {
        $crate::out::write(format_args!(""), true)?
    };
    ($($arg:tt)*) => {
        $crate::out::write(format_args!($($arg)*), true)?
    };
}

/// `print!` that returns from the enclosing function (with `?`) when standard output fails.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::write(format_args!($($arg)*), false)?
    };
}

pub(crate) use {out, outln};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_stdout_is_told_apart_from_other_errors() {
        assert!(is_closed(&StdoutClosed.into()));
        let other = anyhow::Error::new(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(!is_closed(&other), "a broken socket is not a closed stdout");
        let wrapped = anyhow::Error::new(StdoutClosed).context("printing the table");
        assert!(is_closed(&wrapped), "found under a context too");
    }
}

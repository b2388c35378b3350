//! Chrome/Perfetto traces: one track per CPU worker, per device (compute) and per device
//! transfer engine; task spans and transfer spans.
//!
//! Open the file in `ui.perfetto.dev` or `chrome://tracing`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use parking_lot::Mutex;

use crate::error::{Result, RuntimeError};

/// A timeline in the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Track {
    /// A CPU worker or device unit, by unit index.
    Unit(usize),
    /// The transfers of a memory node.
    Transfers(usize),
}

struct Span {
    track: Track,
    name: String,
    start_us: f64,
    dur_us: f64,
}

/// Collects spans in memory and writes them as Chrome trace JSON at shutdown.
pub(crate) struct Tracer {
    path: PathBuf,
    epoch: Instant,
    spans: Mutex<Vec<Span>>,
    names: Vec<String>,
}

impl Tracer {
    /// A tracer writing to `path`, with a name for each unit.
    pub(crate) fn new(path: &Path, unit_names: Vec<String>) -> Self {
        Self {
            path: path.to_path_buf(),
            epoch: Instant::now(),
            spans: Mutex::new(Vec::new()),
            names: unit_names,
        }
    }

    /// Records a span.
    pub(crate) fn span(&self, track: Track, name: &str, start: Instant, end: Instant) {
        let s = Span {
            track,
            name: name.to_string(),
            start_us: start.saturating_duration_since(self.epoch).as_secs_f64() * 1e6,
            dur_us: end.saturating_duration_since(start).as_secs_f64() * 1e6,
        };
        self.spans.lock().push(s);
    }

    fn tid(&self, t: Track) -> usize {
        match t {
            Track::Unit(u) => u,
            Track::Transfers(n) => 10_000 + n,
        }
    }

    /// Renders the trace as Chrome trace JSON.
    pub(crate) fn render(&self) -> String {
        let spans = self.spans.lock();
        let mut out = String::from("{\"traceEvents\":[\n");
        let mut first = true;
        let mut sep = |out: &mut String| {
            if !first {
                out.push_str(",\n");
            }
            first = false;
        };
        for (u, name) in self.names.iter().enumerate() {
            sep(&mut out);
            let _ = write!(
                out,
                "{{\"ph\":\"M\",\"pid\":1,\"tid\":{u},\"name\":\"thread_name\",\"args\":{{\"name\":{}}}}}",
                serde_json::Value::String(name.clone())
            );
        }
        let mut nodes: Vec<usize> = spans
            .iter()
            .filter_map(|s| match s.track {
                Track::Transfers(n) => Some(n),
                _ => None,
            })
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        for n in nodes {
            sep(&mut out);
            let _ = write!(
                out,
                "{{\"ph\":\"M\",\"pid\":1,\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":\"transfers node {n}\"}}}}",
                self.tid(Track::Transfers(n))
            );
        }
        for s in spans.iter() {
            sep(&mut out);
            let cat = match s.track {
                Track::Unit(_) => "task",
                Track::Transfers(_) => "transfer",
            };
            let _ = write!(
                out,
                "{{\"ph\":\"X\",\"pid\":1,\"tid\":{},\"ts\":{:.3},\"dur\":{:.3},\"cat\":\"{cat}\",\"name\":{}}}",
                self.tid(s.track),
                s.start_us,
                s.dur_us,
                serde_json::Value::String(s.name.clone())
            );
        }
        out.push_str("\n]}\n");
        out
    }

    /// Writes the trace file.
    pub(crate) fn write(&self) -> Result<()> {
        std::fs::write(&self.path, self.render()).map_err(|source| RuntimeError::Io {
            path: self.path.display().to_string(),
            source,
        })
    }
}

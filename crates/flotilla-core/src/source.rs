//! Where things are in a job file: byte offsets to lines and columns, and the lines of each
//! task's fields, so that checks made after parsing can still name the line.

use std::collections::BTreeMap;

use crate::error::{JobError, Pos};

/// Turns byte offsets into 1-based lines and columns.
#[derive(Debug, Clone)]
pub(crate) struct LineIndex<'a> {
    text: &'a str,
    starts: Vec<usize>,
}

impl<'a> LineIndex<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        LineIndex { text, starts }
    }

    /// The line and column of byte `offset` (clamped to the text; the end of a text that
    /// ends in a newline counts as the end of the last line).
    pub(crate) fn pos(&self, offset: usize) -> Pos {
        let mut offset = offset.min(self.text.len());
        if offset == self.text.len() && self.text.ends_with('\n') {
            offset -= 1;
        }
        let line = self.starts.partition_point(|&s| s <= offset).max(1);
        let start = self.starts[line - 1];
        let column = self
            .text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count())
            + 1;
        Pos { line, column }
    }

    /// The whole text.
    pub(crate) fn text(&self) -> &'a str {
        self.text
    }

    /// The byte offset where the line holding `offset` starts.
    pub(crate) fn line_start(&self, offset: usize) -> usize {
        self.starts[self.pos(offset).line - 1]
    }

    /// The text of the line holding `offset`, without its newline.
    pub(crate) fn line_text(&self, offset: usize) -> &'a str {
        let line = self.pos(offset).line;
        let start = self.starts[line - 1];
        let end = self.starts.get(line).map_or(self.text.len(), |e| e - 1);
        self.text.get(start..end).unwrap_or("")
    }
}

/// The positions of one task's (or variant's) fields.
#[derive(Debug, Clone, Default)]
pub(crate) struct FieldPositions {
    /// Where the table starts (`[[task]]` header or inline table).
    pub(crate) start: Option<Pos>,
    /// Field name to position of its value.
    pub(crate) fields: BTreeMap<&'static str, Pos>,
}

impl FieldPositions {
    pub(crate) fn get(&self, field: &str) -> Option<Pos> {
        self.fields.get(field).copied().or(self.start)
    }
}

/// Lines of one task's fields.
#[derive(Debug, Clone, Default)]
pub(crate) struct TaskPositions {
    pub(crate) own: FieldPositions,
    /// Position of each `after` element.
    pub(crate) after: Vec<Pos>,
    /// Positions inside each variant.
    pub(crate) variants: Vec<FieldPositions>,
}

/// Where a parsed job's parts are in its file. Kept with a [`JobSpec`](crate::JobSpec) so that
/// checks run after parsing ([`expand`](crate::JobSpec::expand),
/// [`check_fits`](crate::JobSpec::check_fits)) report file and line.
#[derive(Debug, Clone, Default)]
pub struct SourceMap {
    pub(crate) file: String,
    /// Top-level and `defaults.*` fields.
    pub(crate) top: FieldPositions,
    pub(crate) tasks: Vec<TaskPositions>,
}

impl SourceMap {
    /// The file name given to [`parse_job`](crate::parse_job).
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The line of task number `task` (0-based, file order), if known.
    pub fn task_line(&self, task: usize) -> Option<usize> {
        self.tasks.get(task)?.own.start.map(|p| p.line)
    }
}

/// Fills in an error's file and position from an optional source map.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Locator<'a> {
    pub(crate) source: Option<&'a SourceMap>,
}

impl Locator<'_> {
    fn place(&self, mut e: JobError, pos: Option<Pos>) -> JobError {
        if let Some(s) = self.source {
            e.file = Some(s.file.clone());
            e.pos = pos;
        }
        e
    }

    /// A top-level or `defaults.*` field.
    pub(crate) fn top(&self, e: JobError, field: &str) -> JobError {
        let pos = self.source.and_then(|s| s.top.get(field));
        self.place(e, pos)
    }

    /// A field of task `t`.
    pub(crate) fn task(&self, e: JobError, t: usize, field: &str) -> JobError {
        let pos = self
            .source
            .and_then(|s| s.tasks.get(t))
            .and_then(|p| p.own.get(field));
        self.place(e, pos)
    }

    /// Element `k` of task `t`'s `after`.
    pub(crate) fn after(&self, e: JobError, t: usize, k: usize) -> JobError {
        let pos = self
            .source
            .and_then(|s| s.tasks.get(t))
            .and_then(|p| p.after.get(k).copied().or_else(|| p.own.get("after")));
        self.place(e, pos)
    }

    /// A field of variant `v` of task `t`.
    pub(crate) fn variant(&self, e: JobError, t: usize, v: usize, field: &str) -> JobError {
        let pos = self.source.and_then(|s| s.tasks.get(t)).and_then(|p| {
            p.variants
                .get(v)
                .and_then(|f| f.get(field))
                .or(p.own.get("variant"))
        });
        self.place(e, pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_map_to_one_based_lines_and_char_columns() {
        let idx = LineIndex::new("ab\nµx = 1\n\nlast");
        assert_eq!(idx.pos(0), Pos { line: 1, column: 1 });
        assert_eq!(idx.pos(1), Pos { line: 1, column: 2 });
        assert_eq!(idx.pos(3), Pos { line: 2, column: 1 });
        // 'µ' is two bytes but one column.
        assert_eq!(idx.pos(5), Pos { line: 2, column: 2 });
        assert_eq!(idx.pos(11), Pos { line: 3, column: 1 });
        assert_eq!(idx.pos(12), Pos { line: 4, column: 1 });
        assert_eq!(idx.pos(1000).line, 4);
        let trailing = LineIndex::new("a\nb = [\n");
        assert_eq!(
            trailing.pos(8),
            Pos { line: 2, column: 6 },
            "end of input is on the last line"
        );
        assert_eq!(idx.line_text(6), "µx = 1");
        assert_eq!(idx.line_text(12), "last");
    }
}

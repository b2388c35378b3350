//! Tables on the terminal (comfy-table): a header row, columns sized to their contents and
//! wrapped to the terminal's width, numbers right-aligned. `--json` is for scripts.

use comfy_table::{presets, CellAlignment, ContentArrangement, Table};

/// A table with these headers; a header starting with `>` is a right-aligned (numeric)
/// column, the `>` not shown.
pub(crate) fn new(headers: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(headers.iter().map(|h| h.trim_start_matches('>')));
    for (i, h) in headers.iter().enumerate() {
        if h.starts_with('>') {
            if let Some(c) = t.column_mut(i) {
                c.set_cell_alignment(CellAlignment::Right);
            }
        }
    }
    t
}

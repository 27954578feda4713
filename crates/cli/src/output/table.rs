//! The tables every command prints, as kubectl prints them: upper-case
//! headers, columns padded to their widest cell (by display width, so
//! sparklines and wide characters align), three spaces between columns, no
//! borders, no trailing blanks. Built on `comfy-table`, which measures,
//! pads and wraps; this module only fixes kubectl's look and the options
//! kubectl has (`--no-headers`), plus wrapping to a width for free-text
//! columns on a terminal (kubectl never wraps, so nothing wraps unless asked).

use comfy_table::{presets::NOTHING, CellAlignment, ContentArrangement};

/// Spaces between columns (kubectl's tabwriter pads with three).
const GAP: u16 = 3;

/// A kubectl-style table: headers, rows of cells, rendered by [`Table::render`].
#[derive(Clone, Debug, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
    no_headers: bool,
    width: Option<u16>,
    right: Vec<usize>,
}

impl Table {
    /// A table with these column headers.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(headers: I) -> Self {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            ..Table::default()
        }
    }

    /// Appends a row (missing cells print empty, extra cells are dropped).
    pub fn row<I: IntoIterator<Item = S>, S: Into<String>>(&mut self, cells: I) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// Whether no row was added.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Rows added so far.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// `--no-headers`: leave the header line out.
    pub fn no_headers(mut self, no_headers: bool) -> Self {
        self.no_headers = no_headers;
        self
    }

    /// Wraps cells so that every line fits in `width` columns (`None`: never
    /// wrap, as kubectl). For [`terminal_width`]: a pipe gets whole lines.
    pub fn wrap_to(mut self, width: Option<u16>) -> Self {
        self.width = width;
        self
    }

    /// Right-aligns the columns with these indices (numbers read better so).
    pub fn align_right<I: IntoIterator<Item = usize>>(mut self, columns: I) -> Self {
        self.right = columns.into_iter().collect();
        self
    }

    /// Renders the table: one line per row (more where a cell wraps), each
    /// ending in a newline; an empty string for no headers and no rows.
    pub fn render(&self) -> String {
        let cols = self.headers.len();
        if cols == 0 || (self.no_headers && self.rows.is_empty()) {
            return String::new();
        }
        let mut t = comfy_table::Table::new();
        t.load_style(NOTHING);
        match self.width {
            Some(w) => {
                t.set_content_arrangement(ContentArrangement::Dynamic);
                t.set_width(w);
            }
            None => {
                t.set_content_arrangement(ContentArrangement::Disabled);
            }
        }
        let fit = |r: &Vec<String>| -> Vec<String> {
            (0..cols)
                .map(|i| r.get(i).cloned().unwrap_or_default())
                .collect()
        };
        if !self.no_headers {
            t.set_header(fit(&self.headers));
        }
        for r in &self.rows {
            t.add_row(fit(r));
        }
        for (i, c) in t.column_iter_mut().enumerate() {
            let gap = if i + 1 < cols { GAP } else { 0 };
            c.set_padding((0, gap));
            if self.right.contains(&i) {
                c.set_cell_alignment(CellAlignment::Right);
            }
        }
        let mut out = String::new();
        for line in t.lines() {
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// The terminal's width when stdout is one (for [`Table::wrap_to`]); `None`
/// for a pipe or file, so scripts get one line per row.
pub fn terminal_width() -> Option<u16> {
    if !super::stdout_is_terminal() {
        return None;
    }
    crossterm::terminal::size()
        .ok()
        .map(|(w, _)| w)
        .filter(|w| *w > 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_pad_to_the_widest_cell_with_three_spaces_like_kubectl() {
        let mut t = Table::new(["NAME", "RISK"]);
        t.row(["train", "critical"]);
        t.row(["a", "low"]);
        assert_eq!(t.render(), "NAME    RISK\ntrain   critical\na       low\n");
    }

    #[test]
    fn sparklines_count_as_one_column_per_character() {
        let mut t = Table::new(["S", "X"]);
        t.row(["▁▂█", "1"]);
        assert_eq!(t.render(), "S     X\n▁▂█   1\n");
    }

    #[test]
    fn wide_characters_count_two_columns() {
        let mut t = Table::new(["N", "X"]);
        t.row(["日本", "1"]);
        t.row(["abcd", "2"]);
        assert_eq!(t.render(), "N      X\n日本   1\nabcd   2\n");
    }

    #[test]
    fn no_headers_leaves_the_header_line_out_and_keeps_widths_of_the_rows() {
        let mut t = Table::new(["A-LONG-HEADER", "B"]);
        t.row(["x", "y"]);
        assert_eq!(t.clone().no_headers(true).render(), "x   y\n");
        assert_eq!(Table::new(["A"]).no_headers(true).render(), "");
    }

    #[test]
    fn missing_cells_print_empty_and_extra_cells_are_dropped() {
        let mut t = Table::new(["A", "B", "C"]);
        t.row(["1"]);
        t.row(["1", "2", "3", "4"]);
        assert_eq!(t.render(), "A   B   C\n1\n1   2   3\n");
    }

    #[test]
    fn a_width_wraps_the_widest_column_and_nothing_else_wraps_without_one() {
        let mut t = Table::new(["NAME", "MESSAGE"]);
        let long = "the sidecar of rank 3 has not reported for 5 minutes";
        t.row(["train", long]);
        let once = t.render();
        assert_eq!(once.lines().count(), 2, "{once}");
        let wrapped = t.clone().wrap_to(Some(30)).render();
        assert!(wrapped.lines().count() > 2, "{wrapped}");
        assert!(
            wrapped.lines().all(|l| l.chars().count() <= 30),
            "{wrapped}"
        );
        let words: Vec<&str> = wrapped.split_whitespace().collect();
        assert!(words.contains(&"reported"), "{wrapped}");
    }

    #[test]
    fn right_aligned_columns_pad_on_the_left() {
        let mut t = Table::new(["NAME", "SIZE"]);
        t.row(["a", "1"]);
        t.row(["b", "100"]);
        assert_eq!(
            t.align_right([1]).render(),
            "NAME   SIZE\na         1\nb       100\n"
        );
    }
}

//! Plain-text tables the way `kubectl get` prints them: upper-case headers, columns padded to their widest
//! cell and separated by three spaces, no trailing blanks.

/// A table of rows under a header; every row has as many cells as the header.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Table { header: header.into_iter().map(Into::into).collect(), rows: Vec::new() }
    }

    /// Adds a row; a missing cell prints empty and an extra one is a bug of the caller.
    pub fn push(&mut self, row: Vec<String>) {
        debug_assert!(row.len() <= self.header.len(), "row {row:?} is wider than the header {:?}", self.header);
        self.rows.push(row);
    }

    pub fn render(&self) -> String {
        // Widths in characters, not bytes: cells hold `±` and `–`.
        let width = |s: &str| s.chars().count();
        let mut widths: Vec<usize> = self.header.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(width(cell));
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, w) in widths.iter().enumerate() {
                let cell = row.get(i).map(String::as_str).unwrap_or("");
                if i > 0 {
                    line.push_str("   ");
                }
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', w - width(cell)));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_on_characters_and_lines_end_without_blanks() {
        let mut t = Table::new(["A", "LATENCY", "Z"]);
        t.push(vec!["x".into(), "10ms±1ms".into(), "".into()]);
        t.push(vec!["long".into(), "5ms".into(), "z".into()]);
        assert_eq!(t.render(), "A      LATENCY    Z\nx      10ms±1ms\nlong   5ms        z\n");
    }
}

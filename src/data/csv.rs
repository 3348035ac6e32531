//! Reading numeric CSV files, plain or gzip-compressed.

use crate::{Error, Result};
use std::io::Read;
use std::path::Path;

/// A numeric table: `rows x cols` values, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Csv {
    /// Number of rows (data lines).
    pub rows: usize,
    /// Number of columns (the same on every row).
    pub cols: usize,
    /// The values, row after row.
    pub values: Vec<f32>,
}

impl Csv {
    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.values[i * self.cols..(i + 1) * self.cols]
    }
}

/// Reads a CSV file of numbers (comma-separated, one row per line, no
/// header; blank lines are skipped). A file starting with the gzip magic
/// bytes is decompressed first, whatever its name. A field that is not a
/// number, or a row with another number of fields than the first, is an
/// [`Error::Io`] naming the file, line and field.
pub fn read_csv(path: impl AsRef<Path>) -> Result<Csv> {
    let path = path.as_ref();
    let raw = std::fs::read(path).map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))?;
    let text = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = String::new();
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_string(&mut out)
            .map_err(|e| Error::Io(format!("cannot decompress {}: {e}", path.display())))?;
        out
    } else {
        String::from_utf8(raw).map_err(|e| Error::Io(format!("{} is not UTF-8 text: {e}", path.display())))?
    };
    parse(&text, &path.display().to_string())
}

/// Parses CSV text; `name` is what messages call it.
fn parse(text: &str, name: &str) -> Result<Csv> {
    let (mut rows, mut cols, mut values) = (0, 0, Vec::new());
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let before = values.len();
        for (f, field) in line.split(',').enumerate() {
            let v: f32 = field.trim().parse().map_err(|_| {
                Error::Io(format!(
                    "{name}, line {}, field {}: {:?} is not a number",
                    n + 1,
                    f + 1,
                    field.trim()
                ))
            })?;
            values.push(v);
        }
        let got = values.len() - before;
        if rows == 0 {
            cols = got;
        } else if got != cols {
            return Err(Error::Io(format!(
                "{name}, line {}: {got} field(s), but the first row has {cols}",
                n + 1
            )));
        }
        rows += 1;
    }
    Ok(Csv { rows, cols, values })
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn parses_rows_and_skips_blank_lines() {
        let t = parse("1,2,3\n\n4, 5.5 ,-6\n", "t").unwrap();
        assert_eq!((t.rows, t.cols), (2, 3));
        assert_eq!(t.row(1), &[4.0, 5.5, -6.0]);
    }
}

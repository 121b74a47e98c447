//! Text that monitoring systems read from us: Prometheus's exposition format.

use std::fmt::{self, Write};

/// Writes `value` as a label value must appear between its quotes: backslash, double quote and
/// line feed escaped. prometheus-client writes label values exactly as given
/// (prometheus/client_rust#151), and ours come from outside (tenant and application names):
/// unescaped, one could close its label and write series of its own, or break the whole scrape.
pub fn escape_label_value(value: &str, out: &mut impl Write) -> fmt::Result {
    for c in value.chars() {
        match c {
            '\\' => out.write_str("\\\\")?,
            '"' => out.write_str("\\\"")?,
            '\n' => out.write_str("\\n")?,
            c => out.write_char(c)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_three_characters_are_escaped_and_nothing_else() {
        let mut s = String::new();
        super::escape_label_value("a\"b\\c\nd é\t", &mut s).unwrap();
        assert_eq!(s, "a\\\"b\\\\c\\nd é\t");
    }
}

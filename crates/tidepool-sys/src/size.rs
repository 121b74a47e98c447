//! Sizes as people write them (`64K`, `512MiB`, `1.5G`) and as they read them (`1.5 GiB`), one
//! form for every command line, configuration file and environment variable.

/// Parses a size such as `4096`, `64K`, `512MiB`, `2G`, `1.5GiB`. Binary units throughout:
/// for memory, `G` means GiB.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size; write e.g. 4096, 64K, 512M, 2G"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => return Err(format!("unknown unit '{other}' in '{s}'; use K, M, G or T")),
    };
    let bytes = value * mult as f64;
    if !(0.0..=u64::MAX as f64).contains(&bytes) {
        return Err(format!("'{s}' is out of range"));
    }
    Ok(bytes as u64)
}

/// Formats bytes for people: `1.5 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size(" 512 MiB ").unwrap(), 512 << 20);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5Q").unwrap_err().contains("unknown unit"));
        assert_eq!(format_size(3 << 29), "1.5 GiB");
    }
}

//! Byte sizes as people write them: `20GiB`, `512MiB`, `1.5GB`, `4096`.

/// Parses a size with an optional decimal (kB, MB, GB, TB) or binary (KiB, MiB, GiB,
/// TiB) unit; `K`, `M`, `G`, `T` alone are binary, as in `dd` and `du`. The number
/// and unit rules are the `parse-size` crate's; only the bare letters are ours.
pub fn parse_size(text: &str) -> Result<u64, NotASize> {
    let text = text.trim();
    // parse-size reads a bare `M` as `MB`: make it `Mi` (MiB) first.
    let binary;
    let spelled = match text.as_bytes() {
        [.., digit, letter] if !digit.is_ascii_alphabetic() && b"kKmMgGtT".contains(letter) => {
            binary = format!("{text}i");
            &binary
        }
        _ => text,
    };
    parse_size::parse_size(spelled).map_err(|source| NotASize {
        text: text.to_owned(),
        source,
    })
}

/// A size that [`parse_size`](fn@parse_size) cannot read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a size ({source}; try 20GiB, 512MiB or a byte count)")]
pub struct NotASize {
    text: String,
    source: parse_size::Error,
}

/// A size for people: `1.50 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_and_decimal_units() {
        assert_eq!(parse_size("20GiB"), Ok(20 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_size("8M"), Ok(8 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("2 k"), Ok(2048));
        assert_eq!(parse_size("3kB"), Ok(3000));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
    }
}

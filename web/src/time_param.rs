//! Time parameters: RFC 3339 timestamps or Unix seconds (fractions allowed).

use lagscope_model::UnixNanos;

/// Parses `2026-11-29T17:00:00Z`, `2026-11-29T18:00:00+01:00` or `1764435600.5`.
pub fn parse_time(name: &str, text: &str) -> Result<UnixNanos, String> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<f64>() {
        if !seconds.is_finite() || seconds.abs() > 9.2e9 {
            return Err(format!("parameter {name}: {text:?} is out of range"));
        }
        return Ok((seconds * 1e9).round() as i64);
    }
    text.parse::<jiff::Timestamp>()
        .map(|timestamp| timestamp.as_nanosecond() as i64)
        .map_err(|error| format!("parameter {name}: {text:?} is neither RFC 3339 nor Unix seconds ({error})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rfc3339_and_unix_seconds() {
        assert_eq!(parse_time("from", "1970-01-01T00:00:01Z"), Ok(1_000_000_000));
        assert_eq!(parse_time("from", "1970-01-01T01:00:01+01:00"), Ok(1_000_000_000));
        assert_eq!(parse_time("from", "1.5"), Ok(1_500_000_000));
        let error = parse_time("since", "yesterday").expect_err("not a time");
        assert!(error.contains("since") && error.contains("yesterday"), "{error}");
    }
}

//! ISO-8601 / RFC 3339 formatting and parsing of `Timestamp`s, without a clock. The calendar is
//! jiff's (leap years, month lengths, offsets); this module only fixes the wire's shapes.

use std::str::FromStr;

use jiff::civil;
use jiff::tz::TimeZone;

use crate::types::Timestamp;

/// `2026-04-26T10:59:28.267966Z`: six fractional digits, as Queen 0.15 renders `createdAt`.
/// Instants beyond jiff's range (years -9999..=9999; never stored) render at its bound.
pub fn format_iso_micros(t: Timestamp) -> String {
    let ts = jiff::Timestamp::from_microsecond(t.0).unwrap_or(if t.0 < 0 {
        jiff::Timestamp::MIN
    } else {
        jiff::Timestamp::MAX
    });
    format!("{ts:.6}")
}

/// Parses an instant: RFC 3339 with an offset (`Z`, `+02:00`), a date and time without one
/// (taken as UTC), or a date alone (its midnight, UTC). `None` on anything else, including
/// impossible dates (`2026-02-31`) and trailing text.
pub fn parse_iso(s: &str) -> Option<Timestamp> {
    let s = s.trim();
    let ts = match jiff::Timestamp::from_str(s) {
        Ok(ts) => ts,
        // Without an offset: a civil date-time, or a date, in UTC.
        Err(_) if !s.contains(['Z', 'z', '+']) && !has_negative_offset(s) => {
            let civil = civil::DateTime::from_str(s)
                .or_else(|_| civil::Date::from_str(s).map(|d| d.at(0, 0, 0, 0)))
                .ok()?;
            TimeZone::UTC.to_timestamp(civil).ok()?
        }
        Err(_) => return None,
    };
    // Zoned annotations (`[Europe/Paris]`) are not part of the wire's shapes.
    if s.contains('[') {
        return None;
    }
    Some(Timestamp(ts.as_microsecond()))
}

/// A `-HH:MM` offset after the time (a date's own dashes do not count).
fn has_negative_offset(s: &str) -> bool {
    s.find(['T', 't', ' '])
        .is_some_and(|time_at| s[time_at..].contains('-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_queen() {
        assert_eq!(
            format_iso_micros(Timestamp(0)),
            "1970-01-01T00:00:00.000000Z"
        );
        let t = parse_iso("2026-04-26T10:59:28.267966Z").expect("parses");
        assert_eq!(format_iso_micros(t), "2026-04-26T10:59:28.267966Z");
    }

    #[test]
    fn parses_offsets_dates_and_rejects_garbage() {
        let utc = parse_iso("2026-01-02T03:04:05Z").expect("utc");
        assert_eq!(parse_iso("2026-01-02T05:04:05+02:00"), Some(utc));
        assert_eq!(parse_iso("2026-01-02T03:04:05"), Some(utc));
        assert_eq!(parse_iso("2026-01-02"), parse_iso("2026-01-02T00:00:00Z"));
        assert_eq!(parse_iso("now"), None);
        assert_eq!(parse_iso("2026-13-02"), None);
        assert_eq!(parse_iso("2026-01-02T03:04:05Zjunk"), None);
        assert_eq!(parse_iso("2026-01-02T03:04:05+02:00junk"), None);
        assert_eq!(parse_iso("2026-02-31"), None, "no such day");
        assert_eq!(parse_iso("2026-02-29T00:00:00Z"), None, "not a leap year");
        assert!(parse_iso("2028-02-29T00:00:00Z").is_some(), "a leap year");
        assert_eq!(parse_iso("2026-01-02T25:00:00Z"), None);
        assert_eq!(
            parse_iso("2026-01-02T03:04:05-01:00"),
            parse_iso("2026-01-02T04:04:05Z")
        );
        assert_eq!(
            parse_iso("2026-01-02T03:04"),
            parse_iso("2026-01-02T03:04:00Z")
        );
        assert_eq!(
            parse_iso("2026-01-02T03:04:05.123456789Z"),
            parse_iso("2026-01-02T03:04:05.123456Z"),
            "sub-microsecond digits are dropped"
        );
        assert_eq!(parse_iso("2026-01-02T03:04:05Z[Europe/Paris]"), None);
        assert_eq!(parse_iso(""), None);
    }
}

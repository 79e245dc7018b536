//! ISO-8601 / RFC 3339 formatting and parsing of `Timestamp`s, without a clock.

use crate::types::Timestamp;

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// `2026-04-26T10:59:28.267966Z`: six fractional digits, as Queen 0.15 renders `createdAt`.
pub fn format_iso_micros(t: Timestamp) -> String {
    let secs = t.0.div_euclid(1_000_000);
    let micros = t.0.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        sod / 3600,
        (sod % 3600) / 60,
        sod % 60
    )
}

fn digits(s: &[u8], at: usize, n: usize) -> Option<i64> {
    let part = s.get(at..at + n)?;
    part.iter().try_fold(0i64, |acc, c| {
        c.is_ascii_digit().then(|| acc * 10 + i64::from(c - b'0'))
    })
}

/// Parses `YYYY-MM-DD`, `YYYY-MM-DDTHH:MM[:SS[.frac]]` with an optional `Z` or `+HH:MM` offset
/// (no offset means UTC). Returns `None` on anything else.
pub fn parse_iso(s: &str) -> Option<Timestamp> {
    let b = s.trim().as_bytes();
    let y = digits(b, 0, 4)?;
    if b.get(4) != Some(&b'-') || b.get(7) != Some(&b'-') {
        return None;
    }
    let mo = digits(b, 5, 2)? as u32;
    let d = digits(b, 8, 2)? as u32;
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    let mut secs = days_from_civil(y, mo, d) * 86_400;
    let mut micros = 0i64;
    let mut i = 10;
    if i < b.len() {
        if b[i] != b'T' && b[i] != b't' && b[i] != b' ' {
            return None;
        }
        let h = digits(b, i + 1, 2)?;
        if b.get(i + 3) != Some(&b':') {
            return None;
        }
        let mi = digits(b, i + 4, 2)?;
        i += 6;
        let mut sec = 0;
        if b.get(i) == Some(&b':') {
            sec = digits(b, i + 1, 2)?;
            i += 3;
            if b.get(i) == Some(&b'.') {
                i += 1;
                let start = i;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
                let frac = &b[start..i];
                if frac.is_empty() {
                    return None;
                }
                let mut v = 0i64;
                for k in 0..6 {
                    v = v * 10 + frac.get(k).map_or(0, |c| i64::from(c - b'0'));
                }
                micros = v;
            }
        }
        if h > 23 || mi > 59 || sec > 60 {
            return None;
        }
        secs += h * 3600 + mi * 60 + sec;
        match b.get(i) {
            None => {}
            Some(b'Z') | Some(b'z') if i + 1 == b.len() => {}
            Some(&sign @ (b'+' | b'-')) => {
                let oh = digits(b, i + 1, 2)?;
                let om = match b.get(i + 3) {
                    Some(b':') => digits(b, i + 4, 2)?,
                    _ => digits(b, i + 3, 2)?,
                };
                let off = oh * 3600 + om * 60;
                secs += if sign == b'+' { -off } else { off };
            }
            _ => return None,
        }
    }
    Some(Timestamp(secs * 1_000_000 + micros))
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
    }
}

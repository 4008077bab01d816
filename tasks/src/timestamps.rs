//! Timestamps as the protocol doors write and read them: RFC 3339 in UTC
//! (A2A's ProtoJSON `Timestamp`, MCP's ISO 8601 task times).

/// Epoch milliseconds as RFC 3339 in UTC (`2026-12-01T21:43:21.123Z`).
pub fn rfc3339(epoch_ms: u64) -> String {
    let (days, ms_of_day) = (epoch_ms / 86_400_000, epoch_ms % 86_400_000);
    // Howard Hinnant's civil_from_days, for days since 1970-01-01 (never negative here).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (hours, minutes) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60);
    let (seconds, millis) = (ms_of_day / 1000 % 60, ms_of_day % 1000);
    format!("{year:04}-{month:02}-{day:02}T{hours:02}:{minutes:02}:{seconds:02}.{millis:03}Z")
}

/// An RFC 3339 timestamp (ProtoJSON's `Timestamp`: `2026-12-01T21:43:21.123Z`,
/// fractional seconds and a `±hh:mm` offset optional) as epoch
/// milliseconds; one before 1970 is 0. `None` when it is not one.
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|byte| byte.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    if bytes.len() < 20 || bytes[4] != b'-' || bytes[7] != b'-' || !matches!(bytes[10], b'T' | b't') {
        return None;
    }
    if bytes[13] != b':' || bytes[16] != b':' {
        return None;
    }
    let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (hours, minutes, seconds) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    let mut at = 19;
    let mut millis = 0i64;
    if bytes[at] == b'.' {
        let start = at + 1;
        let end = start + bytes[start..].iter().take_while(|byte| byte.is_ascii_digit()).count();
        if end == start {
            return None;
        }
        // Milliseconds: the first three digits, padded.
        let fraction: String = text[start..end].chars().chain("00".chars()).take(3).collect();
        millis = fraction.parse().ok()?;
        at = end;
    }
    let offset_minutes = match &text[at..] {
        "Z" | "z" => 0,
        zone if zone.len() == 6 && matches!(zone.as_bytes()[0], b'+' | b'-') && zone.as_bytes()[3] == b':' => {
            let (hours, minutes) = (digits(at + 1..at + 3)?, digits(at + 4..at + 6)?);
            let sign = if zone.starts_with('-') { -1 } else { 1 };
            sign * (hours * 60 + minutes)
        }
        _ => return None,
    };
    let leap = |year: i64| (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let month_days = [
        31,
        if leap(year) { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let valid = (1..=12).contains(&month)
        && day >= 1
        && day <= month_days[usize::try_from(month - 1).ok()?]
        && hours < 24
        && minutes < 60
        && seconds < 61;
    if !valid {
        return None;
    }
    // Howard Hinnant's days_from_civil.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let ms = ((days * 24 + hours) * 60 + minutes - offset_minutes) * 60_000 + seconds * 1000 + millis;
    Some(u64::try_from(ms).unwrap_or(0))
}

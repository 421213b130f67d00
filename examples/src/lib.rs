//! Shared pieces of the frostdb-rs programs: time parsing for the command line and the server,
//! and the server itself ([`server`]).

pub mod server;

/// Percent-encodes a URL query parameter value (everything but unreserved characters).
pub fn url_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub mod time {
    //! Times as users write them.

    pub use frostdb_core::now_ms;

    /// The latest time taken, in Unix ms: the last millisecond of the year 9999. Times are
    /// checked against `0..=MAX_MS` where they enter, so no arithmetic on them can wrap.
    pub const MAX_MS: i64 = 253_402_300_799_999;

    /// `ms` if it is within `0..=`[`MAX_MS`], else an error naming `what`.
    pub fn checked_ms(ms: i64, what: &str) -> Result<i64, String> {
        if (0..=MAX_MS).contains(&ms) {
            Ok(ms)
        } else {
            Err(format!(
                "{what}: {ms} ms is outside the times taken (0 to {MAX_MS}: 1970 to the year 9999)"
            ))
        }
    }

    /// Milliseconds since the Unix epoch from RFC 3339 (`2026-11-22T10:00:00Z`), Unix
    /// milliseconds (`1763805600000`), `now`, or `now-<n><unit>` / `now+<n><unit>` with units
    /// `ms`, `s`, `m`, `h`, `d`, `w`.
    pub fn parse_time(s: &str, now_ms: i64) -> Result<i64, String> {
        let ms = parse_time_unchecked(s.trim(), now_ms)?;
        checked_ms(ms, &format!("{:?}", s.trim()))
    }

    fn parse_time_unchecked(s: &str, now_ms: i64) -> Result<i64, String> {
        if let Ok(ms) = s.parse::<i64>() {
            return Ok(ms);
        }
        if let Some(rest) = s.strip_prefix("now") {
            if rest.is_empty() {
                return Ok(now_ms);
            }
            let (sign, amount) = match rest.split_at(1) {
                ("-", a) => (-1, a),
                ("+", a) => (1, a),
                _ => {
                    return Err(format!(
                        "{s:?}: expected now, now-<duration> or now+<duration>"
                    ));
                }
            };
            let d = parse_duration_ms(amount).map_err(|e| format!("{s:?}: {e}"))?;
            return now_ms
                .checked_add(sign * d)
                .ok_or_else(|| format!("{s:?} is out of range"));
        }
        let t: jiff::Timestamp = s
            .parse()
            .map_err(|e| format!("{s:?} is not RFC 3339, Unix ms or now-<duration>: {e}"))?;
        Ok(t.as_millisecond())
    }

    /// A duration like `15m`, `1h`, `500ms`, `2d` in milliseconds.
    pub fn parse_duration_ms(s: &str) -> Result<i64, String> {
        let digits: String = s.chars().take_while(|c| c.is_ascii_digit()).collect();
        let unit = &s[digits.len()..];
        let n: i64 = digits
            .parse()
            .map_err(|_| format!("{s:?} does not start with a number"))?;
        let factor = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 604_800_000,
            _ => {
                return Err(format!(
                    "unknown duration unit {unit:?} (ms, s, m, h, d, w)"
                ));
            }
        };
        n.checked_mul(factor)
            .ok_or_else(|| format!("{s:?} is too long"))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn parses_the_forms_users_write() {
            let now = 1_700_000_000_000;
            assert_eq!(parse_time("now", now), Ok(now));
            assert_eq!(parse_time("now-1h", now), Ok(now - 3_600_000));
            assert_eq!(parse_time("now+15m", now), Ok(now + 900_000));
            assert_eq!(parse_time("1700000000123", now), Ok(1_700_000_000_123));
            assert_eq!(
                parse_time("2023-11-14T22:13:20Z", now),
                Ok(1_700_000_000_000)
            );
            assert_eq!(
                parse_time("2023-11-14T23:13:20+01:00", now),
                Ok(1_700_000_000_000)
            );
            assert!(parse_time("yesterday", now).is_err());
            assert!(parse_time("now-5x", now).is_err());
            // Out of range, never wrapped.
            for bad in [
                "now+9223372036854775807ms",
                "now-9223372036854775807ms",
                "-9223372036854775808",
                "9223372036854775807",
                "-1",
                "now+8000y",
            ] {
                assert!(parse_time(bad, now).is_err(), "{bad}");
            }
            assert_eq!(parse_time("253402300799999", now), Ok(MAX_MS));
        }
    }
}

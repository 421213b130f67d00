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

    /// Milliseconds since the Unix epoch from RFC 3339 (`2026-11-22T10:00:00Z`), Unix
    /// milliseconds (`1763805600000`), `now`, or `now-<n><unit>` / `now+<n><unit>` with units
    /// `ms`, `s`, `m`, `h`, `d`, `w`.
    pub fn parse_time(s: &str, now_ms: i64) -> Result<i64, String> {
        let s = s.trim();
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
            return Ok(
                now_ms + sign * parse_duration_ms(amount).map_err(|e| format!("{s:?}: {e}"))?
            );
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
        }
    }
}

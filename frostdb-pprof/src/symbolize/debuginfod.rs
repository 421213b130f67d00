//! A debuginfod client: `GET <server>/buildid/<build id>/debuginfo`, as elfutils, gdb and
//! Pyroscope ask, streamed to a file (never held whole), within a byte limit and a timeout.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use super::{Error, Result};

/// The servers of `DEBUGINFOD_URLS` (space-separated, as elfutils reads it).
pub fn urls_from_env() -> Vec<String> {
    std::env::var("DEBUGINFOD_URLS")
        .map(|v| v.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Fetches the file of `build_id` (`kind`: `debuginfo` or `executable`) from `server`
/// into `to`: `Ok(false)` when the
/// server does not have it (404). A file over `max_bytes`, a body cut short, another
/// status or no answer within `timeout` (the whole transfer) is an error.
pub(super) async fn fetch(
    http: &reqwest::Client,
    server: &str,
    build_id: &str,
    kind: &str,
    to: &Path,
    max_bytes: u64,
    timeout: Duration,
) -> Result<bool> {
    let address = format!("{}/buildid/{build_id}/{kind}", server.trim_end_matches('/'));
    // Errors name the address without a password it may carry.
    let url = frostdb_core::redacted_url(&address);
    let transfer = async {
        let mut response = http
            .get(&address)
            .send()
            .await
            .map_err(|e| Error::Fetch(format!("{url}: {e}")))?;
        match response.status() {
            reqwest::StatusCode::NOT_FOUND => return Ok(false),
            s if !s.is_success() => return Err(Error::Fetch(format!("{url}: {s}"))),
            _ => {}
        }
        if let Some(n) = response.content_length()
            && n > max_bytes
        {
            return Err(Error::TooLarge(format!(
                "{url}: {n} bytes, over {max_bytes} (symbolizer max_file_bytes, or the whole cache_bytes)"
            )));
        }
        let mut file = std::fs::File::create(to).map_err(|e| Error::io(to, e))?;
        let mut written = 0u64;
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| Error::Fetch(format!("{url}: {e}")))?
        {
            written += chunk.len() as u64;
            if written > max_bytes {
                return Err(Error::TooLarge(format!(
                    "{url}: over {max_bytes} bytes (symbolizer max_file_bytes, or the whole cache_bytes)"
                )));
            }
            file.write_all(&chunk).map_err(|e| Error::io(to, e))?;
        }
        file.sync_all().map_err(|e| Error::io(to, e))?;
        Ok(true)
    };
    let result = match tokio::time::timeout(timeout, transfer).await {
        Ok(result) => result,
        Err(_) => Err(Error::Fetch(format!(
            "{url}: no whole answer within {timeout:?} (symbolizer fetch_timeout)"
        ))),
    };
    if !matches!(result, Ok(true)) {
        let _ = std::fs::remove_file(to);
    }
    result
}

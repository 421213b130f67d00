//! The on-disk cache of debug files, by build id, with a size limit: the least recently
//! used files are deleted to make room. A file is written under a temporary name and
//! renamed, so a reader never sees half of one, and a crash leaves at most a temporary
//! file, deleted when the cache opens again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::{Error, Result};

/// What the cache did, since it opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Files found in it.
    pub hits: u64,
    /// Files looked for and not in it.
    pub misses: u64,
    /// Files added.
    pub added: u64,
    /// Files deleted to make room.
    pub evictions: u64,
    /// Bytes it holds now.
    pub bytes: u64,
    /// Files it holds now.
    pub files: u64,
}

#[derive(Debug)]
struct Entry {
    bytes: u64,
    /// When it was last used, in the cache's own clock (a counter).
    used: u64,
}

/// Debug files by build id in one directory, at most `limit` bytes of them.
#[derive(Debug)]
pub(super) struct Cache {
    dir: PathBuf,
    limit: u64,
    clock: AtomicU64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    bytes: u64,
    stats: CacheStats,
}

impl Cache {
    /// Opens (creating) the cache in `dir`: the files there count against `limit`,
    /// oldest first used (by modification time) when the cache was last open.
    pub(super) fn open(dir: &Path, limit: u64) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let mut found: Vec<(std::time::SystemTime, String, u64)> = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
            let entry = entry.map_err(|e| Error::io(dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let Some(id) = name.strip_suffix(".debug") else {
                continue;
            };
            let Ok(meta) = entry.metadata() else { continue };
            let modified = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
            found.push((modified, id.to_owned(), meta.len()));
        }
        found.sort();
        let cache = Self {
            dir: dir.to_path_buf(),
            limit,
            clock: AtomicU64::new(0),
            state: Mutex::new(State::default()),
        };
        {
            let mut state = cache.state.lock();
            for (_, id, bytes) in found {
                let used = cache.tick();
                state.bytes += bytes;
                state.entries.insert(id, Entry { bytes, used });
            }
            cache.evict(&mut state, 0);
        }
        Ok(cache)
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    fn path(&self, build_id: &str) -> PathBuf {
        self.dir.join(format!("{build_id}.debug"))
    }

    /// The cached file of `build_id`, if any (now the most recently used).
    pub(super) fn get(&self, build_id: &str) -> Option<PathBuf> {
        let used = self.tick();
        let mut state = self.state.lock();
        match state.entries.get_mut(build_id) {
            Some(entry) => {
                entry.used = used;
                state.stats.hits += 1;
                Some(self.path(build_id))
            }
            None => {
                state.stats.misses += 1;
                None
            }
        }
    }

    /// A temporary path to write `build_id`'s file to, then [`Cache::add`]; deleted when
    /// dropped unless added: a copy cut off (its query's time ran out, its fetch failed)
    /// leaves nothing behind, rather than a file no limit counts until the next start.
    pub(super) fn temporary(&self, build_id: &str) -> Temporary {
        Temporary(self.dir.join(format!("{build_id}.{}.tmp", self.tick())))
    }

    /// Adds the file written at `temporary` as `build_id`'s, deleting the least recently
    /// used files until the cache is within its limit. A file larger than the whole limit
    /// is not kept (an error).
    pub(super) fn add(&self, build_id: &str, temporary: Temporary) -> Result<PathBuf> {
        let temporary = &temporary.0;
        let bytes = std::fs::metadata(temporary)
            .map_err(|e| Error::io(temporary, e))?
            .len();
        if bytes > self.limit {
            let _ = std::fs::remove_file(temporary);
            return Err(Error::TooLarge(format!(
                "the debug file of {build_id} is {bytes} bytes, over the cache's {} \
                 (symbolizer cache_bytes)",
                self.limit
            )));
        }
        let path = self.path(build_id);
        let used = self.tick();
        let mut state = self.state.lock();
        self.evict(&mut state, bytes);
        std::fs::rename(temporary, &path).map_err(|e| Error::io(&path, e))?;
        if let Some(old) = state
            .entries
            .insert(build_id.to_owned(), Entry { bytes, used })
        {
            state.bytes -= old.bytes;
        }
        state.bytes += bytes;
        state.stats.added += 1;
        Ok(path)
    }

    /// Deletes `build_id`'s file, if cached (a better one was uploaded).
    pub(super) fn remove(&self, build_id: &str) {
        let mut state = self.state.lock();
        if let Some(entry) = state.entries.remove(build_id) {
            let _ = std::fs::remove_file(self.path(build_id));
            state.bytes -= entry.bytes;
        }
    }

    /// Deletes the least recently used files until `room` more bytes fit.
    fn evict(&self, state: &mut State, room: u64) {
        while state.bytes + room > self.limit {
            let Some(oldest) = state
                .entries
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(id, _)| id.clone())
            else {
                return;
            };
            let entry = state.entries.remove(&oldest).expect("found above");
            let _ = std::fs::remove_file(self.path(&oldest));
            state.bytes -= entry.bytes;
            state.stats.evictions += 1;
            tracing::debug!(build_id = %oldest, bytes = entry.bytes, "debug file evicted from the cache");
        }
    }

    pub(super) fn stats(&self) -> CacheStats {
        let state = self.state.lock();
        CacheStats {
            bytes: state.bytes,
            files: state.entries.len() as u64,
            ..state.stats
        }
    }
}

/// A file being written into the cache's directory: deleted when dropped, unless
/// [`Cache::add`] renamed it into the cache first.
pub(super) struct Temporary(PathBuf);

impl std::ops::Deref for Temporary {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Temporary {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Temporary {
    fn drop(&mut self) {
        // Renamed away by `add`, or never written: nothing there, and nothing to report.
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(cache: &Cache, id: &str, bytes: usize) -> Result<PathBuf> {
        let t = cache.temporary(id);
        std::fs::write(&t, vec![7u8; bytes]).unwrap();
        cache.add(id, t)
    }

    #[test]
    fn the_least_recently_used_files_make_room_and_the_limit_holds_across_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path(), 100).unwrap();
        write(&cache, "aa01", 40).unwrap();
        write(&cache, "aa02", 40).unwrap();
        assert!(
            cache.get("aa01").is_some(),
            "aa01 is now the most recently used"
        );
        write(&cache, "aa03", 40).unwrap();
        assert!(cache.get("aa02").is_none(), "the least recently used went");
        assert!(cache.get("aa01").is_some());
        assert!(cache.get("aa03").is_some());
        let stats = cache.stats();
        assert_eq!((stats.evictions, stats.files, stats.bytes), (1, 2, 80));
        assert!(!dir.path().join("aa02.debug").exists(), "deleted from disk");
        // Larger than the whole cache: refused, nothing evicted for it.
        assert!(matches!(
            write(&cache, "aa04", 101),
            Err(Error::TooLarge(_))
        ));
        assert_eq!(cache.stats().files, 2);
        // A temporary file a crash left is deleted; a smaller limit evicts on opening.
        std::fs::write(dir.path().join("aa05.9.tmp"), b"half").unwrap();
        drop(cache);
        let cache = Cache::open(dir.path(), 50).unwrap();
        assert_eq!(cache.stats().files, 1);
        assert_eq!(cache.stats().bytes, 40);
        assert!(!dir.path().join("aa05.9.tmp").exists());
    }

    /// A copy cut off before it is added (a query's time ran out mid-copy, a fetch
    /// failed) leaves no file behind; one added is the cache's.
    #[test]
    fn a_temporary_file_not_added_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path(), 1 << 20).unwrap();
        let files = || std::fs::read_dir(dir.path()).unwrap().count();
        let cut = cache.temporary("u1-abcd");
        std::fs::write(&cut, vec![1u8; 1000]).unwrap();
        assert_eq!(files(), 1);
        drop(cut);
        assert_eq!(files(), 0, "the cut copy is gone");
        let path = write(&cache, "u1-abcd", 1000).unwrap();
        assert!(path.is_file());
        assert_eq!(files(), 1);
    }
}

//! One owner per database directory: an exclusive advisory lock (`flock`) on `dir/LOCK`,
//! held for as long as anything can write to the database, released by the kernel when the
//! process exits (kill -9 included). The file holds the owner's process id, for the error a
//! second opener gets.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::error::{Error, Result};

/// The name of the lock file in a database directory.
pub const LOCK_FILE: &str = "LOCK";

/// An exclusive lock on a directory, released on drop.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Locks `dir` (which must exist) for this process, or fails with [`Error::Locked`]
    /// naming the process that holds it. Locking a directory twice fails even within one
    /// process.
    pub fn acquire(dir: &Path) -> Result<Self> {
        let path = dir.join(LOCK_FILE);
        let io = |what: &str| {
            let context = format!("{what} {}", path.display());
            move |source| Error::Io { context, source }
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io("opening"))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                // The holder wrote its pid; an unreadable one is still "someone".
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(Error::Locked {
                    dir: dir.to_path_buf(),
                    holder: if holder.is_empty() {
                        "another process".to_owned()
                    } else {
                        format!("process {holder}")
                    },
                });
            }
            Err(TryLockError::Error(source)) => return Err(io("locking")(source)),
        }
        file.set_len(0).map_err(io("writing"))?;
        file.seek(SeekFrom::Start(0)).map_err(io("writing"))?;
        write!(file, "{}", std::process::id()).map_err(io("writing"))?;
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_fails_naming_the_holder_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        let err = DirLock::acquire(dir.path()).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains(&format!("process {}", std::process::id())),
            "{message}"
        );
        assert!(matches!(err, Error::Locked { .. }));
        drop(first);
        DirLock::acquire(dir.path()).unwrap();
    }
}

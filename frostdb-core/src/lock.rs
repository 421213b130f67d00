//! One writer per database directory: an exclusive advisory lock (`flock`) on `dir/LOCK`,
//! held for as long as anything can write to the database, released by the kernel when the
//! process exits (kill -9 included). The file holds the writer's process id, for the error a
//! second opener gets.
//!
//! Readers ([`Db::open_read_only`](crate::Db::open_read_only)) share the lock instead, without
//! creating or writing the file: any number of them at once, never alongside a writer.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::error::{Error, Result};

/// The name of the lock file in a database directory.
pub const LOCK_FILE: &str = "LOCK";

/// A lock on a directory (exclusive, or shared among readers), released on drop.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

fn io(what: &str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let context = format!("{what} {}", path.display());
    move |source| Error::Io { context, source }
}

/// Who holds the exclusive lock of `file`: the writer whose pid it holds (an unreadable one
/// is still someone).
fn writer(file: &mut File) -> String {
    let mut holder = String::new();
    let _ = file.read_to_string(&mut holder);
    match holder.trim() {
        "" => "another process".to_owned(),
        pid => format!("process {pid}"),
    }
}

impl DirLock {
    /// Locks `dir` (which must exist) for this process, or fails with [`Error::Locked`]
    /// naming the process that holds it, or saying that readers do. Locking a directory twice
    /// fails even within one process.
    pub fn acquire(dir: &Path) -> Result<Self> {
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io("opening", &path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                // The file names the last writer, who may be gone: when a shared lock can be
                // had, the holders are readers.
                let holder = match file.try_lock_shared() {
                    Ok(()) => {
                        let _ = file.unlock();
                        "one or more read-only opens".to_owned()
                    }
                    Err(_) => writer(&mut file),
                };
                return Err(Error::Locked {
                    dir: dir.to_path_buf(),
                    holder,
                });
            }
            Err(TryLockError::Error(source)) => return Err(io("locking", &path)(source)),
        }
        file.set_len(0).map_err(io("writing", &path))?;
        file.seek(SeekFrom::Start(0))
            .map_err(io("writing", &path))?;
        write!(file, "{}", std::process::id()).map_err(io("writing", &path))?;
        Ok(Self { _file: file })
    }

    /// Shares the lock of `dir` with other readers, or fails with [`Error::Locked`] naming
    /// the writer that holds it. Neither creates nor writes the lock file: `Ok(None)` when
    /// there is none, since then no writer has ever opened the directory.
    pub fn acquire_shared(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(LOCK_FILE);
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(io("opening", &path)(source)),
        };
        match file.try_lock_shared() {
            Ok(()) => Ok(Some(Self { _file: file })),
            Err(TryLockError::WouldBlock) => Err(Error::Locked {
                dir: dir.to_path_buf(),
                holder: writer(&mut file),
            }),
            Err(TryLockError::Error(source)) => Err(io("locking", &path)(source)),
        }
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

    #[test]
    fn readers_share_the_lock_and_exclude_the_writer_who_excludes_them() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            DirLock::acquire_shared(dir.path()).unwrap().is_none(),
            "no lock file: no writer ever opened it"
        );
        assert!(
            !dir.path().join(LOCK_FILE).exists(),
            "a reader creates nothing"
        );

        let writer = DirLock::acquire(dir.path()).unwrap();
        let err = DirLock::acquire_shared(dir.path()).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("process {}", std::process::id())),
            "{err}"
        );
        drop(writer);

        let readers = [
            DirLock::acquire_shared(dir.path()).unwrap().unwrap(),
            DirLock::acquire_shared(dir.path()).unwrap().unwrap(),
        ];
        let err = DirLock::acquire(dir.path()).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("read-only opens"), "{message}");
        assert!(
            !message.contains("process"),
            "not the last writer's pid: {message}"
        );
        drop(readers);
        DirLock::acquire(dir.path()).unwrap();
    }
}

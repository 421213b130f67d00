//! The local file layer under the WAL, the manifest and the directory lock: [`OsFs`] (the
//! operating system's files) by default, or any [`FileSystem`] given in
//! [`DbOptions::file_system`](crate::DbOptions::file_system), such as one that injects faults
//! (lost unsynced writes at a simulated crash, torn writes, a full disk) under the model test.
//!
//! Only what the engine needs: whole-file reads, append-only files it syncs, truncation,
//! rename, removal, directory syncs and the directory's lock (exclusive for a writer, shared
//! among readers). Persisted blocks go through `object_store` instead.

use std::fmt;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::error::Result;
use crate::lock::DirLock;

/// A file being written: appended to, synced, cut back.
pub trait WritableFile: Send + Sync {
    /// Appends `buf` whole, or fails (and may have written a prefix of it).
    fn write_all(&self, buf: &[u8]) -> io::Result<()>;
    /// Makes the file's data durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
    /// Cuts the file to `len` bytes; the next write goes at `len`.
    fn set_len(&self, len: u64) -> io::Result<()>;
}

/// The local file operations of a database (see the module docs).
pub trait FileSystem: Send + Sync + fmt::Debug {
    /// Creates `dir` and its parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Names of the files in `dir` (`NotFound` when it does not exist).
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// A whole file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// A file to read from the start, and its length.
    fn open_read(&self, path: &Path) -> io::Result<(Box<dyn Read + Send>, u64)>;
    /// Creates (or empties) a file for writing.
    fn create(&self, path: &Path) -> io::Result<Box<dyn WritableFile>>;
    /// Makes an existing file's data durable.
    fn sync_file(&self, path: &Path) -> io::Result<()>;
    /// Cuts an existing file to `len` bytes and syncs it.
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()>;
    /// A file's length.
    fn len(&self, path: &Path) -> io::Result<u64>;
    /// Replaces `to` with `from`, atomically.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Deletes a file.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Makes `dir`'s entries (files created, renamed, removed) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Takes the exclusive lock of the database in `dir` for as long as the guard lives, or
    /// fails with [`Error::Locked`](crate::Error::Locked) naming the holder.
    fn lock(&self, dir: &Path) -> Result<Box<dyn Send + Sync>>;
    /// Shares the lock of the database in `dir` with other readers for as long as the guard
    /// lives, or fails with [`Error::Locked`](crate::Error::Locked) naming the writer holding
    /// it; `None` when no writer ever locked `dir`. Creates and writes nothing. The default
    /// is the operating system's shared `flock` ([`DirLock::acquire_shared`]), which is right
    /// for a file system over the real one.
    fn lock_shared(&self, dir: &Path) -> Result<Option<Box<dyn Send + Sync>>> {
        Ok(DirLock::acquire_shared(dir)?.map(|l| Box::new(l) as Box<dyn Send + Sync>))
    }
}

/// The operating system's files.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsFs;

impl WritableFile for std::fs::File {
    fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        (&mut &*self).write_all(buf)
    }

    fn sync_data(&self) -> io::Result<()> {
        std::fs::File::sync_data(self)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        std::fs::File::set_len(self, len)?;
        (&mut &*self).seek(SeekFrom::Start(len)).map(|_| ())
    }
}

impl FileSystem for OsFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            if let Ok(name) = entry?.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn open_read(&self, path: &Path) -> io::Result<(Box<dyn Read + Send>, u64)> {
        let file = std::fs::File::open(path)?;
        let len = file.metadata()?.len();
        Ok((Box::new(io::BufReader::new(file)), len))
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn WritableFile>> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(path)?;
        Ok(Box::new(file))
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        std::fs::File::open(path)?.sync_data()
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let file = std::fs::OpenOptions::new().write(true).open(path)?;
        file.set_len(len)?;
        file.sync_all()
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        Ok(std::fs::metadata(path)?.len())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        std::fs::File::open(dir)?.sync_all()
    }

    fn lock(&self, dir: &Path) -> Result<Box<dyn Send + Sync>> {
        Ok(Box::new(DirLock::acquire(dir)?))
    }
}

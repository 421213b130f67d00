//! The writer's lease of a database shared through a bucket: `<prefix>/lease.json`, replaced
//! only by conditional puts, says which process writes the database and until when.
//!
//! The lease decides who *should* write; it is not what keeps two writers apart. That is the
//! fencing the lease's epoch starts (see `Db::open_shared`): the new writer stamps the
//! manifest with its epoch (a conditional put, so the old writer's next manifest update
//! fails) and creates the next WAL object itself (so the old writer's next WAL object, whose
//! name it takes, fails), after reading every WAL object there is. Nothing the old writer
//! acknowledged is lost, and nothing it tries after that is acknowledged, whatever the
//! clocks say. Clocks only decide when a silent writer's lease may be taken: a lease runs
//! `ttl` from its last renewal by the writer's clock, judged by the taker's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, UpdateVersion};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::io::Io;

const FILE_NAME: &str = "lease.json";

/// The lease object's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    /// The writer, as it names itself (`DbOptions::shared`'s holder).
    holder: String,
    /// Increases with every change of writer: the fencing token.
    epoch: u64,
    /// When the lease runs out (ms since the Unix epoch, by the holder's clock).
    expires_ms: i64,
}

/// A lease held by this process.
pub(crate) struct Lease {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    prefix: String,
    io: Io,
    holder: String,
    ttl: Duration,
    epoch: u64,
    /// The lease object's version as this holder last wrote it.
    version: Mutex<UpdateVersion>,
    /// Set when a renewal found the lease taken: nothing more may be written.
    lost: AtomicBool,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("path", &self.path)
            .field("holder", &self.holder)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

fn store_err(context: String) -> impl FnOnce(object_store::Error) -> Error {
    move |source| Error::ObjectStore { context, source }
}

fn version_of(result: &object_store::PutResult) -> UpdateVersion {
    UpdateVersion {
        e_tag: result.e_tag.clone(),
        version: result.version.clone(),
    }
}

impl Lease {
    /// Takes the lease of the database at `prefix` for `holder`: a new lease when there is
    /// none, the lease when `holder` already has it (a restart) or when it ran out, and
    /// [`Error::LeaseHeld`] while another holder's runs.
    pub(crate) fn acquire(
        store: Arc<dyn ObjectStore>,
        prefix: &ObjectPath,
        io: Io,
        holder: &str,
        ttl: Duration,
    ) -> Result<Arc<Self>> {
        let path = prefix.clone().join(FILE_NAME);
        let shown = path.to_string();
        // Two takers racing: the loser sees the winner's lease on its next look.
        for _ in 0..3 {
            let (s, p) = (store.clone(), path.clone());
            let current = io.run(async move {
                match s.get(&p).await {
                    Ok(got) => {
                        let version = UpdateVersion {
                            e_tag: got.meta.e_tag.clone(),
                            version: got.meta.version.clone(),
                        };
                        crate::io::bytes_within(got, "lease", crate::io::MAX_LEASE_BYTES)
                            .await
                            .map(|b| Some((b, version)))
                    }
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(e),
                }
            })?;
            let current = current.map_err(store_err(format!("reading lease {shown}")))?;
            let now = crate::now_ms();
            let (epoch, mode) = match current {
                None => (1, PutMode::Create),
                Some((bytes, version)) => {
                    let record: Record =
                        serde_json::from_slice(&bytes).map_err(|e| Error::Manifest {
                            path: shown.clone(),
                            reason: format!("not a valid lease: {e}"),
                        })?;
                    if record.holder != holder && record.expires_ms > now {
                        return Err(Error::LeaseHeld {
                            prefix: prefix.to_string(),
                            holder: record.holder,
                            expires_in_ms: record.expires_ms - now,
                        });
                    }
                    (record.epoch + 1, PutMode::Update(version))
                }
            };
            let record = Record {
                holder: holder.to_owned(),
                epoch,
                expires_ms: now + ttl.as_millis() as i64,
            };
            let payload = serde_json::to_vec(&record)?;
            let (s, p) = (store.clone(), path.clone());
            let put = io
                .run(async move { s.put_opts(&p, payload.into(), PutOptions::from(mode)).await })?;
            match put {
                Ok(result) => {
                    tracing::info!(lease = %shown, holder, epoch, "lease taken");
                    return Ok(Arc::new(Self {
                        store,
                        path,
                        prefix: prefix.to_string(),
                        io,
                        holder: holder.to_owned(),
                        ttl,
                        epoch,
                        version: Mutex::new(version_of(&result)),
                        lost: AtomicBool::new(false),
                    }));
                }
                Err(
                    object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. },
                ) => continue,
                Err(e) => return Err(store_err(format!("writing lease {shown}"))(e)),
            }
        }
        Err(Error::Fenced {
            prefix: prefix.to_string(),
            reason: format!("lease {shown}: other writers keep taking it; retry later"),
        })
    }

    /// The fencing token: greater than every earlier writer's.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    pub(crate) fn holder(&self) -> &str {
        &self.holder
    }

    /// Whether a renewal found the lease taken.
    pub(crate) fn lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Extends the lease by its ttl from now. [`Error::Fenced`] when another writer took it
    /// (the lease is then lost for good).
    pub(crate) async fn renew(&self) -> Result<()> {
        if self.lost() {
            return Err(self.fenced("the lease was taken"));
        }
        let record = Record {
            holder: self.holder.clone(),
            epoch: self.epoch,
            expires_ms: crate::now_ms() + self.ttl.as_millis() as i64,
        };
        let payload = serde_json::to_vec(&record)?;
        let version = self.version.lock().clone();
        match self
            .store
            .put_opts(
                &self.path,
                payload.into(),
                PutOptions::from(PutMode::Update(version)),
            )
            .await
        {
            Ok(result) => {
                *self.version.lock() = version_of(&result);
                Ok(())
            }
            Err(
                object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. },
            ) => {
                self.lost.store(true, Ordering::Release);
                Err(self.fenced("another writer took the lease"))
            }
            Err(e) => Err(store_err(format!("renewing lease {}", self.path))(e)),
        }
    }

    /// Gives the lease up (it runs out now), so the next writer need not wait for its ttl.
    pub(crate) fn release(&self) -> Result<()> {
        if self.lost() {
            return Ok(());
        }
        let record = Record {
            holder: self.holder.clone(),
            epoch: self.epoch,
            expires_ms: 0,
        };
        let payload = serde_json::to_vec(&record)?;
        let (store, path) = (self.store.clone(), self.path.clone());
        let version = self.version.lock().clone();
        let put = self.io.run(async move {
            store
                .put_opts(
                    &path,
                    payload.into(),
                    PutOptions::from(PutMode::Update(version)),
                )
                .await
        })?;
        self.lost.store(true, Ordering::Release);
        match put {
            Ok(_) | Err(object_store::Error::Precondition { .. }) => Ok(()),
            Err(e) => Err(store_err(format!("releasing lease {}", self.path))(e)),
        }
    }

    pub(crate) fn fenced(&self, reason: &str) -> Error {
        Error::Fenced {
            prefix: self.prefix.clone(),
            reason: reason.to_owned(),
        }
    }

    /// Renews the lease every third of its ttl on the I/O runtime, for as long as `alive`
    /// returns true; when a renewal finds the lease taken, calls `lost` once and stops.
    pub(crate) fn keep(
        self: &Arc<Self>,
        alive: impl Fn() -> bool + Send + 'static,
        lost: impl FnOnce(Error) + Send + 'static,
    ) {
        let lease = Arc::downgrade(self);
        let every = self.ttl / 3;
        self.io.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(held) = lease.upgrade() else { return };
                if !alive() || held.lost() {
                    return;
                }
                match held.renew().await {
                    Ok(()) => {}
                    Err(error @ Error::Fenced { .. }) => {
                        tracing::error!(%error, holder = %held.holder, "lease lost: this writer stops");
                        lost(error);
                        return;
                    }
                    // A failed renewal is retried; past the ttl another writer may take
                    // over, and the fencing stops this one then.
                    Err(error) => tracing::warn!(%error, "renewing the lease failed; retrying"),
                }
            }
        });
    }
}

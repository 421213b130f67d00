//! Frames stored as addresses named off the ingest path, and the names kept.
//!
//! Ingest never waits on a symbolizer: a group commit that stored locations without lines
//! only queues its partition and wakes the store's resolver ([`ProfileStore::name_pending`],
//! which the embedder runs as a background task: the server runs one per open tenant).
//! A query that reaches such frames first names them itself within its budget
//! ([`ProfileStore::name_merged`]). Either way the names go into the partition (every report
//! shows them from then on) and into the names table ([`crate::schema::SYMBOL_NAMES`]), so
//! a partition read back after eviction or a restart has them, and nothing is resolved
//! twice. Debug info uploaded for a build id later ([`ProfileStore::name_again`]) names its
//! locations again where the first names came from a symbol table only.

use arrow::array::RecordBatch;
use tokio::sync::Notify;

use super::*;
use crate::debuginfo::DebugInfoStore;
use crate::symbolize::{ProfileSymbolized, Symbolizer, Wants, want_location};

/// A store's naming: the symbolizer attached, and what waits for it.
#[derive(Default)]
pub(super) struct Naming {
    attached: std::sync::OnceLock<Attached>,
    queue: Mutex<Queue>,
    wake: Arc<Notify>,
}

struct Attached {
    symbolizer: Arc<Symbolizer>,
    uploads: Option<DebugInfoStore>,
}

#[derive(Default)]
struct Queue {
    /// Partitions that stored locations without lines the resolver has not looked at.
    partitions: Vec<Arc<Partition>>,
    /// Build ids whose debug info was uploaded since: their locations are named again.
    again: Vec<String>,
}

/// What a pass of the background resolver did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamingSummary {
    /// Its symbolizer's account: locations looked for, named, build ids nobody had.
    pub symbolized: ProfileSymbolized,
    /// Names written to the names table.
    pub stored: usize,
}

/// Most locations a pass of the background resolver takes on; the rest wait for the next.
const PASS_LOCATIONS: usize = 1 << 20;

impl Drop for Naming {
    /// Wakes the background resolver to see the store is gone.
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

impl Naming {
    /// A group of `p`'s rows was committed: if it stored locations the resolver has not
    /// seen, queue `p` and wake the resolver. No waiting, no network: ingest's cost is a
    /// few atomic reads when nothing is unnamed.
    pub(super) fn committed(&self, p: &Arc<Partition>) {
        if self.attached.get().is_none()
            || p.unnamed_locations() == 0
            || p.resolver_cursor.load(std::sync::atomic::Ordering::Relaxed) >= p.counts().locations
        {
            return;
        }
        {
            let mut queue = self.queue.lock();
            if !queue.partitions.iter().any(|q| q.id() == p.id()) {
                queue.partitions.push(p.clone());
            }
        }
        self.wake.notify_one();
    }
}

impl ProfileStore {
    /// Names frames this store keeps as addresses with `symbolizer`, debug info uploaded to
    /// the store's object store (`uploads`) asked first: queries name what they reach
    /// ([`ProfileStore::name_merged`]), and [`ProfileStore::name_pending`] names the rest in
    /// the background. Returns false, changing nothing, when one is attached already.
    pub fn attach_symbolizer(
        &self,
        symbolizer: Arc<Symbolizer>,
        uploads: Option<DebugInfoStore>,
    ) -> bool {
        let attached = self
            .naming
            .attached
            .set(Attached {
                symbolizer,
                uploads,
            })
            .is_ok();
        if attached {
            // What the store holds already (recovered from its WAL): named in the background.
            self.naming.committed(&self.symbols.current());
        }
        attached
    }

    /// Woken when [`ProfileStore::name_pending`] has work: a background resolver waits on
    /// it (holding this, not the store).
    pub fn naming_wake(&self) -> Arc<Notify> {
        self.naming.wake.clone()
    }

    /// Names what ingest queued since the last pass (locations stored without lines, of
    /// build ids the symbolizer finds), and again the locations of build ids whose debug
    /// info was uploaded since; stores the names. Not bounded by a query's budget: each
    /// fetch by [`crate::symbolize::SymbolizerOptions::fetch_timeout`], the files read at
    /// once by its workers. Nothing to do without a symbolizer attached.
    pub async fn name_pending(&self) -> Result<NamingSummary> {
        let Some(attached) = self.naming.attached.get() else {
            return Ok(NamingSummary::default());
        };
        let (partitions, again) = {
            let mut queue = self.naming.queue.lock();
            (
                std::mem::take(&mut queue.partitions),
                std::mem::take(&mut queue.again),
            )
        };
        let mut summary = NamingSummary::default();
        let mut wanted: Wants<(u32, u32)> = Wants::default();
        let mut looked_at = 0;
        let mut held = partitions;
        // Where each queued partition's walk began, to begin there again if this pass
        // cannot finish (the memory budget refused a file).
        let mut began = Vec::with_capacity(held.len());
        for p in &held {
            let from = p.resolver_cursor.load(std::sync::atomic::Ordering::Relaxed);
            began.push(from);
            let to = p
                .counts()
                .locations
                .min(from + PASS_LOCATIONS.saturating_sub(looked_at));
            for l in from..to {
                if want_location(&mut wanted, p, l as u32, None) {
                    summary.symbolized.unsymbolized += 1;
                }
            }
            looked_at += to - from;
            p.resolver_cursor
                .store(to, std::sync::atomic::Ordering::Relaxed);
            if to < p.counts().locations {
                // The rest next pass.
                self.naming.committed(p);
            }
        }
        if !again.is_empty() {
            // Reading partitions in and walking them is blocking work: off the async
            // thread, which serves requests meanwhile. An error gives the build ids back
            // to the queue, for the next pass, rather than dropping them.
            let found = crate::symbolize::off_the_async_thread(|| {
                self.again_wanted(&again, &mut held, &mut wanted)
            });
            match found {
                Ok(n) => summary.symbolized.unsymbolized += n,
                Err(e) => {
                    let mut queue = self.naming.queue.lock();
                    for build_id in again {
                        if !queue.again.contains(&build_id) {
                            queue.again.push(build_id);
                        }
                    }
                    return Err(e);
                }
            }
        }
        if wanted.is_empty() {
            return Ok(summary);
        }
        // No query waits on this: the fetch timeout bounds each file, not a budget.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(365 * 86_400);
        attached
            .symbolizer
            .name_wanted(
                wanted.into_list(),
                |id| held.iter().find(|p| p.id() == id).map(|p| &**p),
                attached.uploads.as_ref(),
                deadline,
                Some(crate::symbolize::Reread {
                    by: std::sync::Arc::as_ptr(&self.naming.wake) as u64,
                    every: crate::symbolize::BACKGROUND_REREAD,
                }),
                self.options.memory_budget.as_ref(),
                &mut summary.symbolized,
            )
            .await;
        summary.stored = self.store_names(&held, &summary.symbolized.named).await?;
        if summary.symbolized.out_of_budget {
            // Walked again by the pass the next commit or upload wakes (queries name what
            // they reach meanwhile).
            let mut queue = self.naming.queue.lock();
            for (p, from) in held.iter().zip(began) {
                p.resolver_cursor
                    .store(from, std::sync::atomic::Ordering::Relaxed);
                if !queue.partitions.iter().any(|q| q.id() == p.id()) {
                    queue.partitions.push(p.clone());
                }
            }
            for build_id in again {
                if !queue.again.contains(&build_id) {
                    queue.again.push(build_id);
                }
            }
        }
        let symbolized = &summary.symbolized;
        if symbolized.resolved > 0
            || !symbolized.missing.is_empty()
            || !symbolized.too_large.is_empty()
        {
            tracing::info!(
                unsymbolized = symbolized.unsymbolized,
                resolved = symbolized.resolved,
                missing = ?symbolized.missing,
                too_large = ?symbolized.too_large,
                stored = summary.stored,
                "named frames stored as addresses, in the background"
            );
        }
        Ok(summary)
    }

    /// Names the frames of `merged` stored as addresses within `budget` (see
    /// [`Symbolizer::symbolize_merged`]) and stores the names, so no later query resolves
    /// them again, whichever partition stays loaded. Nothing to do without a symbolizer
    /// attached.
    pub async fn name_merged(
        &self,
        merged: &Merged,
        budget: Duration,
    ) -> Result<ProfileSymbolized> {
        let Some(attached) = self.naming.attached.get() else {
            return Ok(ProfileSymbolized::default());
        };
        let summary = attached
            .symbolizer
            .symbolize_merged(
                merged,
                attached.uploads.as_ref(),
                budget,
                self.options.memory_budget.as_ref(),
            )
            .await;
        let held: Vec<Arc<Partition>> = merged.symbols.partition_arcs().collect();
        self.store_names(&held, &summary.named).await?;
        Ok(summary)
    }

    /// Debug info was uploaded for `build_id` to this store's uploads: the symbolizer
    /// forgets their miss and cached file, and the next [`ProfileStore::name_pending`]
    /// names the locations of that build id again, in every partition that has it (in
    /// memory or stored), where they are still addresses or were named from a symbol table
    /// only.
    pub fn name_again(&self, build_id: &str) {
        let Some(attached) = self.naming.attached.get() else {
            return;
        };
        if let Some(uploads) = &attached.uploads {
            attached.symbolizer.forget(build_id, uploads);
        }
        {
            let mut queue = self.naming.queue.lock();
            let build_id = build_id.to_ascii_lowercase();
            if !queue.again.contains(&build_id) {
                queue.again.push(build_id);
            }
        }
        self.naming.wake.notify_one();
    }

    /// The stored symbol partitions with a mapping of `build_id` (from the mappings
    /// table: its rows' ids carry their partition).
    /// Wants every location (in `held`, or read into it) of the build ids `again` whose
    /// debug info came since it was named: the partitions in memory and those whose
    /// mappings name one of them, each location looked at once; how many are wanted.
    fn again_wanted(
        &self,
        again: &[String],
        held: &mut Vec<Arc<crate::symbols::Partition>>,
        wanted: &mut Wants<(u32, u32)>,
    ) -> Result<usize> {
        let mut ids: std::collections::BTreeSet<u32> =
            self.symbols.loaded().iter().map(|p| p.id()).collect();
        ids.extend(self.partitions_of_build_ids(again)?);
        let again: std::collections::HashSet<String> =
            again.iter().map(|b| b.to_ascii_lowercase()).collect();
        let mut count = 0;
        for id in ids {
            let p = match held.iter().find(|h| h.id() == id) {
                Some(p) => p.clone(),
                None => self.symbols.partition(id)?,
            };
            for l in 0..p.counts().locations as u32 {
                if want_location(wanted, &p, l, Some(&again)) {
                    count += 1;
                }
            }
            if !held.iter().any(|h| h.id() == p.id()) {
                held.push(p);
            }
        }
        Ok(count)
    }

    /// The partitions whose mappings name any of `build_ids`, from one scan.
    fn partitions_of_build_ids(&self, build_ids: &[String]) -> Result<Vec<u32>> {
        let request = frostdb_core::ScanRequest::new()
            .filter(frostdb_core::col("build_id").in_list(build_ids.iter().map(String::as_str)))
            .project(["mapping_id"]);
        let mut ids = Vec::new();
        for batch in self.symbols.tables().mappings.scan(&request)? {
            let Some(column) = batch.column_by_name("mapping_id") else {
                continue;
            };
            let column = arrow::array::AsArray::as_primitive::<arrow::datatypes::UInt64Type>(
                column.as_ref(),
            );
            ids.extend(column.values().iter().map(|&id| split_id(id).0));
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    /// Writes the names of `named` (partition, location), found in `partitions`, to the
    /// names table in one transaction; returns how many. A reader keeps them in memory
    /// only (its writer's queries store their own).
    async fn store_names(
        &self,
        partitions: &[Arc<Partition>],
        named: &[(u32, u32)],
    ) -> Result<usize> {
        let Some(table) = self.symbols.tables().names.clone() else {
            return Ok(0);
        };
        if named.is_empty() || self.db.is_read_only() {
            return Ok(0);
        }
        let mut by_partition: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for &(p, l) in named {
            by_partition.entry(p).or_default().push(l);
        }
        let mut batches = Vec::new();
        for (id, locations) in by_partition {
            let Some(p) = partitions.iter().find(|p| p.id() == id) else {
                continue;
            };
            if let Some(batch) = self.symbols.tables().names_batch(p, &locations)? {
                batches.push(batch);
            }
        }
        let rows = batches.iter().map(RecordBatch::num_rows).sum();
        let db = self.db.clone();
        // The fsync off the async threads.
        tokio::task::spawn_blocking(move || {
            let mut tx = db.transaction();
            for batch in &batches {
                tx.insert(&table, batch)?;
            }
            tx.commit()?;
            Ok::<_, Error>(())
        })
        .await
        .map_err(|e| Error::Unavailable(format!("storing symbol names: {e}")))??;
        Ok(rows)
    }
}

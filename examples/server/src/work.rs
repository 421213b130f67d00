//! Where heavy work runs: never on the async threads that accept connections and answer
//! the health route, and never more of it at once than a lane allows.
//!
//! - [`Lane::blocking`] runs a closure on a blocking thread once one of the lane's slots is
//!   free (merges, reports, series reads; decoding and storing profiles). A request finding
//!   the lane's queue full is answered 503 with `Retry-After` at once.
//! - [`Work::query`] runs an async DataFusion job (SQL, the scans of lenient reads) on the
//!   query runtime, threads of its own, within the query lane.
//!
//! Either way the work gets a [`Cancel`], set when the request is dropped (its deadline
//! passed, or the client left): a DataFusion plan made [`frostdb_query::cancellable`] stops
//! at its next batch, and an async job is aborted as well. A slot is held until the work
//! really ends, so a lane bounds the work running, not just the requests waiting on it.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use frostdb_query::Cancel;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::{ApiError, ApiResult};

tokio::task_local! {
    /// The tenant a request acts for, set around its handling ([`crate::authorize`]): what
    /// a lane counts each tenant's share by.
    pub static TENANT: Arc<str>;
}

/// Each tenant's jobs in a lane.
type Held = Arc<parking_lot::Mutex<std::collections::HashMap<Arc<str>, TenantJobs>>>;

/// A tenant's jobs in a lane: how many run or wait, and the slots it may run in at once.
#[derive(Debug)]
struct TenantJobs {
    held: usize,
    running: Arc<Semaphore>,
}

/// A slot of a lane, its tenant's running place and its place in its tenant's share, all
/// given back when dropped.
struct Slot {
    _permit: OwnedSemaphorePermit,
    _running: Option<OwnedSemaphorePermit>,
    _share: Option<Share>,
}

/// A tenant's job counted in a lane until dropped.
struct Share {
    held: Held,
    tenant: Arc<str>,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut held = self.held.lock();
        if let Some(jobs) = held.get_mut(&self.tenant) {
            jobs.held -= 1;
            if jobs.held == 0 {
                held.remove(&self.tenant);
            }
        }
    }
}

/// Runs `f`, CPU work met while a request is polled (a selector's regexes, a large gRPC
/// message), without holding up the thread: on a worker of a multi-thread runtime, that
/// worker's other tasks move to another thread meanwhile ([`tokio::task::block_in_place`]).
/// Elsewhere (a plain thread, a test's runtime) it runs as it is.
pub(crate) use frostdb_pprof::symbolize::off_the_async_thread;

/// Runs `work` as a task of a runtime of one worker thread, handing it `wait`: a call that
/// lets a task spawned after it run, and says whether that task ran within 30 s. Work that
/// leaves the async thread ([`off_the_async_thread`]) sees it run; work on the worker
/// itself waits the 30 s out and sees `false`. For tests of work done while a request is
/// polled.
#[cfg(test)]
pub(crate) fn others_run_meanwhile<T: Send + 'static>(
    work: impl FnOnce(Box<dyn FnOnce() -> bool + Send>) -> T + Send + 'static,
) -> T {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
    let wait = Box::new(move || {
        let _ = started_tx.send(());
        rx.recv_timeout(std::time::Duration::from_secs(30)).is_ok()
    });
    let job = runtime.spawn(async move { work(wait) });
    let other = runtime.spawn(async move {
        if started.await.is_ok() {
            let _ = tx.send(());
        }
    });
    runtime.block_on(async {
        let out = job.await.unwrap();
        other.await.unwrap();
        out
    })
}

/// Work that may run at once in one lane, and requests that may wait for it.
#[derive(Debug)]
pub struct Lane {
    name: &'static str,
    /// The config key that sets `slots`, for messages.
    key: &'static str,
    slots: usize,
    permits: Arc<Semaphore>,
    waiting: AtomicUsize,
    max_waiting: usize,
    /// Each tenant's jobs here, running and waiting: at most `max_tenant` each, so that
    /// one tenant's slow queries never take every place in the queue; and at most
    /// `max_tenant_running` of them running, so that they never take every slot either
    /// (another tenant's query waited for the first of them to end, up to the deadline).
    held: Held,
    max_tenant: usize,
    max_tenant_running: usize,
    /// Jobs waiting for one of their tenant's running slots.
    waiting_for_tenant: AtomicUsize,
    /// Whether the engine's scans a job starts stop once its request ended (reads); a
    /// write's job runs to its end or fails whole on its own.
    stops_reads: bool,
}

impl Lane {
    /// A lane running at most `slots` jobs, with at most `max_waiting` requests queued.
    pub fn new(name: &'static str, key: &'static str, slots: usize, max_waiting: usize) -> Self {
        let slots = slots.max(1);
        Self {
            name,
            key,
            slots,
            permits: Arc::new(Semaphore::new(slots)),
            waiting: AtomicUsize::new(0),
            max_waiting,
            held: Held::default(),
            max_tenant: ((slots + max_waiting) * 3 / 4).max(1),
            max_tenant_running: Self::tenant_slots(slots),
            waiting_for_tenant: AtomicUsize::new(0),
            stops_reads: false,
        }
    }

    /// This lane, its jobs' scans stopping at their next batch once the request ended
    /// ([`frostdb_core::stop_scans_when`]): a merge for nobody gives its slot back.
    fn stopping_reads(self) -> Self {
        Self {
            stops_reads: true,
            ..self
        }
    }

    /// The slots of a lane of `slots` one tenant may run in at once: all but one, kept for
    /// the other tenants, from three on (with fewer, a lone tenant would lose half its
    /// lane to a reserve).
    pub fn tenant_slots(slots: usize) -> usize {
        match slots {
            0..3 => slots.max(1),
            _ => slots - 1,
        }
    }

    /// The lane's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The config key that sets its slots.
    pub fn key(&self) -> &'static str {
        self.key
    }

    /// Jobs it runs at once.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Jobs running now.
    pub fn running(&self) -> usize {
        self.slots - self.permits.available_permits()
    }

    /// Jobs waiting now: for a slot, or for one of their tenant's.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire) + self.waiting_for_tenant.load(Ordering::Acquire)
    }

    /// A slot, once free and once the request's tenant runs fewer jobs here than it may
    /// ([`Lane::tenant_slots`]); 503 when the queue is full, 429 when the tenant holds its
    /// share of the lane already (three quarters of its slots and queue).
    async fn slot(&self) -> ApiResult<Slot> {
        let (share, running) = match TENANT.try_with(Arc::clone) {
            Ok(tenant) => {
                let running = {
                    let mut held = self.held.lock();
                    let jobs = held.entry(tenant.clone()).or_insert_with(|| TenantJobs {
                        held: 0,
                        running: Arc::new(Semaphore::new(self.max_tenant_running)),
                    });
                    if jobs.held >= self.max_tenant {
                        return Err(ApiError::limited(format!(
                            "tenant {tenant:?} has {} {} jobs running or waiting, its share of the {} slots ({}) and {} places in the queue; retry shortly",
                            jobs.held, self.name, self.slots, self.key, self.max_waiting
                        )));
                    }
                    jobs.held += 1;
                    jobs.running.clone()
                };
                let share = Share {
                    held: self.held.clone(),
                    tenant,
                };
                // Its jobs past its running slots wait for one of its own, not in the
                // lane's queue for a slot another tenant's would take.
                let running = {
                    self.waiting_for_tenant.fetch_add(1, Ordering::AcqRel);
                    let _left = Waiting(&self.waiting_for_tenant);
                    running
                        .acquire_owned()
                        .await
                        .map_err(|_| ApiError::busy("the server is shutting down", 5))?
                };
                (Some(share), Some(running))
            }
            Err(_) => (None, None),
        };
        let permit = self.permit().await?;
        Ok(Slot {
            _permit: permit,
            _running: running,
            _share: share,
        })
    }

    /// A permit of the lane, once free; 503 when the queue is full.
    async fn permit(&self) -> ApiResult<OwnedSemaphorePermit> {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Ok(permit);
        }
        let queued = self.waiting.fetch_add(1, Ordering::AcqRel);
        let _left = Waiting(&self.waiting);
        if queued >= self.max_waiting {
            return Err(ApiError::busy(
                format!(
                    "the server is busy: {} {} jobs run ({}) and {queued} wait; retry shortly",
                    self.slots, self.name, self.key
                ),
                1,
            ));
        }
        self.permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ApiError::busy("the server is shutting down", 5))
    }

    /// Runs `f` on a blocking thread once a slot is free. `f`'s [`Cancel`] is set when this
    /// future is dropped before `f` ends.
    pub async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Cancel) -> ApiResult<T> + Send + 'static,
    ) -> ApiResult<T> {
        let slot = self.slot().await?;
        let cancel = Cancel::new();
        let _cancel_on_drop = CancelOnDrop(cancel.clone());
        let name = self.name;
        let stops_reads = self.stops_reads;
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            if !stops_reads {
                return f(&cancel);
            }
            until_cancelled(&cancel, || f(&cancel))
        })
        .await
        .map_err(|e| ApiError::job_failed(format_args!("a {name} job"), e))?
    }
}

/// Runs `f` with every scan it starts, and every decode ([`frostdb_pprof::charging`]'s
/// converters), stopping once `cancel` is set: work for a request that has ended ends too.
/// Only around work that may stop anywhere: not around storing, which is whole or nothing,
/// and whose group commit may be committing other requests' profiles on this thread.
pub fn until_cancelled<T>(cancel: &Cancel, f: impl FnOnce() -> T) -> T {
    let stop = cancel.clone();
    frostdb_core::stop_scans_when(move || stop.is_cancelled().then(|| stop.reason()), f)
}

/// Counts a request waiting for a slot until dropped.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Cancels the work when the request waiting on it goes away.
struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        // After the work ended this changes nothing.
        self.0
            .cancel("the request ended before it (its time limit passed, or the client left)");
    }
}

/// The server's lanes and its query runtime.
#[derive(Debug)]
pub struct Work {
    /// Merges, reports, SQL and other reads.
    pub queries: Lane,
    /// Decoding and storing pushed profiles.
    pub ingest: Lane,
    runtime: QueryRuntime,
}

/// The threads async DataFusion jobs run on, shut down without waiting for them.
#[derive(Debug)]
struct QueryRuntime(Option<tokio::runtime::Runtime>);

impl Drop for QueryRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            // Jobs still running are left to stop at their next batch (their requests were
            // cancelled): shutting down never waits for a query.
            runtime.shutdown_background();
        }
    }
}

/// The stack of a query thread: address space, touched only as deep as a plan goes.
const QUERY_THREAD_STACK: usize = 16 << 20;

impl Work {
    /// Lanes of `queries` and `ingest` slots; the query runtime with `threads` threads.
    pub fn new(queries: usize, ingest: usize, threads: usize) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .max_blocking_threads(queries.max(1) * 4)
            .thread_name("frostdb-query")
            // Planning and optimising walk a query's plan recursively, one level per CTE
            // or subquery: DataFusion grows the stack where it recurses
            // (`recursive_protection`), and the threads start with room for the rest.
            .thread_stack_size(QUERY_THREAD_STACK)
            .enable_all()
            .build()?;
        Ok(Self {
            queries: Lane::new(
                "query",
                "limits.max_concurrent_queries",
                queries,
                queries * 16,
            )
            .stopping_reads(),
            ingest: Lane::new(
                "ingest",
                "limits.max_concurrent_ingest",
                ingest,
                ingest * 16,
            ),
            runtime: QueryRuntime(Some(runtime)),
        })
    }

    /// Runs the async job `f` makes on the query runtime, in the query lane. Dropping the
    /// returned future cancels the job: its [`Cancel`] is set and its task aborted.
    pub async fn query<T, F>(&self, f: impl FnOnce(Cancel) -> F) -> ApiResult<T>
    where
        T: Send + 'static,
        F: Future<Output = ApiResult<T>> + Send + 'static,
    {
        let slot = self.queries.slot().await?;
        let cancel = Cancel::new();
        let _cancel_on_drop = CancelOnDrop(cancel.clone());
        let job = f(cancel);
        let runtime = self
            .runtime
            .0
            .as_ref()
            .ok_or_else(|| ApiError::busy("the server is shutting down", 5))?;
        AbortOnDrop(runtime.spawn(async move {
            let _slot = slot;
            job.await
        }))
        .await
        .map_err(|e| ApiError::job_failed("a query job", e))?
    }
}

/// A task's handle that aborts the task when whoever waits on it goes away.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(id: &str) -> Arc<str> {
        Arc::from(id)
    }

    /// One tenant holds at most three quarters of a lane's slots and queue: past that its
    /// next job is refused (429) at once, while another tenant's still takes its turn.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_holds_at_most_its_share_of_a_lane() {
        // One slot and three places in the queue: a tenant's share is three.
        let lane = Arc::new(Lane::new("query", "limits.max_concurrent_queries", 1, 3));
        let first = TENANT.scope(tenant("a"), lane.slot()).await.unwrap();
        let waiting: Vec<_> = (0..2)
            .map(|_| {
                let lane = lane.clone();
                tokio::spawn(
                    TENANT.scope(tenant("a"), async move { lane.slot().await.map(|_| ()) }),
                )
            })
            .collect();
        while lane.held.lock().get("a").map(|jobs| jobs.held) != Some(3) {
            tokio::task::yield_now().await;
        }
        let refused = TENANT
            .scope(tenant("a"), lane.slot())
            .await
            .err()
            .expect("a fourth job of tenant a");
        assert_eq!(refused.status, axum::http::StatusCode::TOO_MANY_REQUESTS);
        assert!(refused.to_string().contains("its share"), "{refused}");
        // Tenant b waits its turn, and gets it.
        let other = {
            let lane = lane.clone();
            tokio::spawn(TENANT.scope(tenant("b"), async move { lane.slot().await.map(|_| ()) }))
        };
        drop(first);
        for w in waiting {
            w.await.unwrap().unwrap();
        }
        other.await.unwrap().unwrap();
        assert!(lane.held.lock().is_empty(), "every share given back");
    }

    /// One tenant never runs in every slot of a lane of three or more: its jobs past all
    /// but one wait for one of its own, and another tenant's job takes the slot kept. (One
    /// tenant's six endless SQL queries held the four query slots, and another tenant's
    /// `SELECT 1` waited 58 s for the first of them to reach its deadline.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_leaves_a_slot_for_the_others() {
        assert_eq!(
            (1..=5).map(Lane::tenant_slots).collect::<Vec<_>>(),
            [1, 2, 2, 3, 4]
        );
        let lane = Arc::new(Lane::new("query", "limits.max_concurrent_queries", 3, 9));
        let first = TENANT.scope(tenant("a"), lane.slot()).await.unwrap();
        let second = TENANT.scope(tenant("a"), lane.slot()).await.unwrap();
        let third = {
            let lane = lane.clone();
            tokio::spawn(TENANT.scope(tenant("a"), async move { lane.slot().await }))
        };
        // Waiting for one of a's slots, or (were a to run in every slot) running.
        while lane.waiting() == 0 && lane.running() < 3 {
            tokio::task::yield_now().await;
        }
        assert_eq!(lane.running(), 2, "a's third job waits with a slot free");
        assert_eq!(lane.waiting(), 1);
        assert!(!third.is_finished());
        // Tenant b takes the slot kept, at once, though a's job waited first.
        let other = TENANT.scope(tenant("b"), lane.slot()).await.unwrap();
        assert_eq!(lane.running(), 3);
        // a's job runs once one of a's own ends.
        drop(first);
        let third = third.await.unwrap().unwrap();
        assert_eq!(lane.running(), 3);
        drop((second, third, other));
        assert_eq!(lane.running(), 0);
        assert!(lane.held.lock().is_empty(), "every share given back");
    }

    /// A job that panics is its request's 500, its message logged and not answered (it may
    /// quote another tenant's data), and its slot given back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_that_panics_answers_500_without_its_message() {
        let lane = Lane::new("ingest", "limits.max_concurrent_ingest", 1, 0);
        let failed = TENANT
            .scope(
                tenant("a"),
                lane.blocking(|_| -> ApiResult<()> { panic!("secret of tenant b") }),
            )
            .await
            .expect_err("a job that panicked");
        assert_eq!(failed.status, axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!failed.to_string().contains("secret"), "{failed}");
        assert!(failed.to_string().contains("ingest job failed"), "{failed}");
        let work = Work::new(1, 1, 1).unwrap();
        let failed = work
            .query(|_| async {
                if true {
                    panic!("secret of tenant b");
                }
                Ok::<(), ApiError>(())
            })
            .await;
        let failed = failed.expect_err("a query that panicked");
        assert!(!failed.to_string().contains("secret"), "{failed}");
        // The slot is back: the next job runs.
        TENANT
            .scope(tenant("a"), lane.blocking(|_| Ok(())))
            .await
            .unwrap();
    }
}

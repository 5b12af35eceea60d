//! The ingest queue: every receiver hands its converted records here, one committer task
//! writes them.
//!
//! **Group commit.** The committer takes every request waiting in the queue, commits them in
//! one store transaction, and only then answers each of them. While one transaction is being
//! made durable, new requests gather behind it, so the cost of durability (a WAL sync) is
//! shared by everything that arrived meanwhile instead of paid per request. A store that can
//! (`Store::concurrent_ingests`: PostgreSQL) has more than one group in flight, so one group's
//! rows stream in while another waits for its flush; each request is still answered only once
//! its own group has committed.
//!
//! **Back-pressure.** The queue is bounded in bytes. A receiver reserves room for a request's
//! body as it reads it (the bytes received plus, after decompression, a multiple of the
//! decompressed size for the decoded request and its converted records) and keeps the
//! reservation until the request's records are committed. When the room is gone the request is
//! refused at once (HTTP 429 with `Retry-After`, gRPC `RESOURCE_EXHAUSTED` with a retry delay)
//! instead of waiting in memory: memory stays bounded whatever the senders do.
//!
//! A 2xx/OK is sent only after the transaction holding the request committed.

use std::sync::Arc;
use std::time::Instant;

use lagscope_selfmetrics::SelfMetrics;
use lagscope_store::{IngestBatch, Store};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError, mpsc, oneshot};

use crate::DirtyClients;

/// Default room in the ingest queue.
pub const DEFAULT_QUEUE_BYTES: usize = 512 * 1024 * 1024;

/// How much memory a decompressed request body is reckoned to take once decoded and converted
/// (the decoded OTLP message and the domain records), as a multiple of its size.
pub const DECODED_BYTES_FACTOR: usize = 3;

/// A group commit takes requests until it holds this many reserved bytes (a single request
/// larger than this is committed alone).
const MAX_GROUP_BYTES: usize = 32 * 1024 * 1024;

/// ... or this many requests.
const MAX_GROUP_REQUESTS: usize = 4096;

/// The seconds a refused sender is told to wait before retrying.
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// The store could not commit: nothing of the request was written; the sender may retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreUnavailable;

/// The queue has no room for a request now; it may have later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull {
    pub wanted: usize,
    pub capacity: usize,
}

impl std::fmt::Display for QueueFull {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "the ingest queue is full ({} bytes): lagscope is receiving faster than it can commit; retry after {} s",
            self.capacity, RETRY_AFTER_SECONDS
        )
    }
}

/// Room held in the queue for one request, released when it is dropped (after its commit, or
/// when the request is refused).
#[derive(Debug)]
pub struct Reservation {
    permit: Option<OwnedSemaphorePermit>,
    budget: Arc<Semaphore>,
    capacity: usize,
    /// Where a refusal is counted (the one place refusals happen).
    metrics: Arc<SelfMetrics>,
}

impl Reservation {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.permit.as_ref().map_or(0, OwnedSemaphorePermit::num_permits)
    }

    /// Takes `bytes` more, or fails without waiting (keeping what is held); a refusal is
    /// counted in `lagscope_ingest_queue_full_total`.
    pub fn grow(&mut self, bytes: usize) -> Result<(), QueueFull> {
        self.try_grow(bytes).inspect_err(|_| self.metrics.ingest_queue_full.add(1))
    }

    fn try_grow(&mut self, bytes: usize) -> Result<(), QueueFull> {
        if bytes == 0 {
            return Ok(());
        }
        let wanted = self.bytes().saturating_add(bytes);
        let refused = QueueFull { wanted, capacity: self.capacity };
        if wanted > self.capacity {
            return Err(refused);
        }
        let count = u32::try_from(bytes).map_err(|_| refused)?;
        match self.budget.clone().try_acquire_many_owned(count) {
            Ok(permit) => {
                match &mut self.permit {
                    Some(held) => held.merge(permit),
                    None => self.permit = Some(permit),
                }
                Ok(())
            }
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => Err(refused),
        }
    }

    /// Holds exactly `bytes`: takes more without waiting (or fails, keeping what is held), or
    /// gives back the excess.
    pub fn resize(&mut self, bytes: usize) -> Result<(), QueueFull> {
        let held = self.bytes();
        if bytes > held {
            self.grow(bytes - held)
        } else {
            self.shrink(held - bytes);
            Ok(())
        }
    }

    /// Gives back `bytes` of what is held.
    pub fn shrink(&mut self, bytes: usize) {
        if let Some(held) = &mut self.permit {
            let bytes = bytes.min(held.num_permits());
            if bytes == held.num_permits() {
                self.permit = None;
            } else if let Some(released) = held.split(bytes) {
                drop(released);
            }
        }
    }
}

/// Room in bytes, shared by the queues made with it.
#[derive(Debug, Clone)]
pub struct Budget {
    semaphore: Arc<Semaphore>,
    capacity: usize,
}

impl Budget {
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, Semaphore::MAX_PERMITS);
        Self { semaphore: Arc::new(Semaphore::new(capacity)), capacity }
    }
}

/// One request waiting for its commit.
struct Job {
    batch: IngestBatch,
    /// When the request was queued: its telemetry's wait for the analyzer starts here.
    queued: Instant,
    reservation: Reservation,
    answer: oneshot::Sender<Result<(), StoreUnavailable>>,
}

/// The receivers' side of the queue. Cheap to clone; the committer stops once every clone
/// is dropped and the queue is drained.
#[derive(Clone)]
pub struct IngestQueue {
    jobs: mpsc::UnboundedSender<Job>,
    budget: Arc<Semaphore>,
    capacity: usize,
    metrics: Arc<SelfMetrics>,
}

impl IngestQueue {
    /// A queue of `capacity` bytes and its committer, which the caller runs (it returns when
    /// every queue handle is dropped and everything queued is committed or answered).
    pub fn new(
        store: Arc<dyn Store>,
        metrics: Arc<SelfMetrics>,
        dirty: Arc<DirtyClients>,
        capacity: usize,
    ) -> (Self, impl std::future::Future<Output = ()> + Send + 'static) {
        Self::sharing(Budget::new(capacity), store, metrics, dirty)
    }

    /// A queue whose room is `budget`, shared with the other queues made with it (one per
    /// tenant): the bound on memory holds for all of them together.
    pub fn sharing(
        budget: Budget,
        store: Arc<dyn Store>,
        metrics: Arc<SelfMetrics>,
        dirty: Arc<DirtyClients>,
    ) -> (Self, impl std::future::Future<Output = ()> + Send + 'static) {
        let Budget { semaphore: budget, capacity } = budget;
        let (jobs, receiver) = mpsc::unbounded_channel();
        metrics.ingest_queue_capacity_bytes.set(capacity as u64);
        let committer = Committer { store, metrics: metrics.clone(), dirty, budget: budget.clone(), capacity };
        (Self { jobs, budget, capacity, metrics }, committer.run(receiver))
    }

    /// The queue's size in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes reserved now (queued or being read, decoded, committed).
    pub fn in_use(&self) -> usize {
        self.capacity.saturating_sub(self.budget.available_permits())
    }

    /// Reserves `bytes` without waiting.
    pub fn reserve(&self, bytes: usize) -> Result<Reservation, QueueFull> {
        let mut reservation = Reservation {
            permit: None,
            budget: self.budget.clone(),
            capacity: self.capacity,
            metrics: self.metrics.clone(),
        };
        reservation.grow(bytes)?;
        Ok(reservation)
    }

    /// Queues a batch and waits until it is committed (or the store refused it).
    pub async fn commit(&self, batch: IngestBatch, reservation: Reservation) -> Result<(), StoreUnavailable> {
        let (answer, answered) = oneshot::channel();
        self.jobs.send(Job { batch, queued: Instant::now(), reservation, answer }).map_err(|_| StoreUnavailable)?;
        self.metrics.ingest_queue_bytes.set(self.in_use() as u64);
        answered.await.unwrap_or(Err(StoreUnavailable))
    }
}

struct Committer {
    store: Arc<dyn Store>,
    metrics: Arc<SelfMetrics>,
    dirty: Arc<DirtyClients>,
    budget: Arc<Semaphore>,
    capacity: usize,
}

impl Committer {
    async fn run(self, mut receiver: mpsc::UnboundedReceiver<Job>) {
        use futures::stream::{FuturesUnordered, StreamExt};
        // Groups in flight at once: one for SQLite (one writer); for PostgreSQL, the next
        // group's COPY runs while the previous one waits for its WAL flush.
        let parallel = self.store.concurrent_ingests().max(1);
        let mut running = FuturesUnordered::new();
        let mut open = true;
        while open || !running.is_empty() {
            tokio::select! {
                job = receiver.recv(), if open && running.len() < parallel => match job {
                    Some(first) => {
                        let mut bytes = first.reservation.bytes();
                        let mut group = vec![first];
                        while bytes < MAX_GROUP_BYTES && group.len() < MAX_GROUP_REQUESTS {
                            let Ok(job) = receiver.try_recv() else { break };
                            bytes += job.reservation.bytes();
                            group.push(job);
                        }
                        running.push(self.commit_group(group));
                    }
                    None => open = false,
                },
                Some(()) = running.next(), if !running.is_empty() => {
                    self.metrics
                        .ingest_queue_bytes
                        .set(self.capacity.saturating_sub(self.budget.available_permits()) as u64);
                }
            }
        }
    }

    /// Commits a group in one transaction and answers each request. If the group's transaction
    /// fails, each request is tried alone, so one request the store cannot take does not keep
    /// failing the others it happened to be grouped with.
    async fn commit_group(&self, mut group: Vec<Job>) {
        if group.len() > 1 {
            let mut merged = IngestBatch::default();
            let sizes: Vec<[usize; 3]> = group
                .iter()
                .map(|job| [job.batch.spans.len(), job.batch.samples.len(), job.batch.logs.len()])
                .collect();
            for job in group.iter_mut() {
                merged.spans.append(&mut job.batch.spans);
                merged.samples.append(&mut job.batch.samples);
                merged.logs.append(&mut job.batch.logs);
            }
            if self.commit(&merged, group.len()).await.is_ok() {
                let queued = group.iter().map(|job| job.queued).min().unwrap_or_else(Instant::now);
                self.dirty.mark_queued(&merged.spans, &merged.samples, &merged.logs, queued);
                self.metrics.batches_marked.add(1);
                for job in group.drain(..) {
                    let _ = job.answer.send(Ok(()));
                }
                return;
            }
            // Give each request its records back, in order, and try them one by one.
            let mut spans = merged.spans.into_iter();
            let mut samples = merged.samples.into_iter();
            let mut logs = merged.logs.into_iter();
            for (job, [span_count, sample_count, log_count]) in group.iter_mut().zip(sizes) {
                job.batch.spans = spans.by_ref().take(span_count).collect();
                job.batch.samples = samples.by_ref().take(sample_count).collect();
                job.batch.logs = logs.by_ref().take(log_count).collect();
            }
        }
        for job in group.drain(..) {
            let result = self.commit(&job.batch, 1).await;
            if result.is_ok() {
                self.dirty.mark_queued(&job.batch.spans, &job.batch.samples, &job.batch.logs, job.queued);
                self.metrics.batches_marked.add(1);
            }
            drop(job.reservation);
            let _ = job.answer.send(result);
        }
    }

    async fn commit(&self, batch: &IngestBatch, requests: usize) -> Result<(), StoreUnavailable> {
        let started = Instant::now();
        match self.store.ingest(batch).await {
            Ok(receipt) => {
                self.metrics.store_ingest_latency.observe(started.elapsed());
                self.metrics.ingest_commits.add(1);
                self.metrics.ingest_committed_requests.add(requests as u64);
                self.metrics.spans_stored.add(receipt.spans_written);
                self.metrics.samples_stored.add(receipt.samples_written);
                self.metrics.logs_stored.add(receipt.logs_written);
                Ok(())
            }
            Err(error) => {
                tracing::error!(%error, requests, "store refused an ingest commit");
                Err(StoreUnavailable)
            }
        }
    }
}

//! `lagscope serve`: the OTLP/HTTP receiver, the live analyzer and the API over one store.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use lagscope_collector::DirtyClients;
use lagscope_collector::otlp::grpc;
use lagscope_collector::otlp::http::{ReceiverState, router as otlp_router};
use lagscope_collector::otlp::ingest::Ingestor;
use lagscope_collector::queue::{Budget, IngestQueue};
use lagscope_collector::scrape::run_scrapers;
use lagscope_selfmetrics::SelfMetrics;
use lagscope_store::{PgStore, SqliteStore, Store};
use lagscope_web::{ApiState, router as api_router};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::Config;
use crate::live::run_live_analyzer;
use crate::tenants::Tenants;

/// A running service. Dropping it without [`Server::shutdown`] aborts its tasks.
pub struct Server {
    pub api_addr: SocketAddr,
    pub otlp_http_addr: SocketAddr,
    pub otlp_grpc_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<anyhow::Result<()>>,
    /// The single-tenant service's store; `None` with tenants on.
    store: Option<OpenStore>,
    tenants: Option<Arc<Tenants>>,
}

/// The store a stack serves: the embedded SQLite file, or PostgreSQL (`server.database_url`).
#[derive(Clone)]
pub(crate) enum OpenStore {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

impl OpenStore {
    /// PostgreSQL when `database_url` is set, else SQLite in `data_dir`.
    async fn open(database_url: Option<&str>, data_dir: &std::path::Path) -> anyhow::Result<Self> {
        Ok(match database_url {
            Some(url) => Self::Postgres(PgStore::connect(url).await.context("cannot open the PostgreSQL store")?),
            None => Self::Sqlite(
                SqliteStore::open_dir(data_dir)
                    .await
                    .with_context(|| format!("cannot open the store in {}", data_dir.display()))?,
            ),
        })
    }

    fn shared(&self) -> Arc<dyn Store> {
        match self {
            Self::Sqlite(store) => Arc::new(store.clone()),
            Self::Postgres(store) => Arc::new(store.clone()),
        }
    }

    pub(crate) async fn close(&self) {
        match self {
            Self::Sqlite(store) => store.close().await,
            Self::Postgres(store) => store.close().await,
        }
    }
}

/// One store and what serves it: the whole service, or one tenant of it.
pub(crate) struct Stack {
    pub store: OpenStore,
    pub queue: IngestQueue,
    pub metrics: Arc<SelfMetrics>,
    pub api: Router,
    pub otlp_http: Router,
    pub otlp_grpc: Router,
}

impl Stack {
    /// Opens the store (PostgreSQL at `server.database_url`, else SQLite in `data_dir`) and
    /// starts its committer and live analyzer on `tasks`.
    pub(crate) async fn open(
        config: &Config,
        data_dir: &std::path::Path,
        budget: Budget,
        shutdown_rx: &watch::Receiver<bool>,
        tasks: &mut JoinSet<anyhow::Result<()>>,
    ) -> anyhow::Result<Self> {
        // Tenants (SQLite only: the configuration refuses them with a database URL) open
        // their own directory; the single-tenant service uses the configured backend.
        let database_url = if config.tenants.enabled { None } else { config.server.database_url.as_deref() };
        let store = OpenStore::open(database_url, data_dir).await?;
        // One id for this instance's leases and what its API reports.
        let mut config = config.clone();
        config.cluster.instance_id = Some(config.cluster.instance_id());
        let shared_store = store.shared();
        let metrics = Arc::new(SelfMetrics::default());
        let dirty = Arc::new(DirtyClients::default());
        let (queue, committer) = IngestQueue::sharing(budget, shared_store.clone(), metrics.clone(), dirty.clone());
        tasks.spawn(async move {
            committer.await;
            Ok(())
        });
        let ingestor = Ingestor { queue: queue.clone(), metrics: metrics.clone() };
        let otlp_http =
            otlp_router(ReceiverState { ingestor: ingestor.clone(), max_body_bytes: config.server.max_body_bytes });
        let (traces, metrics_service, logs) = grpc::services(ingestor, config.server.max_body_bytes);
        let otlp_grpc =
            tonic::service::Routes::new(traces).add_service(metrics_service).add_service(logs).into_axum_router();
        let api = api_router(ApiState {
            store: shared_store.clone(),
            metrics: metrics.clone(),
            lag: Some(lag_aggregator()),
            instance: config.cluster.instance_id.clone(),
            call_horizon: config.analyzer.stream.horizon(),
            lag_turns: lagscope_web::LagTurns::new(
                config.server.max_concurrent_lag_requests,
                lagscope_web::LAG_TURN_WAIT,
            ),
        })
        .merge(lagscope_web::ui::router(lagscope_web::ui::UiState::new(
            shared_store.clone(),
            metrics.clone(),
            config.server.dashboards()?,
            config.analyzer.stream.horizon(),
        )));
        if config.retention.is_enabled() {
            tasks.spawn(crate::retention::run_retention(
                shared_store.clone(),
                metrics.clone(),
                config.retention.clone(),
                shutdown_rx.clone(),
            ));
        }
        if config.alerts.is_enabled() {
            tasks.spawn(crate::alerting::run_alerting(
                shared_store.clone(),
                config.alerts.clone(),
                metrics.clone(),
                shutdown_rx.clone(),
            ));
        }
        tasks.spawn(run_live_analyzer(shared_store, dirty, metrics.clone(), config, shutdown_rx.clone()));
        Ok(Self { store, queue, metrics, api, otlp_http, otlp_grpc })
    }
}

impl Server {
    /// The single-tenant service's store; `None` with tenants on (each tenant opens its own).
    pub fn store(&self) -> Option<Arc<dyn Store>> {
        self.store.as_ref().map(OpenStore::shared)
    }

    /// Opens the store (or, with tenants on, gets ready to open one per tenant), binds the
    /// listeners and starts serving.
    pub async fn start(config: &Config) -> anyhow::Result<Self> {
        // A dashboard file that does not parse stops the start-up, naming file and line.
        config.server.dashboards()?;
        let api_listener = bind(&config.server.listen, "the API (--listen)").await?;
        let otlp_listener = bind(&config.server.otlp_http, "the OTLP/HTTP receiver (--otlp-http)").await?;
        let grpc_listener = bind(&config.server.otlp_grpc, "the OTLP/gRPC receiver (--otlp-grpc)").await?;
        let api_addr = api_listener.local_addr()?;
        let otlp_http_addr = otlp_listener.local_addr()?;
        let otlp_grpc_addr = grpc_listener.local_addr()?;

        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let budget = Budget::new(config.server.ingest_queue_bytes);
        let (routers, store, tenants) = if config.tenants.enabled {
            let tenants = Arc::new(Tenants::new(config.clone(), budget, shutdown_rx.clone()));
            // Scrape targets write into the tenant they name, opened now.
            for target in &config.scrape {
                let tenant = target.tenant.as_deref().unwrap_or_default();
                let stack = tenants.get(tenant).await.map_err(|refusal| anyhow::anyhow!("{}", refusal.message))?;
                spawn_scrapers(std::slice::from_ref(target), &stack, &shutdown_rx, &mut tasks);
            }
            (tenants.routers(), None, Some(tenants))
        } else {
            let stack = Stack::open(config, &config.server.data_dir, budget, &shutdown_rx, &mut tasks).await?;
            spawn_scrapers(&config.scrape, &stack, &shutdown_rx, &mut tasks);
            ((stack.api, stack.otlp_http, stack.otlp_grpc), Some(stack.store), None)
        };
        let (api, otlp_http, otlp_grpc) = routers;
        let otlp_http = crate::auth::otlp_http(otlp_http, &config.auth);
        tasks.spawn(serve_http(otlp_listener, otlp_http, shutdown_rx.clone()));
        let otlp_grpc = grpc_in_flight_limit(otlp_grpc, config);
        let otlp_grpc = crate::auth::otlp_grpc(otlp_grpc, &config.auth);
        tasks.spawn(serve_http(grpc_listener, otlp_grpc, shutdown_rx.clone()));
        let api = crate::auth::api(api, &config.auth);
        tasks.spawn(serve_http(api_listener, api, shutdown_rx));

        tracing::info!(%api_addr, %otlp_http_addr, %otlp_grpc_addr, data_dir = %config.server.data_dir.display(), postgres = config.server.database_url.is_some(), tenants = config.tenants.enabled, "lagscope is serving");
        Ok(Self { api_addr, otlp_http_addr, otlp_grpc_addr, shutdown, tasks, store, tenants })
    }

    /// Serves until `signal` completes, then shuts down cleanly.
    pub async fn run_until(mut self, signal: impl Future<Output = ()>) -> anyhow::Result<()> {
        tokio::select! {
            () = signal => tracing::info!("shutting down"),
            Some(result) = self.tasks.join_next() => {
                // A task ended on its own: that is a failure; stop the rest.
                let outcome = flatten(result);
                self.shutdown().await?;
                return outcome.and(Err(anyhow::anyhow!("a server task stopped unexpectedly")));
            }
        }
        self.shutdown().await
    }

    /// Stops accepting, lets in-flight requests and the current analysis pass finish, and
    /// closes the store(s).
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        let _ = self.shutdown.send(true);
        let mut first_error = Ok(());
        while let Some(result) = self.tasks.join_next().await {
            if let Err(error) = flatten(result) {
                tracing::error!(error = %format!("{error:#}"), "server task failed");
                if first_error.is_ok() {
                    first_error = Err(error);
                }
            }
        }
        if let Some(tenants) = self.tenants.take()
            && let Err(error) = tenants.shutdown().await
            && first_error.is_ok()
        {
            first_error = Err(error);
        }
        if let Some(store) = &self.store {
            store.close().await;
        }
        first_error
    }
}

/// tonic decodes a gRPC message before the receiver can reserve room for it in the ingest
/// queue, so the number of gRPC requests in flight is bounded instead: as many as the queue
/// could hold at the largest size (`ingest_queue_bytes / max_body_bytes`, at least 1). One
/// more is refused at once with RESOURCE_EXHAUSTED, before its body is read.
fn grpc_in_flight_limit(router: Router, config: &Config) -> Router {
    let permits = (config.server.ingest_queue_bytes / config.server.max_body_bytes.max(1)).max(1);
    let limit = Arc::new(tokio::sync::Semaphore::new(permits));
    router.layer(axum::middleware::from_fn(move |request: axum::extract::Request, next: axum::middleware::Next| {
        let limit = limit.clone();
        async move {
            let Ok(_permit) = limit.try_acquire_owned() else {
                let status = lagscope_collector::otlp::grpc::retryable_exhausted(format!(
                    "{permits} gRPC export requests are already being received; retry after {} s",
                    lagscope_collector::queue::RETRY_AFTER_SECONDS
                ));
                return axum::response::IntoResponse::into_response(status.into_http::<axum::body::Body>());
            };
            next.run(request).await
        }
    }))
}

fn spawn_scrapers(
    targets: &[lagscope_collector::scrape::ScrapeTarget],
    stack: &Stack,
    shutdown_rx: &watch::Receiver<bool>,
    tasks: &mut JoinSet<anyhow::Result<()>>,
) {
    if targets.is_empty() {
        return;
    }
    let scrapers = run_scrapers(targets.to_vec(), stack.queue.clone(), stack.metrics.clone(), shutdown_rx.clone());
    tasks.spawn(async move {
        scrapers.await;
        Ok(())
    });
}

fn flatten(result: Result<anyhow::Result<()>, tokio::task::JoinError>) -> anyhow::Result<()> {
    result.context("server task panicked")?
}

async fn bind(address: &str, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(address).await.with_context(|| format!("cannot listen on {address} for {what}"))
}

async fn serve_http(listener: TcpListener, router: Router, mut shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await
        .context("http server failed")
}

/// Lag analytics for the API: the analytics crate's polars aggregation.
fn lag_aggregator() -> lagscope_web::LagAggregator {
    std::sync::Arc::new(|rows, query| lagscope_analytics::aggregate(rows, query).map_err(|error| error.to_string()))
}

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
use lagscope_collector::queue::IngestQueue;
use lagscope_collector::scrape::run_scrapers;
use lagscope_selfmetrics::SelfMetrics;
use lagscope_store::{SqliteStore, Store};
use lagscope_web::{ApiState, router as api_router};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::Config;
use crate::live::run_live_analyzer;

/// A running service. Dropping it without [`Server::shutdown`] aborts its tasks.
pub struct Server {
    pub api_addr: SocketAddr,
    pub otlp_http_addr: SocketAddr,
    pub otlp_grpc_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<anyhow::Result<()>>,
    store: SqliteStore,
}

impl Server {
    /// Opens the store, binds both listeners and starts serving.
    pub async fn start(config: &Config) -> anyhow::Result<Self> {
        let store = SqliteStore::open_dir(&config.server.data_dir)
            .await
            .with_context(|| format!("cannot open the store in {}", config.server.data_dir.display()))?;
        let api_listener = bind(&config.server.listen, "the API (--listen)").await?;
        let otlp_listener = bind(&config.server.otlp_http, "the OTLP/HTTP receiver (--otlp-http)").await?;
        let grpc_listener = bind(&config.server.otlp_grpc, "the OTLP/gRPC receiver (--otlp-grpc)").await?;
        let api_addr = api_listener.local_addr()?;
        let otlp_http_addr = otlp_listener.local_addr()?;
        let otlp_grpc_addr = grpc_listener.local_addr()?;

        let shared_store: Arc<dyn Store> = Arc::new(store.clone());
        let metrics = Arc::new(SelfMetrics::default());
        let dirty = Arc::new(DirtyClients::default());
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();

        let (queue, committer) =
            IngestQueue::new(shared_store.clone(), metrics.clone(), dirty.clone(), config.server.ingest_queue_bytes);
        tasks.spawn(async move {
            committer.await;
            Ok(())
        });
        if !config.scrape.is_empty() {
            let scrapers = run_scrapers(config.scrape.clone(), queue.clone(), metrics.clone(), shutdown_rx.clone());
            tasks.spawn(async move {
                scrapers.await;
                Ok(())
            });
        }
        let ingestor = Ingestor { queue, metrics: metrics.clone() };
        let receiver =
            otlp_router(ReceiverState { ingestor: ingestor.clone(), max_body_bytes: config.server.max_body_bytes });
        let receiver = crate::auth::otlp_http(receiver, &config.auth);
        tasks.spawn(serve_http(otlp_listener, receiver, shutdown_rx.clone()));
        let (traces, metrics_service, logs) = grpc::services(ingestor, config.server.max_body_bytes);
        let grpc_router =
            tonic::service::Routes::new(traces).add_service(metrics_service).add_service(logs).into_axum_router();
        let grpc_router = crate::auth::otlp_grpc(grpc_router, &config.auth);
        tasks.spawn(serve_http(grpc_listener, grpc_router, shutdown_rx.clone()));
        let api =
            api_router(ApiState { store: shared_store.clone(), metrics: metrics.clone(), lag: Some(lag_aggregator()) });
        let api = crate::auth::api(api, &config.auth);
        tasks.spawn(serve_http(api_listener, api, shutdown_rx.clone()));
        tasks.spawn(run_live_analyzer(shared_store, dirty, metrics, config.clone(), shutdown_rx));

        tracing::info!(%api_addr, %otlp_http_addr, %otlp_grpc_addr, data_dir = %config.server.data_dir.display(), "lagscope is serving");
        Ok(Self { api_addr, otlp_http_addr, otlp_grpc_addr, shutdown, tasks, store })
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
    /// closes the store.
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
        self.store.close().await;
        first_error
    }
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

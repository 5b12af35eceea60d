//! Tenants (off by default): with `[tenants] enabled = true` every request names its tenant in
//! the `X-Scope-OrgID` header (the Mimir/Tempo/Loki convention; gRPC metadata
//! `x-scope-orgid`), and each tenant has a store of its own under
//! `<data_dir>/tenants/<tenant>/`, with its own ingest queue, live analyzer and API: one
//! tenant's data is never read, analyzed or counted with another's. The ingest queues share
//! one budget, so the memory bound holds for all tenants together. A tenant's store is opened
//! on its first request; at most `max_tenants` are.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use lagscope_collector::queue::Budget;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::Config;
use crate::auth::{api_refusal, grpc_refusal, otlp_http_refusal};
use crate::server::Stack;

/// The tenant header.
pub const HEADER: &str = "x-scope-orgid";
/// The longest tenant id (Mimir's limit).
const MAX_ID: usize = 150;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantsConfig {
    /// Isolate data per `X-Scope-OrgID`; requests without the header are refused.
    pub enabled: bool,
    /// The most tenants with an open store; a request for one more is refused.
    pub max_tenants: usize,
}

impl Default for TenantsConfig {
    fn default() -> Self {
        Self { enabled: false, max_tenants: 100 }
    }
}

/// Why a tenant id is refused, or `None`.
pub fn invalid_id(id: &str) -> Option<String> {
    if id.is_empty() {
        return Some("the X-Scope-OrgID header is empty".to_string());
    }
    if id.len() > MAX_ID {
        return Some(format!("tenant id of {} bytes: at most {MAX_ID}", id.len()));
    }
    if id.starts_with('.') || !id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
        return Some(format!(
            "tenant id {id:?}: use letters, digits, '-', '_' and '.', not starting with '.'",
            id = id.chars().take(MAX_ID).collect::<String>()
        ));
    }
    None
}

/// A request refused before it reached a tenant.
#[derive(Debug)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
}

/// The open tenants.
pub struct Tenants {
    config: Config,
    budget: Budget,
    shutdown_rx: watch::Receiver<bool>,
    open: tokio::sync::Mutex<BTreeMap<String, Arc<Stack>>>,
    tasks: tokio::sync::Mutex<JoinSet<anyhow::Result<()>>>,
}

#[derive(Clone, Copy)]
enum Listener {
    Api,
    OtlpHttp,
    OtlpGrpc,
}

impl Tenants {
    pub fn new(config: Config, budget: Budget, shutdown_rx: watch::Receiver<bool>) -> Self {
        Self {
            config,
            budget,
            shutdown_rx,
            open: tokio::sync::Mutex::default(),
            tasks: tokio::sync::Mutex::new(JoinSet::new()),
        }
    }

    /// The tenant's stack, opened on first use.
    pub(crate) async fn get(&self, id: &str) -> Result<Arc<Stack>, Refusal> {
        if let Some(message) = invalid_id(id) {
            return Err(Refusal { status: StatusCode::BAD_REQUEST, message });
        }
        let mut open = self.open.lock().await;
        if let Some(stack) = open.get(id) {
            return Ok(stack.clone());
        }
        if open.len() >= self.config.tenants.max_tenants {
            return Err(Refusal {
                status: StatusCode::FORBIDDEN,
                message: format!("tenant {id:?} refused: {} tenants are open, the most allowed", open.len()),
            });
        }
        let directory = self.config.server.data_dir.join("tenants").join(id);
        let mut tasks = self.tasks.lock().await;
        let stack = Stack::open(&self.config, &directory, self.budget.clone(), &self.shutdown_rx, &mut tasks)
            .await
            .map_err(|error| {
                tracing::error!(tenant = id, error = %format!("{error:#}"), "cannot open a tenant's store");
                Refusal {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    message: format!("tenant {id:?} cannot be opened now"),
                }
            })?;
        drop(tasks);
        tracing::info!(tenant = id, directory = %directory.display(), "tenant opened");
        let stack = Arc::new(stack);
        open.insert(id.to_string(), stack.clone());
        Ok(stack)
    }

    /// The three listeners' routers, each sending a request to its tenant's.
    pub fn routers(self: &Arc<Self>) -> (Router, Router, Router) {
        let router = |listener| Router::new().fallback(dispatch).with_state((self.clone(), listener));
        (router(Listener::Api), router(Listener::OtlpHttp), router(Listener::OtlpGrpc))
    }

    /// Waits for every tenant's tasks (the shutdown signal has been sent) and closes the
    /// stores.
    pub async fn shutdown(&self) -> anyhow::Result<()> {
        let open: Vec<Arc<Stack>> = std::mem::take(&mut *self.open.lock().await).into_values().collect();
        let mut tasks = std::mem::take(&mut *self.tasks.lock().await);
        // The routers hold the queues; dropping the stacks lets the committers drain and stop.
        let stores: Vec<_> = open.iter().map(|stack| stack.store.clone()).collect();
        drop(open);
        let mut result = Ok(());
        while let Some(joined) = tasks.join_next().await {
            if let Err(error) = joined.map_err(anyhow::Error::from).and_then(|outcome| outcome) {
                tracing::error!(error = %format!("{error:#}"), "tenant task failed");
                if result.is_ok() {
                    result = Err(error);
                }
            }
        }
        for store in stores {
            store.close().await;
        }
        result
    }
}

async fn dispatch(State((tenants, listener)): State<(Arc<Tenants>, Listener)>, request: Request) -> Response {
    let header = request.headers().get(HEADER).map(|value| value.to_str().map(str::to_string));
    let refuse = |refusal: Refusal, request: &Request| match listener {
        Listener::Api => api_refusal(refusal.status, &refusal.message),
        Listener::OtlpHttp => otlp_http_refusal(request.headers(), refusal.status, &refusal.message),
        Listener::OtlpGrpc => grpc_refusal(&refusal.message),
    };
    let id = match header {
        Some(Ok(id)) => id,
        Some(Err(_)) => {
            let refusal = Refusal { status: StatusCode::BAD_REQUEST, message: "X-Scope-OrgID is not text".into() };
            return refuse(refusal, &request);
        }
        None if matches!(listener, Listener::Api) && request.uri().path() == "/api/v1/health" => {
            // Probes see the service, not a tenant.
            let open = tenants.open.lock().await.len();
            return axum::Json(serde_json::json!({ "status": "ok", "tenants_open": open })).into_response();
        }
        None => {
            let refusal = Refusal {
                status: StatusCode::UNAUTHORIZED,
                message: "no tenant: send the X-Scope-OrgID header (tenants are on)".into(),
            };
            return refuse(refusal, &request);
        }
    };
    let stack = match tenants.get(&id).await {
        Ok(stack) => stack,
        Err(refusal) => return refuse(refusal, &request),
    };
    let router = match listener {
        Listener::Api => stack.api.clone(),
        Listener::OtlpHttp => stack.otlp_http.clone(),
        Listener::OtlpGrpc => stack.otlp_grpc.clone(),
    };
    match router.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

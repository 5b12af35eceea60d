//! The web pages: server-rendered HTML (minijinja templates, which escape every value by
//! default) with charts drawn by plotters as inline SVG. A little JavaScript adds
//! auto-refresh; every page reads and navigates without it.
//!
//! Pages: the overview (`/`), one anomaly (`/anomalies/{id}`), one client's timeline
//! (`/clients/{id}`), and the dashboards defined as data (`/dashboards/{slug}`, see
//! [`dashboards`]). Telemetry is untrusted: it reaches the HTML only through the templates'
//! escaping or through plotters' SVG escaping, and it reaches SQL only bound.

pub mod charts;
pub mod dashboards;
mod pages;
pub mod panels;

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use lagscope_model::UnixNanos;
use lagscope_selfmetrics::SelfMetrics;
use lagscope_store::{Store, TimeRange};
use minijinja::Environment;
use serde::{Deserialize, Serialize};

pub use dashboards::{Dashboard, Dashboards};

use crate::{ApiError, parse_time};

/// What the pages read, and how they are drawn.
#[derive(Clone)]
pub struct UiState {
    pub store: Arc<dyn Store>,
    pub metrics: Arc<SelfMetrics>,
    pub dashboards: Arc<Dashboards>,
    /// How long a call id names one call (the analyzer's horizon, in nanoseconds).
    pub call_horizon: i64,
    templates: Arc<Environment<'static>>,
}

impl UiState {
    pub fn new(store: Arc<dyn Store>, metrics: Arc<SelfMetrics>, dashboards: Dashboards, call_horizon: i64) -> Self {
        Self { store, metrics, dashboards: Arc::new(dashboards), call_horizon, templates: Arc::new(templates()) }
    }

    /// Renders a page template with the navigation every page shares.
    fn render(&self, name: &str, title: &str, range: Option<&PageRange>, context: minijinja::Value) -> Response {
        let nav: Vec<NavItem> = self
            .dashboards
            .list
            .iter()
            .map(|dashboard| NavItem {
                title: dashboard.title.clone(),
                href: format!("/dashboards/{}", dashboard.slug),
            })
            .collect();
        let page = minijinja::context! {
            title => title,
            nav => nav,
            range => range,
            ..context
        };
        match self.templates.get_template(name).and_then(|template| template.render(page)) {
            Ok(html) => no_store(Html(html).into_response()),
            Err(error) => {
                tracing::error!(%error, template = name, "page failed to render");
                (StatusCode::INTERNAL_SERVER_ERROR, Html("<h1>lagscope: this page failed to render</h1>"))
                    .into_response()
            }
        }
    }

    /// A page, or the error page of what went wrong.
    fn page_or_error(&self, page: Result<Response, ApiError>) -> Response {
        page.unwrap_or_else(|error| self.error_page(error))
    }

    /// An error page with the status the API would answer.
    fn error_page(&self, error: ApiError) -> Response {
        let (status, message) = match &error {
            ApiError::BadRequest(message) => (StatusCode::BAD_REQUEST, message.clone()),
            ApiError::NotFound(message) => (StatusCode::NOT_FOUND, message.clone()),
            ApiError::Unavailable(message) | ApiError::Busy { message, .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, message.clone())
            }
            ApiError::Internal(store) => {
                tracing::error!(error = %store, "page failed");
                (StatusCode::INTERNAL_SERVER_ERROR, "internal error (see the service's log)".to_string())
            }
            ApiError::Analysis(detail) => {
                tracing::error!(error = %detail, "page analysis failed");
                (StatusCode::INTERNAL_SERVER_ERROR, "internal error (see the service's log)".to_string())
            }
        };
        let context = minijinja::context! { status => status.as_u16(), message => message };
        self.render_as(status, "error.html", status.canonical_reason().unwrap_or("error"), context)
    }

    /// [`UiState::render`] answered with `status`.
    fn render_as(&self, status: StatusCode, name: &str, title: &str, context: minijinja::Value) -> Response {
        let mut response = self.render(name, title, None, context);
        *response.status_mut() = status;
        response
    }
}

fn no_store(mut response: Response) -> Response {
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[derive(Debug, Serialize)]
struct NavItem {
    title: String,
    href: String,
}

const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("templates/base.html")),
    ("macros.html", include_str!("templates/macros.html")),
    ("overview.html", include_str!("templates/overview.html")),
    ("anomaly.html", include_str!("templates/anomaly.html")),
    ("client.html", include_str!("templates/client.html")),
    ("clients.html", include_str!("templates/clients.html")),
    ("dashboard.html", include_str!("templates/dashboard.html")),
    ("error.html", include_str!("templates/error.html")),
    ("timeline.html", include_str!("templates/timeline.html")),
];

/// The page templates. Names end in `.html`, which turns minijinja's HTML auto-escaping on
/// for every value they print.
fn templates() -> Environment<'static> {
    let mut environment = Environment::new();
    for (name, source) in TEMPLATES {
        environment
            .add_template(name, source)
            .unwrap_or_else(|error| panic!("template {name} does not parse: {error:#}"));
    }
    environment
}

const CSS: &str = include_str!("assets/lagscope.css");
const JS: &str = include_str!("assets/lagscope.js");
const FAVICON: &str = include_str!("assets/favicon.svg");

/// The pages' routes.
pub fn router(state: UiState) -> Router {
    Router::new()
        .route("/", get(pages::overview))
        .route("/anomalies/{id}", get(pages::anomaly))
        .route("/clients/{client_id}", get(pages::client))
        .route("/clients/", get(pages::client_search))
        .route("/clients", get(pages::client_search))
        .route("/dashboards/{slug}", get(pages::dashboard))
        .route("/assets/lagscope.css", get(|| async { asset("text/css; charset=utf-8", CSS) }))
        .route("/assets/lagscope.js", get(|| async { asset("text/javascript; charset=utf-8", JS) }))
        .route("/assets/favicon.svg", get(|| async { asset("image/svg+xml", FAVICON) }))
        .route("/favicon.ico", get(|| async { asset("image/svg+xml", FAVICON) }))
        .with_state(state)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("max-age=300"));
    response
}

/// A cell of a page table: text (escaped by the template), with an optional link and CSS
/// class.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub text: String,
    pub link: Option<String>,
    pub class: Option<String>,
}

impl Cell {
    pub fn text(text: impl Into<String>) -> Self {
        Self { text: text.into(), link: None, class: None }
    }
    pub fn link(text: impl Into<String>, link: impl Into<String>) -> Self {
        Self { text: text.into(), link: Some(link.into()), class: None }
    }
    pub fn class(text: impl Into<String>, class: &str) -> Self {
        Self { text: text.into(), link: None, class: Some(class.to_string()) }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Table {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
}

impl Table {
    pub fn new(columns: &[&str]) -> Self {
        Self { columns: columns.iter().map(|c| c.to_string()).collect(), rows: Vec::new() }
    }
}

/// The `from`, `to` and `last` parameters every page takes.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RangeParams {
    pub from: Option<String>,
    pub to: Option<String>,
    /// A length back from `to` (or from the latest data): 5m, 1h, 900s.
    pub last: Option<String>,
    /// Seconds between automatic reloads (the script reads it; the server ignores it).
    pub refresh: Option<String>,
}

/// The range a page shows, and the links that move it.
#[derive(Debug, Clone, Serialize)]
pub struct PageRange {
    pub from: UnixNanos,
    pub to: UnixNanos,
    pub from_text: String,
    pub to_text: String,
    pub length: String,
    /// Query strings for the presets (same end, other lengths) and for moving back and forth.
    pub presets: Vec<(String, String)>,
    pub earlier: String,
    pub later: String,
}

/// The range shown when a page names none.
pub const DEFAULT_RANGE: i64 = 15 * 60 * 1_000_000_000;
/// The longest range a page shows.
pub const MAX_RANGE: i64 = 31 * 24 * 3_600 * 1_000_000_000;

impl PageRange {
    /// The range of a request: `from`/`to` when given, else `last` (default 15 minutes) back
    /// from `to` or from the latest data in the store.
    pub async fn resolve(store: &dyn Store, params: &RangeParams) -> Result<Self, ApiError> {
        let time = |name: &str, text: &Option<String>| {
            text.as_deref()
                .filter(|t| !t.is_empty())
                .map(|t| parse_time(name, t).map_err(ApiError::BadRequest))
                .transpose()
        };
        let from = time("from", &params.from)?;
        let to = time("to", &params.to)?;
        let last = params
            .last
            .as_deref()
            .filter(|t| !t.is_empty())
            .map(|text| {
                crate::parse_step(text)
                    .map(|seconds| seconds.saturating_mul(1_000_000_000))
                    .map_err(|error| ApiError::BadRequest(error.replacen("parameter step", "parameter last", 1)))
            })
            .transpose()?;
        let to = match to {
            Some(to) => to,
            None if from.is_some() && last.is_some() => {
                from.unwrap_or_default().saturating_add(last.unwrap_or_default())
            }
            None => {
                let latest = store.latest_time().await?;
                // One second past the latest data, so that it is inside the half-open range.
                latest.map_or_else(now, |latest| latest.saturating_add(1_000_000_000))
            }
        };
        let from = from.unwrap_or_else(|| to.saturating_sub(last.unwrap_or(DEFAULT_RANGE)));
        if from >= to {
            return Err(ApiError::BadRequest("parameter from must be before to".to_string()));
        }
        if to - from > MAX_RANGE {
            return Err(ApiError::BadRequest("the range is longer than 31 days".to_string()));
        }
        Ok(Self::new(from, to))
    }

    pub fn new(from: UnixNanos, to: UnixNanos) -> Self {
        let length = to - from;
        let query = |from: i64, to: i64| format!("from={}&to={}", unix_seconds(from), unix_seconds(to));
        let presets = [("1m", 60), ("5m", 300), ("15m", 900), ("1h", 3600), ("6h", 21_600), ("24h", 86_400)]
            .into_iter()
            .map(|(name, seconds)| (name.to_string(), query(to - seconds * 1_000_000_000, to)))
            .collect();
        Self {
            from,
            to,
            from_text: time_text(from),
            to_text: time_text(to),
            length: duration_text(length),
            presets,
            earlier: query(from - length, from),
            later: query(to, to + length),
        }
    }

    pub fn range(&self) -> TimeRange {
        TimeRange { from: self.from, to: self.to }
    }
}

fn now() -> UnixNanos {
    jiff::Timestamp::now().as_nanosecond() as i64
}

/// Unix seconds with up to nanosecond precision, as the time parameters take them.
pub fn unix_seconds(at: UnixNanos) -> String {
    if at < 0 {
        return format!("-{}", unix_seconds(at.saturating_neg()));
    }
    let seconds = at.div_euclid(1_000_000_000);
    let nanos = at.rem_euclid(1_000_000_000);
    if nanos == 0 { seconds.to_string() } else { format!("{seconds}.{nanos:09}") }
}

/// A time as pages print it: RFC 3339, UTC, milliseconds.
pub fn time_text(at: UnixNanos) -> String {
    jiff::Timestamp::from_nanosecond(i128::from(at))
        .map(|time| format!("{:.3}", time))
        .unwrap_or_else(|_| at.to_string())
}

/// A duration as pages print it: 850 ms, 12.3 s, 4 min 5 s, 2 h 10 min.
pub fn duration_text(nanos: i64) -> String {
    let nanos = nanos.max(0);
    let seconds = nanos as f64 / 1e9;
    if seconds < 1.0 {
        format!("{:.0} ms", seconds * 1e3)
    } else if seconds < 60.0 {
        format!("{seconds:.1} s")
    } else if seconds < 3600.0 {
        format!("{} min {} s", (seconds / 60.0) as i64, (seconds % 60.0) as i64)
    } else {
        format!("{} h {} min", (seconds / 3600.0) as i64, ((seconds % 3600.0) / 60.0) as i64)
    }
}

/// The link to a client's timeline around a moment (a minute either side).
pub fn client_link(client: &str, at: UnixNanos) -> String {
    format!(
        "/clients/{}?from={}&to={}",
        encode_path(client),
        unix_seconds(at - 60_000_000_000),
        unix_seconds(at + 60_000_000_000)
    )
}

/// The span ids listed under `key` in an evidence object (`spans: [{span_id, ..}]` or
/// `spans: ["id", ..]`).
pub fn span_ids(evidence: &serde_json::Value, key: &str) -> Vec<String> {
    evidence
        .get(key)
        .and_then(|spans| spans.as_array())
        .map(|spans| {
            spans
                .iter()
                .filter_map(|span| span.as_str().or_else(|| span.get("span_id").and_then(|id| id.as_str())))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Percent-encodes a path segment (every byte but unreserved characters).
pub fn encode_path(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_parses() {
        let environment = templates();
        for (name, _) in TEMPLATES {
            assert!(environment.get_template(name).is_ok(), "{name}");
        }
    }

    #[test]
    fn links_encode_what_telemetry_names() {
        assert_eq!(encode_path("client-1"), "client-1");
        assert_eq!(encode_path("a/b?c=<d>\"'"), "a%2Fb%3Fc%3D%3Cd%3E%22%27");
        assert_eq!(unix_seconds(1_500_000_000), "1.500000000");
        assert_eq!(unix_seconds(-1), "-0.000000001");
        assert_eq!(duration_text(65_000_000_000), "1 min 5 s");
        assert_eq!(time_text(0), "1970-01-01T00:00:00.000Z");
    }
}

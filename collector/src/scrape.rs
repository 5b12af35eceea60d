//! Scrapers: what the watched systems already expose (Hadoop and Ozone `/jmx`, Elasticsearch
//! and OpenSearch node stats, Prometheus text), fetched on an interval per target, mapped onto
//! the conventions' metric names ([`parse`]) and committed through the ingest queue like any
//! OTLP request. Each target's health (up, duration, samples, last error) is kept in the
//! service's own metrics.

pub mod parse;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lagscope_selfmetrics::SelfMetrics;
use lagscope_store::IngestBatch;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::queue::{DECODED_BYTES_FACTOR, IngestQueue, StoreUnavailable};

/// The largest body a scrape reads.
pub const MAX_SCRAPE_BYTES: usize = 16 * 1024 * 1024;

/// What a target exposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScrapeKind {
    /// A NameNode's, Observer's or Router's `/jmx`.
    HadoopJmx,
    /// An Ozone Manager's `/jmx`.
    OzoneJmx,
    /// Elasticsearch `_nodes/stats/indexing_pressure`.
    ElasticsearchIndexingPressure,
    /// OpenSearch `_nodes/stats/shard_indexing_pressure`.
    OpensearchShardIndexingPressure,
    /// Prometheus text exposition.
    Prometheus,
}

impl ScrapeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HadoopJmx => "hadoop_jmx",
            Self::OzoneJmx => "ozone_jmx",
            Self::ElasticsearchIndexingPressure => "elasticsearch_indexing_pressure",
            Self::OpensearchShardIndexingPressure => "opensearch_shard_indexing_pressure",
            Self::Prometheus => "prometheus",
        }
    }

    fn parser(self) -> fn(&[u8], &mut parse::Samples<'_>) -> Result<(), String> {
        match self {
            Self::HadoopJmx => parse::hadoop_jmx,
            Self::OzoneJmx => parse::ozone_jmx,
            Self::ElasticsearchIndexingPressure => parse::es_indexing_pressure,
            Self::OpensearchShardIndexingPressure => parse::opensearch_shard_indexing_pressure,
            Self::Prometheus => parse::prometheus_text,
        }
    }
}

fn default_interval() -> f64 {
    15.0
}

fn default_timeout() -> f64 {
    10.0
}

/// One `[[scrape]]` entry of the configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrapeTarget {
    /// Names the target in its health and in the `lagscope.scrape.target` label.
    pub name: String,
    /// `http://host:port/jmx`, `http://host:9200/_nodes/stats/indexing_pressure`, ...
    pub url: String,
    pub kind: ScrapeKind,
    #[serde(default = "default_interval")]
    pub interval_seconds: f64,
    #[serde(default = "default_timeout")]
    pub timeout_seconds: f64,
    /// Labels added to every sample (usually `lagscope.cluster`, `lagscope.namespace` and,
    /// where the body does not name it, `lagscope.node.id`); they win over what the body says.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// With tenants on: the tenant whose store the samples go to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl ScrapeTarget {
    pub fn validate(&self) -> Result<(), String> {
        let at = || format!("scrape target {:?}", self.name);
        if self.name.trim().is_empty() {
            return Err("a scrape target needs a name".to_string());
        }
        if !self.url.starts_with("http://") {
            return Err(format!("{}: url {:?} must start with http:// (this build speaks plain HTTP)", at(), self.url));
        }
        if !(self.interval_seconds.is_finite() && self.interval_seconds >= 0.1) {
            return Err(format!("{}: interval_seconds {} must be at least 0.1", at(), self.interval_seconds));
        }
        if !(self.timeout_seconds.is_finite()
            && self.timeout_seconds > 0.0
            && self.timeout_seconds <= self.interval_seconds)
        {
            return Err(format!(
                "{}: timeout_seconds {} must be above 0 and at most interval_seconds {}",
                at(),
                self.timeout_seconds,
                self.interval_seconds
            ));
        }
        Ok(())
    }
}

/// Scrapes every target on its interval until `shutdown`.
pub async fn run_scrapers(
    targets: Vec<ScrapeTarget>,
    queue: IngestQueue,
    metrics: Arc<SelfMetrics>,
    shutdown: watch::Receiver<bool>,
) {
    let client = reqwest::Client::builder().build().unwrap_or_default();
    let mut tasks = tokio::task::JoinSet::new();
    for target in targets {
        metrics.scrapes.update(&target.name, |status| {
            status.url = target.url.clone();
            status.kind = target.kind.as_str().to_string();
        });
        tasks.spawn(scrape_loop(target, client.clone(), queue.clone(), metrics.clone(), shutdown.clone()));
    }
    while tasks.join_next().await.is_some() {}
}

async fn scrape_loop(
    target: ScrapeTarget,
    client: reqwest::Client,
    queue: IngestQueue,
    metrics: Arc<SelfMetrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(target.interval_seconds));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let started = Instant::now();
        let now = now_unix_nano();
        let result = scrape_once(&target, &client, &queue, now).await;
        let elapsed = started.elapsed().as_secs_f64();
        if let Err(error) = &result {
            tracing::warn!(target = %target.name, url = %target.url, %error, "scrape failed");
        }
        metrics.scrapes.update(&target.name, |status| {
            status.scrapes += 1;
            status.last_scrape_unix_nano = Some(now);
            status.duration_seconds = elapsed;
            match result {
                Ok(samples) => {
                    status.up = true;
                    status.samples = samples as u64;
                    status.last_success_unix_nano = Some(now);
                    status.last_error = None;
                }
                Err(error) => {
                    status.up = false;
                    status.failures += 1;
                    status.last_error = Some(error);
                }
            }
        });
    }
}

fn now_unix_nano() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos() as i64)
}

/// One scrape: fetch (bounded in time and size), map, commit. Returns the samples committed.
pub async fn scrape_once(
    target: &ScrapeTarget,
    client: &reqwest::Client,
    queue: &IngestQueue,
    now: i64,
) -> Result<usize, String> {
    let timeout = Duration::from_secs_f64(target.timeout_seconds);
    let mut response = client
        .get(&target.url)
        .timeout(timeout)
        .send()
        .await
        .map_err(|error| format!("cannot fetch {}: {}", target.url, error_chain(&error)))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("{} answered HTTP {status}", target.url));
    }
    let mut body = Vec::new();
    while let Some(chunk) =
        response.chunk().await.map_err(|error| format!("reading {}: {}", target.url, error_chain(&error)))?
    {
        if body.len() + chunk.len() > MAX_SCRAPE_BYTES {
            return Err(format!("{} sent more than {MAX_SCRAPE_BYTES} bytes", target.url));
        }
        body.extend_from_slice(&chunk);
    }
    let mut labels = target.labels.clone();
    labels.insert(parse::SCRAPE_TARGET.to_string(), target.name.clone());
    let mut samples = parse::Samples::new(&labels, now);
    (target.kind.parser())(&body, &mut samples)
        .map_err(|error| format!("{} ({}): {error}", target.url, target.kind.as_str()))?;
    let samples = samples.out;
    let count = samples.len();
    let reservation = queue
        .reserve(body.len().saturating_mul(1 + DECODED_BYTES_FACTOR))
        .map_err(|full| format!("not committed: {full}"))?;
    queue
        .commit(IngestBatch { samples, ..IngestBatch::default() }, reservation)
        .await
        .map_err(|StoreUnavailable| "not committed: the store cannot commit right now".to_string())?;
    Ok(count)
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

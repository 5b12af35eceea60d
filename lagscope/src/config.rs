//! One configuration: defaults, then a TOML file, then `LAGSCOPE_*` environment variables,
//! then command-line flags (the last two are resolved by clap and applied by the caller).

use std::path::{Path, PathBuf};

use anyhow::Context;
use lagscope_analyzer::AnalyzerConfig;
use lagscope_collector::scrape::ScrapeTarget;

use crate::auth::AuthConfig;
use crate::tenants::TenantsConfig;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub live: LiveConfig,
    pub analyzer: AnalyzerConfig,
    /// `[[scrape]]` targets: native endpoints polled on an interval.
    pub scrape: Vec<ScrapeTarget>,
    /// Bearer tokens for ingest and the API (off when none are listed).
    pub auth: AuthConfig,
    /// Data isolated per `X-Scope-OrgID` (off by default).
    pub tenants: TenantsConfig,
    /// How long each signal is kept (forever by default).
    pub retention: RetentionConfig,
    /// Several instances on one PostgreSQL database: how they split the live analysis.
    pub cluster: ClusterConfig,
    /// Paging: receivers (Alertmanager, PagerDuty, webhooks) and the routes to them.
    pub alerts: crate::alerting::AlertsConfig,
}

/// `[cluster]`: instances sharing one PostgreSQL database split the live analysis into
/// shards held under leases in the database (SQLite stores ignore it: one process, one file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// This instance's name in the lease table; unique per running instance (default: the
    /// host name, the process id and the start time).
    pub instance_id: Option<String>,
    /// How long a lease lasts unless renewed (it is renewed every third of it): an instance
    /// that dies has its shards taken over by the others within this time.
    pub lease_seconds: u64,
    /// How often marks committed by other instances are looked for (marks committed by this
    /// one wake the analyzer at once).
    pub poll_interval_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self { instance_id: None, lease_seconds: 6, poll_interval_ms: 200 }
    }
}

impl ClusterConfig {
    /// The configured instance id, or one made from the host name, process id and clock.
    pub fn instance_id(&self) -> String {
        if let Some(id) = &self.instance_id {
            return id.clone();
        }
        let host = std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|name| name.trim().to_string())
            .filter(|name| !name.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "lagscope".to_string());
        let started =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis());
        format!("{host}-{}-{started:x}", std::process::id())
    }

    fn validate(&self) -> Result<(), String> {
        if self.lease_seconds == 0 || self.lease_seconds > 3_600 {
            return Err(format!("cluster.lease_seconds = {}: must be 1 to 3600", self.lease_seconds));
        }
        if self.poll_interval_ms == 0 || self.poll_interval_ms > 60_000 {
            return Err(format!("cluster.poll_interval_ms = {}: must be 1 to 60000", self.poll_interval_ms));
        }
        if self.instance_id.as_ref().is_some_and(|id| id.trim().is_empty() || id.len() > 200) {
            return Err("cluster.instance_id must be 1 to 200 characters".to_string());
        }
        Ok(())
    }
}

/// `[retention]`: durations such as `"14d"`, `"12h"`, `"30m"`, `"90s"` (units s, m, h, d, w).
/// `default` applies to every signal not given its own; a signal with neither is kept forever.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    #[serde(rename = "default")]
    pub all: Option<String>,
    pub spans: Option<String>,
    pub samples: Option<String>,
    pub logs: Option<String>,
    /// Resolved anomalies, by the end of their window (open ones are kept).
    pub anomalies: Option<String>,
    /// How often a retention pass runs.
    pub interval_seconds: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self { all: None, spans: None, samples: None, logs: None, anomalies: None, interval_seconds: 60 }
    }
}

impl RetentionConfig {
    /// Each signal's retention in nanoseconds (`None`: kept forever), or the bad setting.
    pub fn durations(&self) -> Result<[Option<i64>; 4], String> {
        let parse = |name: &str, own: &Option<String>| -> Result<Option<i64>, String> {
            match own.as_ref().or(self.all.as_ref()) {
                None => Ok(None),
                Some(text) => {
                    parse_duration(text).map(Some).map_err(|problem| format!("retention.{name} = {text:?}: {problem}"))
                }
            }
        };
        Ok([
            parse("spans", &self.spans)?,
            parse("samples", &self.samples)?,
            parse("logs", &self.logs)?,
            parse("anomalies", &self.anomalies)?,
        ])
    }

    pub fn is_enabled(&self) -> bool {
        self.durations().is_ok_and(|durations| durations.iter().any(Option::is_some))
    }
}

/// `"14d"` -> nanoseconds. Units: s, m, h, d, w; a positive whole number before them.
pub fn parse_duration(text: &str) -> Result<i64, String> {
    let text = text.trim();
    let split = text.find(|character: char| !character.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: i64 = number.parse().map_err(|_| "expected a whole number followed by s, m, h, d or w".to_string())?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 604_800,
        other => return Err(format!("unknown unit {other:?} (use s, m, h, d or w)")),
    };
    if number <= 0 {
        return Err("must be longer than zero".to_string());
    }
    number
        .checked_mul(seconds)
        .and_then(|seconds| seconds.checked_mul(1_000_000_000))
        .ok_or_else(|| "too long".to_string())
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Where the embedded SQLite store keeps its file.
    pub data_dir: PathBuf,
    /// A PostgreSQL store instead of SQLite: `postgres://user[:password]@host[:port]/database`.
    /// Its schema (migrations/postgres) is applied at start-up.
    pub database_url: Option<String>,
    /// Address of the HTTP API and `/metrics`.
    pub listen: String,
    /// Address of the OTLP/HTTP receiver.
    pub otlp_http: String,
    /// Address of the OTLP/gRPC receiver.
    pub otlp_grpc: String,
    /// Largest OTLP request body accepted, after decompression.
    pub max_body_bytes: usize,
    /// Room in the ingest queue, in bytes: requests being read, decoded and committed. When it
    /// is full, receivers answer 429 / RESOURCE_EXHAUSTED with a retry hint.
    pub ingest_queue_bytes: usize,
    /// Dashboards defined as data (`*.toml`, see dashboards/README.md), added to the built-in
    /// ones and replacing those of the same name; read at start-up. Unset: `./dashboards`
    /// when that directory exists, else the built-in dashboards only.
    pub dashboards_dir: Option<PathBuf>,
    /// `/api/v1/lag` requests served at once (each holds up to ~1.1 GB at its read limits);
    /// more wait up to 30 s for a turn, then are answered 503 with `Retry-After`.
    pub max_concurrent_lag_requests: usize,
}

impl ServerConfig {
    /// The dashboards the pages show: the built-in ones plus those of `dashboards_dir`.
    pub fn dashboards(&self) -> anyhow::Result<lagscope_web::ui::Dashboards> {
        let directory = match &self.dashboards_dir {
            Some(directory) => Some(directory.clone()),
            None => Some(PathBuf::from("dashboards")).filter(|default| default.is_dir()),
        };
        lagscope_web::ui::Dashboards::load(directory.as_deref()).map_err(anyhow::Error::msg)
    }

    /// The ingest queue must hold the largest request the receivers accept, decoded.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(url) = &self.database_url
            && !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
        {
            return Err("server.database_url must be a postgres:// or postgresql:// URL".to_string());
        }
        if self.max_concurrent_lag_requests == 0 {
            return Err("server.max_concurrent_lag_requests must be at least 1".to_string());
        }
        let needed = self.max_body_bytes.saturating_mul(1 + lagscope_collector::queue::DECODED_BYTES_FACTOR);
        if self.ingest_queue_bytes < needed {
            return Err(format!(
                "server.ingest_queue_bytes ({}) must be at least {} (server.max_body_bytes {} decoded: {}x)",
                self.ingest_queue_bytes,
                needed,
                self.max_body_bytes,
                1 + lagscope_collector::queue::DECODED_BYTES_FACTOR
            ));
        }
        Ok(())
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./lagscope-data"),
            database_url: None,
            listen: "127.0.0.1:8080".to_string(),
            otlp_http: "127.0.0.1:4318".to_string(),
            otlp_grpc: "127.0.0.1:4317".to_string(),
            max_body_bytes: lagscope_collector::otlp::http::DEFAULT_MAX_BODY_BYTES,
            ingest_queue_bytes: lagscope_collector::queue::DEFAULT_QUEUE_BYTES,
            dashboards_dir: None,
            max_concurrent_lag_requests: 2,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LiveConfig {
    /// The most recent spans of one client that a live analysis pass reads.
    pub max_spans_per_client: u32,
    /// The most recent spans of one (cluster, namespace) that a namespace pass reads.
    pub max_spans_per_scope: u32,
    /// How far back from a scope's latest metric sample a namespace pass reads metrics (and
    /// from a cluster's latest log record, its log lines).
    pub scope_window_seconds: i64,
    /// The most recent recognised log lines of one cluster a pass reads.
    pub max_logs_per_cluster: u32,
    /// The most spans the scope passes keep in memory between passes, over all scopes (about
    /// 3.5 KB each, with the timelines they join into): a held scope's pass reads and joins
    /// only what was committed since the last one.
    /// Scopes beyond it are read in full each pass; 0 holds none. (On PostgreSQL, whose
    /// commits do not follow span ids, up to the id the span feed settled.)
    pub scope_cache_spans: usize,
    /// The most spans the client passes keep in memory between passes, over all clients
    /// (their own spans and their traces' hops, about 3.5 KB each with their timelines): a held
    /// client's pass reads and joins only what was committed since the last one. Clients beyond it are read in full each
    /// pass; 0 holds none.
    pub client_cache_spans: usize,
    /// The most metric samples the scope passes keep in memory between passes, over all
    /// scopes (about 200 bytes each; a series' labels are shared by its samples): a held
    /// scope's pass reads only the samples from the oldest time committed to it since the last
    /// one. Scopes beyond it are read in full each pass; 0 holds none. On PostgreSQL the scope
    /// marks in the database carry the sample times; a scope is held there only while this
    /// instance holds the shards of its marks (`live::shards::hold_samples`).
    pub scope_cache_samples: usize,
    /// Held calls this long before a client's or scope's newest span (and the detectors'
    /// reach before that: the longest of the switch-back delay, the blind probe's and the
    /// NoNamenodes window's lengths, 60 s by default) are settled: let go, keeping only the calls
    /// later ones are judged by (the floors in force, the highest committed state reported, the
    /// last call, the follower-read history), so that what is held and judged again each pass
    /// follows the last minutes of telemetry, not the client's whole history
    /// (`HeldTimelines::settle`). An anomaly still growing holds its namespace's calls from
    /// its start. 0: nothing is settled (windows are bounded by the span limits alone).
    /// 10 s by default: the reach already keeps a minute behind it, and every second more is
    /// held and judged again by every pass (BENCHMARKS.md, forty-fourth session). A span that
    /// arrives after what it belongs to was settled (`HeldTimelines::is_late`) has its client
    /// (and its scope) let go and read anew from the store, so that it is judged; such spans
    /// are counted (`lagscope_analysis_late_spans_total`,
    /// `lagscope_analysis_scope_late_spans_total`). Each costs a full read, so the settling
    /// widens by itself when spans come late, up to `max_settle_seconds`.
    pub settle_seconds: i64,
    /// The furthest behind the newest span the settling widens to when spans arrive later
    /// than it (`held::Settling`: to hold the latest such span with a quarter to spare; back by
    /// half after five minutes without late spans). What it settles behind now is
    /// `lagscope_analysis_settle_seconds` and `analysis.settle_seconds` in the health. At or
    /// below `settle_seconds` (0, say): fixed. 120 s by default: beyond that, exporters or collectors are
    /// stalled more than late, and holding every client's last minutes that much longer costs
    /// every pass.
    pub max_settle_seconds: i64,
    /// Threads a live pass analyses its clients and scopes on (the analysis is pure; reading
    /// and writing stay on one). 0: one per core.
    pub analysis_threads: usize,
}

impl Default for LiveConfig {
    fn default() -> Self {
        Self {
            max_spans_per_client: 20_000,
            max_spans_per_scope: 50_000,
            scope_window_seconds: 900,
            max_logs_per_cluster: 50_000,
            scope_cache_spans: 500_000,
            client_cache_spans: 500_000,
            scope_cache_samples: 1_000_000,
            settle_seconds: 10,
            max_settle_seconds: 120,
            analysis_threads: 0,
        }
    }
}

/// The most threads a live pass may analyse on (`live.analysis_threads`): a pass starts them
/// anew, up to one per client or scope it analyses.
const MAX_ANALYSIS_THREADS: usize = 64;

impl LiveConfig {
    /// The threads a live pass analyses on: `analysis_threads`, or one per core.
    pub fn threads(&self) -> usize {
        match self.analysis_threads {
            0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            threads => threads,
        }
    }
}

impl Config {
    /// Parses a TOML configuration, naming the file and the offending key on error.
    pub fn from_toml(source_name: &str, text: &str) -> anyhow::Result<Self> {
        let config: Self = toml::from_str(text).with_context(|| format!("invalid configuration in {source_name}"))?;
        config.validate().map_err(|message| anyhow::anyhow!("invalid configuration in {source_name}: {message}"))?;
        Ok(config)
    }

    /// Checks what the types cannot: settings that must agree with each other.
    pub fn validate(&self) -> Result<(), String> {
        self.analyzer.stream.validate()?;
        self.server.validate()?;
        self.auth.validate()?;
        self.retention.durations()?;
        self.cluster.validate()?;
        self.alerts.validate()?;
        if self.retention.interval_seconds == 0 {
            return Err("retention.interval_seconds must be at least 1".to_string());
        }
        if self.live.settle_seconds < 0 {
            return Err(format!(
                "live.settle_seconds must be 0 (nothing settled) or more, not {}",
                self.live.settle_seconds
            ));
        }
        if self.live.max_settle_seconds < 0 {
            return Err(format!(
                "live.max_settle_seconds must be 0 (the settling fixed at live.settle_seconds) or more, not {}",
                self.live.max_settle_seconds
            ));
        }
        if self.live.analysis_threads > MAX_ANALYSIS_THREADS {
            return Err(format!(
                "live.analysis_threads ({}) must be at most {MAX_ANALYSIS_THREADS} (0: one per core)",
                self.live.analysis_threads
            ));
        }
        if self.tenants.enabled && self.server.database_url.is_some() {
            return Err(
                "tenants keep one SQLite store each: they cannot be combined with server.database_url yet".to_string()
            );
        }
        let mut names = std::collections::BTreeSet::new();
        for target in &self.scrape {
            target.validate()?;
            match (&target.tenant, self.tenants.enabled) {
                (None, true) => {
                    return Err(format!("scrape target {:?}: name its tenant (tenants are on)", target.name));
                }
                (Some(tenant), true) => {
                    if let Some(problem) = crate::tenants::invalid_id(tenant) {
                        return Err(format!("scrape target {:?}: {problem}", target.name));
                    }
                }
                (Some(_), false) => {
                    return Err(format!("scrape target {:?} names a tenant, but tenants are off", target.name));
                }
                (None, false) => {}
            }
            if !names.insert(target.name.as_str()) {
                return Err(format!("two scrape targets are named {:?}", target.name));
            }
        }
        Ok(())
    }

    /// Reads the file if given, else the defaults.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Self> {
        let Some(path) = path else {
            return Ok(Self::default());
        };
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read configuration {}", path.display()))?;
        Self::from_toml(&path.display().to_string(), &text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../config/lagscope.example.toml");

    #[test]
    fn the_example_configuration_parses_and_states_the_defaults() {
        let config = Config::from_toml("lagscope.example.toml", EXAMPLE).expect("example parses");
        assert_eq!(config, Config::default());
    }

    #[test]
    fn a_horizon_shorter_than_the_lateness_is_refused() {
        let text = "[analyzer.stream]\nlateness_seconds = 30\nhorizon_seconds = 20\n";
        let error = Config::from_toml("x.toml", text).expect_err("must fail");
        let message = format!("{error:#}");
        assert!(message.contains("analyzer.stream.horizon_seconds (20)"), "{message}");
    }

    #[test]
    fn no_turn_for_lag_requests_is_refused() {
        let config = Config::from_toml("x.toml", "[server]\nmax_concurrent_lag_requests = 1\n").expect("1 is allowed");
        assert_eq!(config.server.max_concurrent_lag_requests, 1);
        let error = Config::from_toml("x.toml", "[server]\nmax_concurrent_lag_requests = 0\n").expect_err("must fail");
        assert!(error.to_string().contains("server.max_concurrent_lag_requests must be at least 1"), "{error}");
    }

    #[test]
    fn more_analysis_threads_than_the_most_are_refused() {
        let config = Config::from_toml("x.toml", "[live]\nanalysis_threads = 64\n").expect("64 is allowed");
        assert_eq!(config.live.threads(), 64);
        let error = Config::from_toml("x.toml", "[live]\nanalysis_threads = 65\n").expect_err("must fail");
        let message = format!("{error:#}");
        assert!(message.contains("live.analysis_threads (65) must be at most 64"), "{message}");
        assert!(Config::default().live.threads() >= 1, "0 is one per core");
    }

    #[test]
    fn a_misspelled_key_is_refused_by_name() {
        let error = Config::from_toml("x.toml", "[server]\nlisten_addr = \"127.0.0.1:1\"\n").expect_err("must fail");
        let message = format!("{error:#}");
        assert!(message.contains("listen_addr"), "{message}");
        assert!(message.contains("x.toml"), "{message}");
    }
}

//! The `lagscope` binary's command line: its subcommands and their arguments (clap derive).
//! Declared by `main.rs`, not part of the library.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use lagscope::analyze::Format;
use lagscope::{eval, sim_cmd};

/// lagscope: lag analytics and consistency checking for replicated storage systems.
#[derive(Debug, Parser)]
#[command(version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// How a scenario runs: `sim` and `eval` take the same.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// Seed of the run: the same seed gives the same bytes.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Client sessions [default: the scenario's].
    #[arg(long)]
    pub(crate) clients: Option<usize>,
    /// Simulated length, e.g. 60s, 2m [default: the scenario's].
    #[arg(long)]
    pub(crate) duration: Option<String>,
    /// Client operations per second [default: the scenario's].
    #[arg(long)]
    pub(crate) rate: Option<f64>,
}

/// How the run's export requests are delivered: `sim` and `eval` take the same.
#[derive(Debug, clap::Args)]
pub(crate) struct DeliveryArgs {
    /// Hold each export request back a random time up to this (e.g. 5s), so that the
    /// processes' batches arrive out of order as through a collector; what is found must not
    /// change. The streaming engine (`eval`, `analyze`) waits analyzer.stream.lateness_seconds
    /// for late spans: `eval` takes at most that less 1 s. `sim` sends any delay: the live
    /// analyzer of `serve` reads anew what late spans belong to, and is exact within that
    /// lateness.
    #[arg(long)]
    pub(crate) export_delay: Option<String>,
    /// Set each simulated process's clock off by a random amount up to this (e.g. 200ms),
    /// either way: how far the detectors hold when hosts' clocks disagree. Clocks apart take
    /// from the lateness as a delay does: the delay, the 1 s export interval and twice the
    /// skew must fit in it.
    #[arg(long)]
    pub(crate) clock_skew: Option<String>,
    /// Deliver this fraction of the export requests twice (e.g. 0.1), the copy up to
    /// --export-delay (at least 1 s) later, as an exporter retrying a request whose
    /// acknowledgement was lost: the same spans, samples and logs, ids and all, must not
    /// change what is found.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) redeliver: f64,
    /// Lose this fraction of the export requests (e.g. 0.1), as an exporter that gave up
    /// after its retries or a collector shedding load: anomalies whose evidence was lost
    /// may be missed, but nothing may be reported that the run did not have.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) lose: f64,
}

impl DeliveryArgs {
    pub(crate) fn delivery(&self) -> anyhow::Result<eval::Delivery> {
        let nanos = |text: &Option<String>| text.as_deref().map(sim_cmd::parse_duration).transpose();
        Ok(eval::Delivery {
            max_delay: nanos(&self.export_delay)?.unwrap_or(0),
            max_skew: nanos(&self.clock_skew)?.unwrap_or(0),
            redeliver: self.redeliver,
            lose: self.lose,
        })
    }
}

impl RunArgs {
    /// The simulator's configuration of `scenario` run so.
    pub(crate) fn config(&self, scenario: &str) -> anyhow::Result<lagscope_sim::SimConfig> {
        let mut config = lagscope_sim::SimConfig::new(scenario);
        config.seed = self.seed;
        config.clients = self.clients;
        config.rate = self.rate;
        config.duration = self.duration.as_deref().map(sim_cmd::parse_duration).transpose()?;
        Ok(config)
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum AlertsAction {
    /// Send a test alert straight to one receiver (it resolves by itself in Alertmanager).
    Test {
        /// TOML configuration file with the [[alerts.receiver]] to test.
        #[arg(long, env = "LAGSCOPE_CONFIG")]
        config: Option<PathBuf>,
        /// The receiver's name.
        #[arg(long)]
        receiver: String,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the collectors, the live analyzer and the API on an embedded SQLite store (or
    /// PostgreSQL with --database-url).
    Serve(ServeArgs),
    /// Run every detector over captured OTLP (one JSON export request per file, or the
    /// OpenTelemetry Collector file exporter's captures: JSON lines, or length-prefixed
    /// requests with `format: proto` or `compression: zstd`; gzip or zstd files too), lscap
    /// captures, or what a store holds (--data-dir, --database-url).
    Analyze(AnalyzeArgs),
    /// Simulate a scenario (see --list) and send its telemetry to a file or an OTLP endpoint.
    Sim(SimArgs),
    /// Export lag analytics (per-read staleness, apply lag, rejections, their per-step
    /// percentiles) and the spans they came from as Parquet, from the store or from captures;
    /// or, with --dump, everything the store holds, for `lagscope import`.
    Export(ExportArgs),
    /// Import dumps written by `lagscope export --dump` into a store (SQLite in --data-dir,
    /// created if missing, or PostgreSQL with --database-url): moves data between backends.
    /// Importing a file again stores nothing twice.
    Import {
        /// Directory of the embedded store to import into [default: ./lagscope-data].
        #[arg(long, env = "LAGSCOPE_DATA_DIR", default_value = "lagscope-data")]
        data_dir: PathBuf,
        /// Import into PostgreSQL instead: postgres://user[:password]@host[:port]/database
        #[arg(long, env = "LAGSCOPE_DATABASE_URL")]
        database_url: Option<String>,
        /// Dump files (`export --dump`).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Show or apply the store's schema migrations (SQLite in --data-dir, or PostgreSQL with
    /// --database-url). `serve` applies them at start-up as well.
    Migrate {
        /// `status` lists the migrations and whether the database has them; `apply` applies
        /// the pending ones.
        #[arg(value_enum, default_value = "status")]
        action: lagscope::migrate::Action,
        /// Directory of the embedded store [default: ./lagscope-data].
        #[arg(long, env = "LAGSCOPE_DATA_DIR", default_value = "lagscope-data")]
        data_dir: PathBuf,
        /// A PostgreSQL store instead: postgres://user[:password]@host[:port]/database
        #[arg(long, env = "LAGSCOPE_DATABASE_URL")]
        database_url: Option<String>,
    },
    /// Paging set-up: `alerts test --receiver NAME` sends a test alert to one receiver of the
    /// configuration's [alerts] and says what it answered.
    Alerts {
        #[command(subcommand)]
        action: AlertsAction,
    },
    /// Convert OTLP captures (as `analyze` reads them) into one lscap capture, lagscope's
    /// compact analysis capture, which `analyze` reads many times faster.
    Convert {
        /// The lscap file to write.
        #[arg(long, value_name = "FILE.lscap")]
        out: PathBuf,
        #[command(flatten)]
        progress: lagscope::progress::ProgressArgs,
        /// Capture files to read (`-`: the standard input; a directory: its files, in the order of
        /// their names).
        #[arg(required = true)]
        captures: Vec<PathBuf>,
    },
    /// Run scenarios through the analyzer and score what it finds against their ground truth;
    /// or, with --truth, score a recorded run (its captures, or the store it was sent to).
    Eval(EvalArgs),
}

/// `lagscope serve`: see [`Command::Serve`].
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// TOML configuration file (see config/lagscope.example.toml).
    #[arg(long, env = "LAGSCOPE_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// Directory of the embedded store [default: ./lagscope-data]
    #[arg(long, env = "LAGSCOPE_DATA_DIR")]
    pub(crate) data_dir: Option<PathBuf>,
    /// Store in PostgreSQL instead: postgres://user[:password]@host[:port]/database
    #[arg(long, env = "LAGSCOPE_DATABASE_URL")]
    pub(crate) database_url: Option<String>,
    /// Address of the HTTP API [default: 127.0.0.1:8080]; port 0 picks a free port.
    #[arg(long, env = "LAGSCOPE_LISTEN")]
    pub(crate) listen: Option<String>,
    /// Address of the OTLP/HTTP receiver [default: 127.0.0.1:4318]; port 0 picks a free port.
    #[arg(long, env = "LAGSCOPE_OTLP_HTTP")]
    pub(crate) otlp_http: Option<String>,
    /// Address of the OTLP/gRPC receiver [default: 127.0.0.1:4317]; port 0 picks a free port.
    #[arg(long, env = "LAGSCOPE_OTLP_GRPC")]
    pub(crate) otlp_grpc: Option<String>,
    /// Directory of dashboards defined as data (*.toml), added to the built-in ones
    /// [default: ./dashboards when it exists]
    #[arg(long, env = "LAGSCOPE_DASHBOARDS", value_name = "DIR")]
    pub(crate) dashboards: Option<PathBuf>,
    /// Feed the service the simulator's `mixed` scenario in real time, round after round
    /// (timestamped now), so that every page fills within seconds: a demo.
    #[arg(long)]
    pub(crate) demo: bool,
}

/// `lagscope analyze`: see [`Command::Analyze`].
#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("store").args(["data_dir", "database_url"]))]
pub(crate) struct AnalyzeArgs {
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub(crate) format: Format,
    /// TOML configuration file; its [analyzer] section sets the detectors' thresholds.
    #[arg(long, env = "LAGSCOPE_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// Run only the detectors of this anomaly kind (repeatable) [default: all].
    #[arg(long = "kind", value_name = "KIND", value_parser = parse_kind)]
    pub(crate) kinds: Vec<lagscope_model::AnomalyKind>,
    /// Threads decoding OTLP captures (the detectors run on one more) [default: the
    /// machine's cores, up to 8].
    #[arg(long, env = "LAGSCOPE_DECODE_THREADS", value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) decode_threads: Option<u16>,
    #[command(flatten)]
    pub(crate) progress: lagscope::progress::ProgressArgs,
    /// Analyze what the embedded store in this directory holds instead of capture files,
    /// e.g. with other thresholds. Nothing is written there but the schema migrations
    /// `serve` would apply; a running `serve` may keep writing to it.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["paths", "database_url"])]
    pub(crate) data_dir: Option<PathBuf>,
    /// Analyze what this PostgreSQL store holds instead of capture files:
    /// postgres://user[:password]@host[:port]/database
    #[arg(long, value_name = "URL", conflicts_with = "paths")]
    pub(crate) database_url: Option<String>,
    /// With a store: only the spans that start, and the samples and log records timed,
    /// from this time on (RFC 3339 or Unix seconds) [default: the data's first].
    #[arg(long, requires = "store")]
    pub(crate) from: Option<String>,
    /// With a store: only what is before this time, exclusive [default: the data's last].
    #[arg(long, requires = "store")]
    pub(crate) to: Option<String>,
    /// Capture files (`-`: the standard input, e.g. `zstdcat capture.zst | lagscope analyze -`; a
    /// directory: its files in the order of their names, as a Collector's file exporter rotates
    /// them).
    #[arg(required_unless_present_any = ["data_dir", "database_url"])]
    pub(crate) paths: Vec<PathBuf>,
}

/// `lagscope sim`: see [`Command::Sim`].
#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("target").args(["out", "otlp_http", "otlp_grpc"]))]
pub(crate) struct SimArgs {
    /// Print the scenarios and exit.
    #[arg(long)]
    pub(crate) list: bool,
    /// Scenario name.
    #[arg(long, required_unless_present = "list")]
    pub(crate) scenario: Option<String>,
    #[command(flatten)]
    pub(crate) run: RunArgs,
    /// Write OTLP JSON lines to this file (as the Collector's file exporter with `format: json`;
    /// with `format: proto`, length-prefixed protobuf requests, when it ends in .binpb;
    /// lagscope's compact analysis capture when it ends in .lscap: what `analyze` reads fastest).
    #[arg(long, required_unless_present_any = ["list", "otlp_http", "otlp_grpc"])]
    pub(crate) out: Option<PathBuf>,
    /// Send OTLP/HTTP (protobuf) to this base URL, e.g. http://127.0.0.1:4318.
    #[arg(long)]
    pub(crate) otlp_http: Option<String>,
    /// Send OTLP/gRPC to this endpoint, e.g. http://127.0.0.1:4317.
    #[arg(long)]
    pub(crate) otlp_grpc: Option<String>,
    /// Write the run's ground truth (expected anomalies) to this JSON file.
    #[arg(long)]
    pub(crate) truth: Option<PathBuf>,
    /// Pace the telemetry in real time (for demos) instead of as fast as possible.
    #[arg(long)]
    pub(crate) realtime: bool,
    /// OTLP export requests sent at once (1: each waits for the one before it to be
    /// answered). More keep a paced run at real time when the receiver answers slowly, as
    /// a collector's several senders do; requests may then arrive out of order.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub(crate) in_flight: u16,
    /// Held back, skewed, sent twice or lost as a collector would deliver it.
    #[command(flatten)]
    pub(crate) delivery: DeliveryArgs,
    /// Also serve what the simulated nodes expose natively (Hadoop /jmx, Ozone OMMetrics,
    /// Elasticsearch/OpenSearch node stats, Prometheus /metrics) on this address; keeps
    /// serving after the run until Ctrl-C.
    #[arg(long)]
    pub(crate) serve_native: Option<String>,
    #[command(flatten)]
    pub(crate) progress: lagscope::progress::ProgressArgs,
}

/// `lagscope export`: see [`Command::Export`].
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("output").required(true).args(["parquet", "dump"])))]
pub(crate) struct ExportArgs {
    /// Directory to write the Parquet files into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub(crate) parquet: Option<PathBuf>,
    /// Write every span, sample, log record and anomaly of the store to this file (gzip
    /// JSON lines, lossless) for `lagscope import`; the filters do not apply.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["captures", "cluster", "namespace", "from", "to", "step"])]
    pub(crate) dump: Option<PathBuf>,
    /// Directory of the embedded store to read [default: ./lagscope-data].
    #[arg(long, env = "LAGSCOPE_DATA_DIR", default_value = "lagscope-data")]
    pub(crate) data_dir: PathBuf,
    /// Read a PostgreSQL store instead: postgres://user[:password]@host[:port]/database
    #[arg(long, env = "LAGSCOPE_DATABASE_URL")]
    pub(crate) database_url: Option<String>,
    /// Only this cluster.
    #[arg(long)]
    pub(crate) cluster: Option<String>,
    /// Only this namespace.
    #[arg(long)]
    pub(crate) namespace: Option<String>,
    /// Start of the range (RFC 3339 or Unix seconds) [default: the data's first].
    #[arg(long)]
    pub(crate) from: Option<String>,
    /// End of the range, exclusive [default: the data's last].
    #[arg(long)]
    pub(crate) to: Option<String>,
    /// Bucket width of the aggregates: seconds, or 30s, 5m, 1h [default: the whole range].
    #[arg(long)]
    pub(crate) step: Option<String>,
    /// The most spans (and samples) read from the store, the oldest first. The spans are not
    /// held: they are joined a few minutes of them at a time as they are read; the samples are.
    #[arg(long, default_value_t = 5_000_000)]
    pub(crate) max_spans: u32,
    /// OTLP capture files (as `analyze` reads them: JSON, length-prefixed, compressed; `-` the
    /// standard input; a directory its files) to read instead of the store. They are not held in memory: their spans are set aside on disk, in
    /// a directory of DIR removed at the end, and joined a few minutes of them at a time.
    pub(crate) captures: Vec<PathBuf>,
    #[command(flatten)]
    pub(crate) progress: lagscope::progress::ProgressArgs,
}

/// `lagscope eval`: see [`Command::Eval`].
#[derive(Debug, clap::Args)]
pub(crate) struct EvalArgs {
    /// A scenario name, or `all`.
    #[arg(long, default_value = "all")]
    pub(crate) scenario: String,
    /// The seed, clients, length and rate of every scenario run (as `lagscope sim`'s): the
    /// detectors are held to the truth of runs they were not tuned to.
    #[command(flatten)]
    pub(crate) run: RunArgs,
    #[command(flatten)]
    pub(crate) delivery: DeliveryArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub(crate) format: Format,
    /// TOML configuration file; its [analyzer] section sets the detectors' thresholds.
    #[arg(long, env = "LAGSCOPE_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// Score a recorded run instead of running scenarios: the ground truth `sim --truth`
    /// wrote of it, against its telemetry, the captures `sim --out` wrote (CAPTURES) or the
    /// store its export requests went to (--data-dir, --database-url).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["scenario", "seed", "clients", "duration", "rate", "export_delay", "clock_skew", "redeliver", "lose"]
    )]
    pub(crate) truth: Option<PathBuf>,
    /// With --truth: the embedded store in this directory holds the run's telemetry.
    #[arg(long, value_name = "DIR", requires = "truth", conflicts_with_all = ["captures", "database_url"])]
    pub(crate) data_dir: Option<PathBuf>,
    /// With --truth: this PostgreSQL store holds the run's telemetry.
    #[arg(long, value_name = "URL", requires = "truth", conflicts_with = "captures")]
    pub(crate) database_url: Option<String>,
    /// With a store: score the anomalies `serve`'s live analyzer stored there, as they
    /// are, instead of analyzing the store's telemetry again (the live mode held to the
    /// run's truth; run it once `/api/v1/health` shows every batch analyzed).
    #[arg(long, requires = "truth", conflicts_with = "captures")]
    pub(crate) stored: bool,
    /// With a store: read from this time (RFC 3339 or Unix seconds) [default: the run's start].
    #[arg(long, requires = "truth")]
    pub(crate) from: Option<String>,
    /// With a store: read up to this time, exclusive [default: just past the run's end].
    #[arg(long, requires = "truth")]
    pub(crate) to: Option<String>,
    #[command(flatten)]
    pub(crate) progress: lagscope::progress::ProgressArgs,
    /// With --truth: the run's capture files.
    #[arg(value_name = "CAPTURES", requires = "truth")]
    pub(crate) captures: Vec<PathBuf>,
}

pub(crate) fn parse_kind(text: &str) -> Result<lagscope_model::AnomalyKind, String> {
    lagscope_model::AnomalyKind::parse(text).ok_or_else(|| {
        let known: Vec<&str> = lagscope_model::AnomalyKind::ALL.iter().map(|kind| kind.as_str()).collect();
        format!("unknown anomaly kind {text:?}; known: {}", known.join(", "))
    })
}

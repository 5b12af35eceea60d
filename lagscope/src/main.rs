use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use lagscope::analyze::{Format, analyze_paths_emitting, write_json, write_table};
use lagscope::{Config, Server};
use lagscope::{eval, sim_cmd};
use tracing_subscriber::EnvFilter;

// The analyzer and the decoders allocate many small strings: mimalloc cuts offline analysis
// time by about a third against the system allocator (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// lagscope: lag analytics and consistency checking for replicated storage systems.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// How a scenario runs: `sim` and `eval` take the same.
#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Seed of the run: the same seed gives the same bytes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Client sessions [default: the scenario's].
    #[arg(long)]
    clients: Option<usize>,
    /// Simulated length, e.g. 60s, 2m [default: the scenario's].
    #[arg(long)]
    duration: Option<String>,
    /// Client operations per second [default: the scenario's].
    #[arg(long)]
    rate: Option<f64>,
}

/// How the run's export requests are delivered: `sim` and `eval` take the same.
#[derive(Debug, clap::Args)]
struct DeliveryArgs {
    /// Hold each export request back a random time up to this (e.g. 5s), so that the
    /// processes' batches arrive out of order as through a collector; what is found must not
    /// change. The streaming engine (`eval`, `analyze`) waits analyzer.stream.lateness_seconds
    /// for late spans: `eval` takes at most that less 1 s. `sim` sends any delay: the live
    /// analyzer of `serve` reads anew what late spans belong to, and is exact within that
    /// lateness.
    #[arg(long)]
    export_delay: Option<String>,
    /// Set each simulated process's clock off by a random amount up to this (e.g. 200ms),
    /// either way: how far the detectors hold when hosts' clocks disagree. Clocks apart take
    /// from the lateness as a delay does: the delay, the 1 s export interval and twice the
    /// skew must fit in it.
    #[arg(long)]
    clock_skew: Option<String>,
    /// Deliver this fraction of the export requests twice (e.g. 0.1), the copy up to
    /// --export-delay (at least 1 s) later, as an exporter retrying a request whose
    /// acknowledgement was lost: the same spans, samples and logs, ids and all, must not
    /// change what is found.
    #[arg(long, default_value_t = 0.0)]
    redeliver: f64,
    /// Lose this fraction of the export requests (e.g. 0.1), as an exporter that gave up
    /// after its retries or a collector shedding load: anomalies whose evidence was lost
    /// may be missed, but nothing may be reported that the run did not have.
    #[arg(long, default_value_t = 0.0)]
    lose: f64,
}

impl DeliveryArgs {
    fn delivery(&self) -> anyhow::Result<eval::Delivery> {
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
    fn config(&self, scenario: &str) -> anyhow::Result<lagscope_sim::SimConfig> {
        let mut config = lagscope_sim::SimConfig::new(scenario);
        config.seed = self.seed;
        config.clients = self.clients;
        config.rate = self.rate;
        config.duration = self.duration.as_deref().map(sim_cmd::parse_duration).transpose()?;
        Ok(config)
    }
}

#[derive(Debug, Subcommand)]
enum AlertsAction {
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
enum Command {
    /// Run the collectors, the live analyzer and the API on an embedded SQLite store (or
    /// PostgreSQL with --database-url).
    Serve(ServeArgs),
    /// Run every detector over captured OTLP JSON (one export request per file, or JSON lines
    /// of them as the OpenTelemetry Collector's file exporter writes; .gz too), lscap
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
    /// Convert OTLP JSON captures (JSON lines, .gz too) into one lscap capture, lagscope's
    /// compact analysis capture, which `analyze` reads many times faster.
    Convert {
        /// The lscap file to write.
        #[arg(long, value_name = "FILE.lscap")]
        out: PathBuf,
        #[command(flatten)]
        progress: lagscope::progress::ProgressArgs,
        /// Capture files to read.
        #[arg(required = true)]
        captures: Vec<PathBuf>,
    },
    /// Run scenarios through the analyzer and score what it finds against their ground truth;
    /// or, with --truth, score a recorded run (its captures, or the store it was sent to).
    Eval(EvalArgs),
}

/// `lagscope serve`: see [`Command::Serve`].
#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// TOML configuration file (see config/lagscope.example.toml).
    #[arg(long, env = "LAGSCOPE_CONFIG")]
    config: Option<PathBuf>,
    /// Directory of the embedded store [default: ./lagscope-data]
    #[arg(long, env = "LAGSCOPE_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Store in PostgreSQL instead: postgres://user[:password]@host[:port]/database
    #[arg(long, env = "LAGSCOPE_DATABASE_URL")]
    database_url: Option<String>,
    /// Address of the HTTP API [default: 127.0.0.1:8080]; port 0 picks a free port.
    #[arg(long, env = "LAGSCOPE_LISTEN")]
    listen: Option<String>,
    /// Address of the OTLP/HTTP receiver [default: 127.0.0.1:4318]; port 0 picks a free port.
    #[arg(long, env = "LAGSCOPE_OTLP_HTTP")]
    otlp_http: Option<String>,
    /// Address of the OTLP/gRPC receiver [default: 127.0.0.1:4317]; port 0 picks a free port.
    #[arg(long, env = "LAGSCOPE_OTLP_GRPC")]
    otlp_grpc: Option<String>,
    /// Directory of dashboards defined as data (*.toml), added to the built-in ones
    /// [default: ./dashboards when it exists]
    #[arg(long, env = "LAGSCOPE_DASHBOARDS", value_name = "DIR")]
    dashboards: Option<PathBuf>,
    /// Feed the service the simulator's `mixed` scenario in real time, round after round
    /// (timestamped now), so that every page fills within seconds: a demo.
    #[arg(long)]
    demo: bool,
}

/// `lagscope analyze`: see [`Command::Analyze`].
#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("store").args(["data_dir", "database_url"]))]
struct AnalyzeArgs {
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// TOML configuration file; its [analyzer] section sets the detectors' thresholds.
    #[arg(long, env = "LAGSCOPE_CONFIG")]
    config: Option<PathBuf>,
    /// Run only the detectors of this anomaly kind (repeatable) [default: all].
    #[arg(long = "kind", value_name = "KIND", value_parser = parse_kind)]
    kinds: Vec<lagscope_model::AnomalyKind>,
    /// Threads decoding OTLP JSON captures (the detectors run on one more) [default: the
    /// machine's cores, up to 8].
    #[arg(long, env = "LAGSCOPE_DECODE_THREADS", value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    decode_threads: Option<u16>,
    #[command(flatten)]
    progress: lagscope::progress::ProgressArgs,
    /// Analyze what the embedded store in this directory holds instead of capture files,
    /// e.g. with other thresholds. Nothing is written there but the schema migrations
    /// `serve` would apply; a running `serve` may keep writing to it.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["paths", "database_url"])]
    data_dir: Option<PathBuf>,
    /// Analyze what this PostgreSQL store holds instead of capture files:
    /// postgres://user[:password]@host[:port]/database
    #[arg(long, value_name = "URL", conflicts_with = "paths")]
    database_url: Option<String>,
    /// With a store: only the spans that start, and the samples and log records timed,
    /// from this time on (RFC 3339 or Unix seconds) [default: the data's first].
    #[arg(long, requires = "store")]
    from: Option<String>,
    /// With a store: only what is before this time, exclusive [default: the data's last].
    #[arg(long, requires = "store")]
    to: Option<String>,
    /// Capture files.
    #[arg(required_unless_present_any = ["data_dir", "database_url"])]
    paths: Vec<PathBuf>,
}

/// `lagscope sim`: see [`Command::Sim`].
#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("target").args(["out", "otlp_http", "otlp_grpc"]))]
struct SimArgs {
    /// Print the scenarios and exit.
    #[arg(long)]
    list: bool,
    /// Scenario name.
    #[arg(long, required_unless_present = "list")]
    scenario: Option<String>,
    #[command(flatten)]
    run: RunArgs,
    /// Write OTLP JSON lines to this file (lagscope's compact analysis capture when it ends
    /// in .lscap: what `analyze` reads fastest).
    #[arg(long, required_unless_present_any = ["list", "otlp_http", "otlp_grpc"])]
    out: Option<PathBuf>,
    /// Send OTLP/HTTP (protobuf) to this base URL, e.g. http://127.0.0.1:4318.
    #[arg(long)]
    otlp_http: Option<String>,
    /// Send OTLP/gRPC to this endpoint, e.g. http://127.0.0.1:4317.
    #[arg(long)]
    otlp_grpc: Option<String>,
    /// Write the run's ground truth (expected anomalies) to this JSON file.
    #[arg(long)]
    truth: Option<PathBuf>,
    /// Pace the telemetry in real time (for demos) instead of as fast as possible.
    #[arg(long)]
    realtime: bool,
    /// OTLP export requests sent at once (1: each waits for the one before it to be
    /// answered). More keep a paced run at real time when the receiver answers slowly, as
    /// a collector's several senders do; requests may then arrive out of order.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    in_flight: u16,
    /// Held back, skewed, sent twice or lost as a collector would deliver it.
    #[command(flatten)]
    delivery: DeliveryArgs,
    /// Also serve what the simulated nodes expose natively (Hadoop /jmx, Ozone OMMetrics,
    /// Elasticsearch/OpenSearch node stats, Prometheus /metrics) on this address; keeps
    /// serving after the run until Ctrl-C.
    #[arg(long)]
    serve_native: Option<String>,
    #[command(flatten)]
    progress: lagscope::progress::ProgressArgs,
}

/// `lagscope export`: see [`Command::Export`].
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("output").required(true).args(["parquet", "dump"])))]
struct ExportArgs {
    /// Directory to write the Parquet files into (created if missing).
    #[arg(long, value_name = "DIR")]
    parquet: Option<PathBuf>,
    /// Write every span, sample, log record and anomaly of the store to this file (gzip
    /// JSON lines, lossless) for `lagscope import`; the filters do not apply.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["captures", "cluster", "namespace", "from", "to", "step"])]
    dump: Option<PathBuf>,
    /// Directory of the embedded store to read [default: ./lagscope-data].
    #[arg(long, env = "LAGSCOPE_DATA_DIR", default_value = "lagscope-data")]
    data_dir: PathBuf,
    /// Read a PostgreSQL store instead: postgres://user[:password]@host[:port]/database
    #[arg(long, env = "LAGSCOPE_DATABASE_URL")]
    database_url: Option<String>,
    /// Only this cluster.
    #[arg(long)]
    cluster: Option<String>,
    /// Only this namespace.
    #[arg(long)]
    namespace: Option<String>,
    /// Start of the range (RFC 3339 or Unix seconds) [default: the data's first].
    #[arg(long)]
    from: Option<String>,
    /// End of the range, exclusive [default: the data's last].
    #[arg(long)]
    to: Option<String>,
    /// Bucket width of the aggregates: seconds, or 30s, 5m, 1h [default: the whole range].
    #[arg(long)]
    step: Option<String>,
    /// The most spans (and samples) read from the store.
    #[arg(long, default_value_t = 5_000_000)]
    max_spans: u32,
    /// OTLP JSON capture files (.json, .jsonl, optionally .gz) to read instead of the
    /// store.
    captures: Vec<PathBuf>,
}

/// `lagscope eval`: see [`Command::Eval`].
#[derive(Debug, clap::Args)]
struct EvalArgs {
    /// A scenario name, or `all`.
    #[arg(long, default_value = "all")]
    scenario: String,
    /// The seed, clients, length and rate of every scenario run (as `lagscope sim`'s): the
    /// detectors are held to the truth of runs they were not tuned to.
    #[command(flatten)]
    run: RunArgs,
    #[command(flatten)]
    delivery: DeliveryArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// TOML configuration file; its [analyzer] section sets the detectors' thresholds.
    #[arg(long, env = "LAGSCOPE_CONFIG")]
    config: Option<PathBuf>,
    /// Score a recorded run instead of running scenarios: the ground truth `sim --truth`
    /// wrote of it, against its telemetry, the captures `sim --out` wrote (CAPTURES) or the
    /// store its export requests went to (--data-dir, --database-url).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["scenario", "seed", "clients", "duration", "rate", "export_delay", "clock_skew", "redeliver", "lose"]
    )]
    truth: Option<PathBuf>,
    /// With --truth: the embedded store in this directory holds the run's telemetry.
    #[arg(long, value_name = "DIR", requires = "truth", conflicts_with_all = ["captures", "database_url"])]
    data_dir: Option<PathBuf>,
    /// With --truth: this PostgreSQL store holds the run's telemetry.
    #[arg(long, value_name = "URL", requires = "truth", conflicts_with = "captures")]
    database_url: Option<String>,
    /// With a store: score the anomalies `serve`'s live analyzer stored there, as they
    /// are, instead of analyzing the store's telemetry again (the live mode held to the
    /// run's truth; run it once `/api/v1/health` shows every batch analyzed).
    #[arg(long, requires = "truth", conflicts_with = "captures")]
    stored: bool,
    /// With a store: read from this time (RFC 3339 or Unix seconds) [default: the run's start].
    #[arg(long, requires = "truth")]
    from: Option<String>,
    /// With a store: read up to this time, exclusive [default: just past the run's end].
    #[arg(long, requires = "truth")]
    to: Option<String>,
    #[command(flatten)]
    progress: lagscope::progress::ProgressArgs,
    /// With --truth: the run's capture files.
    #[arg(value_name = "CAPTURES", requires = "truth")]
    captures: Vec<PathBuf>,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("LAGSCOPE_LOG").unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or a journal gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn parse_kind(text: &str) -> Result<lagscope_model::AnomalyKind, String> {
    lagscope_model::AnomalyKind::parse(text).ok_or_else(|| {
        let known: Vec<&str> = lagscope_model::AnomalyKind::ALL.iter().map(|kind| kind.as_str()).collect();
        format!("unknown anomaly kind {text:?}; known: {}", known.join(", "))
    })
}

/// A `--from`/`--to` option's time (RFC 3339 or Unix seconds) in nanoseconds, when given.
fn time(name: &str, text: Option<String>) -> anyhow::Result<Option<i64>> {
    text.map(|text| lagscope_web::parse_time(name, &text).map_err(anyhow::Error::msg)).transpose()
}

/// The store `--data-dir` or `--database-url` names, if either does, read over `--from` to
/// `--to` (a bound not given: unbounded).
fn store_source(
    data_dir: Option<PathBuf>,
    database_url: Option<String>,
    from: Option<String>,
    to: Option<String>,
) -> anyhow::Result<Option<lagscope::analyze::StoreSource>> {
    if data_dir.is_none() && database_url.is_none() {
        return Ok(None);
    }
    let range = lagscope_store::TimeRange {
        from: time("--from", from)?.unwrap_or(i64::MIN),
        to: time("--to", to)?.unwrap_or(i64::MAX),
    };
    Ok(Some(lagscope::analyze::StoreSource { database_url, data_dir: data_dir.unwrap_or_default(), range }))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Convert { out, progress, captures } => {
            let written = lagscope::lscap::convert(&captures, &out, progress.progress()?)?;
            eprintln!(
                "wrote {}: {} spans, {} numeric samples and {} recognised log lines from {} export requests ({} \
                 histogram or summary points and {} other log records not carried: no detector reads them)",
                out.display(),
                written.spans,
                written.samples,
                written.log_events,
                written.requests,
                written.skipped_samples,
                written.log_records as u64 - written.log_events
            );
            Ok(())
        }
        Command::Migrate { action, data_dir, database_url } => {
            let target = match database_url {
                Some(url) => lagscope::migrate::Target::Postgres(url),
                None => lagscope::migrate::Target::Sqlite(data_dir),
            };
            let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
            let states = runtime.block_on(lagscope::migrate::run(action, &target))?;
            eprintln!("store: {}", target.describe());
            print!("{}", lagscope::migrate::render(&states));
            let pending = states.iter().filter(|state| !state.applied).count();
            let modified = states.iter().filter(|state| state.modified).count();
            eprintln!("{} migrations: {} applied, {pending} pending", states.len(), states.len() - pending);
            anyhow::ensure!(modified == 0, "{modified} applied migrations differ from this build's files");
            Ok(())
        }
        Command::Alerts { action: AlertsAction::Test { config, receiver } } => {
            let config = lagscope::Config::load(config.as_deref())?;
            let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
            let answer = runtime.block_on(lagscope::alerting::send_test(&config.alerts, &receiver))?;
            eprintln!("{answer}");
            Ok(())
        }
        Command::Import { data_dir, database_url, files } => {
            let counts = lagscope::dump::import(&files, &data_dir, database_url.as_deref())?;
            eprintln!("imported {counts}");
            Ok(())
        }
        Command::Export(args) => export(args),
        Command::Serve(args) => serve(args),
        Command::Analyze(args) => analyze(args),
        Command::Sim(args) => sim(args),
        Command::Eval(args) => eval_command(args),
    }
}

fn export(args: ExportArgs) -> anyhow::Result<()> {
    let ExportArgs { parquet, dump, data_dir, database_url, cluster, namespace, from, to, step, max_spans, captures } =
        args;
    if let Some(dump) = dump {
        let counts = lagscope::dump::export_dump(&dump, &data_dir, database_url.as_deref())?;
        eprintln!("dumped {counts} to {}", dump.display());
        return Ok(());
    }
    // clap requires one of --parquet and --dump.
    let parquet = parquet.context("--parquet DIR or --dump FILE is required")?;
    let request = lagscope::export::ExportRequest {
        dir: parquet.clone(),
        captures,
        data_dir,
        database_url,
        cluster,
        namespace,
        from: time("--from", from)?,
        to: time("--to", to)?,
        step_seconds: step.as_deref().map(lagscope_web::parse_step).transpose().map_err(anyhow::Error::msg)?,
        max_spans,
    };
    let report = lagscope::export::export(&request)?;
    lagscope::export::print_report(&report, &parquet);
    Ok(())
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let ServeArgs { config, data_dir, database_url, listen, otlp_http, otlp_grpc, dashboards, demo } = args;
    let mut config = Config::load(config.as_deref())?;
    if let Some(dashboards) = dashboards {
        config.server.dashboards_dir = Some(dashboards);
    }
    if let Some(data_dir) = data_dir {
        config.server.data_dir = data_dir;
    }
    if let Some(database_url) = database_url {
        config.server.database_url = Some(database_url);
        config.validate().map_err(|message| anyhow::anyhow!("invalid configuration: {message}"))?;
    }
    if let Some(listen) = listen {
        config.server.listen = listen;
    }
    if let Some(otlp_http) = otlp_http {
        config.server.otlp_http = otlp_http;
    }
    if let Some(otlp_grpc) = otlp_grpc {
        config.server.otlp_grpc = otlp_grpc;
    }
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(async {
        let server = Server::start(&config).await?;
        let data = match &config.server.database_url {
            Some(_) => "PostgreSQL (--database-url)".to_string(),
            None => config.server.data_dir.display().to_string(),
        };
        eprintln!(
            "lagscope: API on http://{}  OTLP/HTTP on http://{}  OTLP/gRPC on {}  data in {data}",
            server.api_addr, server.otlp_http_addr, server.otlp_grpc_addr,
        );
        if demo {
            let target = lagscope::sim_cmd::Target::OtlpHttp(format!("http://{}", server.otlp_http_addr));
            std::thread::Builder::new()
                .name("demo".to_string())
                .spawn(move || feed_demo(&target))
                .context("cannot start the demo feed")?;
            eprintln!(
                "lagscope demo: feeding the simulator's mixed scenario in real time; open http://{}/",
                server.api_addr
            );
        }
        server.run_until(shutdown_signal()).await
    })
}

fn analyze(args: AnalyzeArgs) -> anyhow::Result<()> {
    let AnalyzeArgs { format, config, kinds, decode_threads, progress, data_dir, database_url, from, to, paths } = args;
    let config = Config::load(config.as_deref())?;
    let progress = progress.progress()?;
    // Lines of serde_json's text, written by the model's faster JSON writer one after
    // another into one buffer and handed to stdout a few hundred kilobytes at a time
    // (not copied once more through a line buffer: the 10 M capture writes 1.1 GB), on
    // a thread of its own (`output`: a write blocked on a busy disk does not stop the
    // analysis). A chunk only ever holds whole lines: a line that fails to serialize is
    // taken back.
    const WRITE_CHUNK: usize = 1 << 18;
    let mut output = lagscope::output::ChunkWriter::spawn(std::io::stdout(), 8)
        .context("cannot start the thread writing the anomalies")?;
    let mut lines = Vec::with_capacity(WRITE_CHUNK + (1 << 14));
    let mut write_line = |anomaly: &lagscope_model::Anomaly| -> anyhow::Result<()> {
        let whole = lines.len();
        if let Err(error) = lagscope_model::json::write(&mut lines, anomaly) {
            lines.truncate(whole);
            return Err(error.into());
        }
        lines.push(b'\n');
        if lines.len() >= WRITE_CHUNK {
            lines = output.write(std::mem::take(&mut lines))?;
        }
        Ok(())
    };
    let emit: Option<lagscope::analyze::Emit<'_>> = if format == Format::Jsonl { Some(&mut write_line) } else { None };
    let threads = decode_threads.map_or_else(lagscope::analyze::default_decode_threads, usize::from);
    let analyzed = if let Some(source) = store_source(data_dir, database_url, from, to)? {
        lagscope::analyze::analyze_store_emitting(&source, &config.analyzer, &kinds, emit, progress)
    } else {
        analyze_paths_emitting(&paths, &config.analyzer, &kinds, emit, threads, progress)
    };
    // The anomalies written before any error are kept.
    output.write(lines)?;
    output.finish()?;
    let report = analyzed?;
    let source = match &report.store {
        Some(store) => format!("read {store}"),
        None => format!("read {} export requests from {} file(s)", report.requests, paths.len()),
    };
    eprintln!(
        "{source}: {} spans, {} metric samples, {} log records; {} anomalies",
        report.spans, report.samples, report.log_records, report.anomaly_count
    );
    let timings = report.timings;
    let total = timings.read + timings.detectors + timings.writing;
    // Decoding on other threads, `read` is what the engine waited for.
    let decoded_on = match timings.json_decode_threads {
        Some(threads) if threads > 1 => format!(" (waited for: OTLP JSON decoded on {threads} threads)"),
        _ => String::new(),
    };
    eprintln!(
        "took {total:.2} s ({:.0} spans/s): read and decode {:.2} s{decoded_on}, detectors {:.2} s, writing \
         anomalies {:.2} s",
        report.spans as f64 / total.max(1e-9),
        timings.read,
        timings.detectors,
        timings.writing
    );
    if let Some(stats) = report.stream {
        eprintln!(
            "streaming engine: {} calls of {} clients (at most {} at a time, {} finished early when idle), longest \
             call {:.1} s; at most {} spans waiting to join and {} calls open; {} attempts later than the \
             horizon, {} router/server spans never joined, {} duplicates (spans and log lines sent again) taken once",
            stats.calls,
            stats.clients,
            stats.peak_clients,
            stats.evicted_clients,
            stats.longest_call_nanos as f64 / 1e9,
            stats.peak_pending_spans,
            stats.peak_open_calls,
            stats.late_attempts,
            stats.unjoined_hops,
            stats.duplicates
        );
    }
    let mut stdout = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    match format {
        Format::Json => write_json(&mut stdout, &report.anomalies),
        Format::Jsonl => Ok(()),
        Format::Table => write_table(&mut stdout, &report.anomalies),
    }
}

fn sim(args: SimArgs) -> anyhow::Result<()> {
    let SimArgs {
        list,
        scenario,
        run,
        out,
        otlp_http,
        otlp_grpc,
        truth,
        realtime,
        in_flight,
        delivery,
        serve_native,
        progress,
    } = args;
    if list {
        for info in lagscope_sim::scenarios() {
            println!("{:<36} {:<10} {}", info.name, info.system, info.summary);
        }
        return Ok(());
    }
    let mut config = run.config(scenario.as_deref().unwrap_or_default())?;
    if realtime {
        config.start_unix_nano = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(lagscope_sim::DEFAULT_START_UNIX_NANO, |now| now.as_nanos() as i64);
    }
    if in_flight > 1 && out.is_some() {
        anyhow::bail!("--in-flight {in_flight} applies to exports sent with --otlp-http or --otlp-grpc, not to a file");
    }
    let target = match (out, otlp_http, otlp_grpc) {
        (Some(path), _, _) if lagscope::lscap::is_lscap(&path) => sim_cmd::Target::Lscap(path),
        (Some(path), _, _) => sim_cmd::Target::JsonLines(path),
        (_, Some(url), _) => sim_cmd::Target::OtlpHttp(url),
        (_, _, Some(url)) => sim_cmd::Target::OtlpGrpc(url),
        _ => {
            anyhow::bail!("say where the telemetry goes: --out FILE.jsonl, --otlp-http URL or --otlp-grpc URL")
        }
    };
    let native = serve_native.as_ref().map(|_| sim_cmd::NativeHandle::default());
    let native_runtime = match (&serve_native, &native) {
        (Some(address), Some(handle)) => Some(start_native_server(address, handle.clone())?),
        _ => None,
    };
    let started = std::time::Instant::now();
    let sending = sim_cmd::Sending { realtime, in_flight: usize::from(in_flight), delivery: delivery.delivery()? };
    let (run_truth, requests) = sim_cmd::run_with_native(&config, &target, &sending, native, progress.progress()?)?;
    eprintln!(
        "sim {}: {} export requests, {} spans, {} expected anomalies, {:.2} s wall",
        config.scenario,
        requests,
        run_truth.figures.get("spans").and_then(|value| value.as_u64()).unwrap_or(0),
        run_truth.anomalies.len(),
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = truth {
        let text = serde_json::to_string_pretty(&run_truth)?;
        std::fs::write(&path, text + "\n").with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some((runtime, address)) = native_runtime {
        eprintln!("sim: the run is over; native endpoints stay up on http://{address} until Ctrl-C");
        runtime.block_on(shutdown_signal());
    }
    Ok(())
}

fn eval_command(args: EvalArgs) -> anyhow::Result<()> {
    let EvalArgs {
        scenario,
        run,
        delivery,
        format,
        config,
        truth,
        data_dir,
        database_url,
        stored,
        from,
        to,
        progress,
        captures,
    } = args;
    let config = Config::load(config.as_deref())?;
    if let Some(truth) = truth {
        let given_range = from.is_some() || to.is_some();
        let recorded = if let Some(source) = store_source(data_dir, database_url, from, to)? {
            if stored { eval::Recorded::Stored(source) } else { eval::Recorded::Store(source) }
        } else if stored {
            anyhow::bail!("--stored scores what a store holds: give --data-dir or --database-url");
        } else if given_range {
            anyhow::bail!("--from and --to choose what of a store is read; capture files are read whole");
        } else if captures.is_empty() {
            anyhow::bail!(
                "--truth {}: give the run's capture files, or --data-dir or --database-url for the store it \
                 was sent to",
                truth.display()
            );
        } else {
            eval::Recorded::Captures(captures)
        };
        return eval::run_recorded(&truth, recorded, format == Format::Json, &config.analyzer, progress.progress()?);
    }
    let names: Vec<String> = if scenario == "all" {
        lagscope_sim::scenarios().iter().map(|info| info.name.to_string()).collect()
    } else {
        vec![scenario]
    };
    let runs = names.iter().map(|name| run.config(name)).collect::<anyhow::Result<Vec<_>>>()?;
    let delivery = delivery.delivery()?;
    eval::run(&runs, delivery, format == Format::Json, &config.analyzer)
}

/// Serves the native endpoints on their own runtime; returns it and the bound address.
fn start_native_server(
    address: &str,
    handle: sim_cmd::NativeHandle,
) -> anyhow::Result<(tokio::runtime::Runtime, std::net::SocketAddr)> {
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(address))
        .with_context(|| format!("cannot listen on {address} for --serve-native"))?;
    let bound = listener.local_addr()?;
    runtime.spawn(async move {
        if let Err(error) = axum::serve(listener, lagscope::native_server::router(handle)).await {
            tracing::error!(%error, "native endpoint server failed");
        }
    });
    eprintln!("sim: native endpoints on http://{bound}/ (Hadoop /jmx, node stats, Prometheus /metrics)");
    Ok((runtime, bound))
}

/// `serve --demo`: the simulator's `mixed` scenario, in real time and timestamped now, round
/// after round (a new seed each time), into the service's own OTLP/HTTP receiver. Each round's
/// clusters and clients are named after it (`round-2.hdfs-publish-race.hdfs-prod`): a round
/// starts its clusters' state ids over and its clients are new sessions, which, under the
/// names of the round before, would be state going back and sessions that forgot what they
/// saw (anomalies the demo did not stage).
fn feed_demo(target: &lagscope::sim_cmd::Target) {
    for round in 1u64.. {
        let mut config = lagscope_sim::SimConfig::new("mixed");
        config.seed = round;
        config.start_unix_nano = jiff::Timestamp::now().as_nanosecond() as i64;
        config.name_prefix = Some(format!("round-{round}"));
        match lagscope::sim_cmd::run(&config, target, true) {
            Ok((truth, _)) => eprintln!(
                "lagscope demo: round {round} sent {} spans ({} anomalies expected); starting round {}",
                truth.figures["spans"],
                truth.anomalies.len(),
                round + 1
            ),
            Err(error) => {
                eprintln!("lagscope demo: the feed stopped: {error:#}");
                return;
            }
        }
    }
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {},
        () = terminate => {},
    }
}

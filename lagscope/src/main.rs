use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

use lagscope::analyze::{Format, analyze_paths_emitting, write_json, write_table};
use lagscope::{Config, Server};
use lagscope::{eval, sim_cmd};
use tracing_subscriber::EnvFilter;

// The analyzer and the decoders allocate many small strings: mimalloc cuts offline analysis
// time by about a third against the system allocator (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod cli_args;

use cli_args::{AlertsAction, AnalyzeArgs, Cli, Command, EvalArgs, ExportArgs, ServeArgs, SimArgs};

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
            let captures = lagscope::analyze::capture_files(&captures)?;
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
    let ExportArgs {
        parquet,
        dump,
        data_dir,
        database_url,
        cluster,
        namespace,
        from,
        to,
        step,
        max_spans,
        captures,
        progress,
    } = args;
    if let Some(dump) = dump {
        let counts = lagscope::dump::export_dump(&dump, &data_dir, database_url.as_deref())?;
        eprintln!("dumped {counts} to {}", dump.display());
        return Ok(());
    }
    // clap requires one of --parquet and --dump.
    let parquet = parquet.context("--parquet DIR or --dump FILE is required")?;
    let request = lagscope::export::ExportRequest {
        dir: parquet.clone(),
        captures: lagscope::analyze::capture_files(&captures)?,
        data_dir,
        database_url,
        cluster,
        namespace,
        from: time("--from", from)?,
        to: time("--to", to)?,
        step_seconds: step.as_deref().map(lagscope_web::parse_step).transpose().map_err(anyhow::Error::msg)?,
        max_spans,
        progress: progress.progress()?,
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
            let first_round = match server.store() {
                Some(store) => next_demo_round(store.as_ref()).await?,
                None => 1,
            };
            std::thread::Builder::new()
                .name("demo".to_string())
                .spawn(move || feed_demo(&target, first_round))
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
    let paths = lagscope::analyze::capture_files(&paths)?;
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
    let source = report.what_was_read();
    eprintln!(
        "{source}: {} spans, {} metric samples, {} log records; {} anomalies",
        report.spans, report.samples, report.log_records, report.anomaly_count
    );
    let timings = report.timings;
    let total = timings.read + timings.detectors + timings.writing;
    // Decoding on other threads, `read` is what the engine waited for.
    let decoded_on = match timings.otlp_decode_threads {
        Some(threads) if threads > 1 => format!(" (waited for: OTLP decoded on {threads} threads)"),
        _ if timings.read_ahead => " (waited for: the store's pages read ahead on other threads)".to_owned(),
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
        if report.spans > 0 && stats.calls == 0 {
            // Telemetry from plain instrumentation: say why nothing could be checked.
            eprintln!(
                "note: none of the {} spans is a client's attempt (a span carrying lagscope.client.id from a \
                 client: its resource's lagscope.component is client, or the span is of CLIENT kind), so no \
                 client's guarantees could be checked; docs/telemetry-conventions.md says what to send",
                report.spans
            );
        }
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
        (Some(path), _, _) if path.extension().is_some_and(|extension| extension == "binpb") => {
            sim_cmd::Target::Proto(path)
        }
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
            eval::Recorded::Captures(lagscope::analyze::capture_files(&captures)?)
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
/// saw (anomalies the demo did not stage). A demo started again on the same store goes on from
/// the rounds it holds ([`next_demo_round`]).
fn feed_demo(target: &lagscope::sim_cmd::Target, first_round: u64) {
    for round in first_round.. {
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

/// The round after the last one the store holds telemetry of (`round-N.` clusters), 1 for a
/// store without any: a demo started again on the same data goes on from where it stopped
/// instead of sending a round's names again with its state ids started over.
async fn next_demo_round(store: &dyn lagscope_store::Store) -> anyhow::Result<u64> {
    let scopes = store.scopes().await.context("cannot read the store's clusters for the demo")?;
    let last = (scopes.iter())
        .filter_map(|scope| scope.cluster.as_deref()?.strip_prefix("round-")?.split_once('.')?.0.parse::<u64>().ok())
        .max();
    if let Some(last) = last {
        eprintln!("lagscope demo: the store holds rounds up to {last}; going on with round {}", last + 1);
    }
    Ok(last.map_or(1, |last| last + 1))
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

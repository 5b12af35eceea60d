use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use lagscope::analyze::{Format, analyze_paths, write_json, write_table};
use lagscope::{Config, Server};
use tracing_subscriber::EnvFilter;

/// lagscope: lag analytics and consistency checking for replicated storage systems.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the collectors, the live analyzer and the API on an embedded SQLite store.
    Serve {
        /// TOML configuration file (see config/lagscope.example.toml).
        #[arg(long, env = "LAGSCOPE_CONFIG")]
        config: Option<PathBuf>,
        /// Directory of the embedded store [default: ./lagscope-data]
        #[arg(long, env = "LAGSCOPE_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// Address of the HTTP API [default: 127.0.0.1:8080]; port 0 picks a free port.
        #[arg(long, env = "LAGSCOPE_LISTEN")]
        listen: Option<String>,
        /// Address of the OTLP/HTTP receiver [default: 127.0.0.1:4318]; port 0 picks a free port.
        #[arg(long, env = "LAGSCOPE_OTLP_HTTP")]
        otlp_http: Option<String>,
    },
    /// Run every detector over captured OTLP JSON (one export request per file, or JSON lines
    /// of them as the OpenTelemetry Collector's file exporter writes; .gz too).
    Analyze {
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
        /// TOML configuration file; its [analyzer] section sets the detectors' thresholds.
        #[arg(long, env = "LAGSCOPE_CONFIG")]
        config: Option<PathBuf>,
        /// Capture files.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("LAGSCOPE_LOG").unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve { config, data_dir, listen, otlp_http } => {
            let mut config = Config::load(config.as_deref())?;
            if let Some(data_dir) = data_dir {
                config.server.data_dir = data_dir;
            }
            if let Some(listen) = listen {
                config.server.listen = listen;
            }
            if let Some(otlp_http) = otlp_http {
                config.server.otlp_http = otlp_http;
            }
            let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
            runtime.block_on(async {
                let server = Server::start(&config).await?;
                eprintln!(
                    "lagscope: API on http://{}  OTLP/HTTP on http://{}  data in {}",
                    server.api_addr,
                    server.otlp_http_addr,
                    config.server.data_dir.display()
                );
                server.run_until(shutdown_signal()).await
            })
        }
        Command::Analyze { format, config, paths } => {
            let config = Config::load(config.as_deref())?;
            let report = analyze_paths(&paths, &config.analyzer)?;
            eprintln!(
                "read {} export requests from {} file(s): {} spans, {} metric samples, {} log records; {} anomalies",
                report.requests,
                paths.len(),
                report.spans,
                report.samples,
                report.log_records,
                report.anomalies.len()
            );
            let mut stdout = std::io::stdout().lock();
            match format {
                Format::Json => write_json(&mut stdout, &report.anomalies),
                Format::Table => write_table(&mut stdout, &report.anomalies),
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

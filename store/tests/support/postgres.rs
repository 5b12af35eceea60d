//! A throwaway PostgreSQL for tests: `LAGSCOPE_TEST_DATABASE_URL` when set (a server the
//! caller runs; each test gets a fresh database on it), else a cluster this process starts
//! with Debian's `initdb` and `pg_ctl`-equivalent binaries (package `postgresql-15`), as the
//! `postgres` OS user when running as root, in a temp dir, on a free loopback port, stopped
//! by a watchdog when the test process exits. Missing PostgreSQL fails the test loudly: it is
//! never skipped. Test clusters run with fsync off (nothing here tests the disk);
//! [`fresh_durable_database`] starts one with PostgreSQL's durable defaults for benchmarks.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The server's base URL (without a database name).
fn server() -> &'static str {
    static SERVER: OnceLock<String> = OnceLock::new();
    SERVER.get_or_init(|| match std::env::var("LAGSCOPE_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => url.rsplit_once('/').map_or(url.clone(), |(base, _)| base.to_string()),
        _ => start_cluster(false),
    })
}

/// A cluster this process starts with fsync on (PostgreSQL's defaults: a commit is on disk),
/// for benchmarks of durable ingest.
fn durable_server() -> &'static str {
    static SERVER: OnceLock<String> = OnceLock::new();
    SERVER.get_or_init(|| start_cluster(true))
}

/// A fresh, empty database on the test server: its URL.
pub async fn fresh_database() -> String {
    database_on(server()).await
}

/// A fresh database on a durable cluster (fsync on) started by this process.
pub async fn fresh_durable_database() -> String {
    database_on(durable_server()).await
}

async fn database_on(base: &str) -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let name = format!("lagscope_test_{}_{}", std::process::id(), COUNTER.fetch_add(1, Ordering::SeqCst));
    let admin = format!("{base}/postgres");
    let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(&admin)
        .await
        .unwrap_or_else(|error| panic!("cannot connect to the test PostgreSQL at {admin}: {error}"));
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut connection)
        .await
        .unwrap_or_else(|error| panic!("cannot create database {name}: {error}"));
    format!("{base}/{name}")
}

fn postgres_bin() -> PathBuf {
    let listed = Command::new("dpkg").args(["-L", "postgresql-15"]).output().ok();
    let from_dpkg = listed.and_then(|output| {
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .find(|line| line.ends_with("/bin/initdb"))
            .and_then(|line| Path::new(line).parent().map(Path::to_path_buf))
    });
    let found = from_dpkg.or_else(|| {
        let fallback = PathBuf::from("/usr/lib/postgresql/15/bin");
        fallback.join("initdb").exists().then_some(fallback)
    });
    found.unwrap_or_else(|| {
        panic!(
            "PostgreSQL is not installed: these tests need Debian's postgresql-15 package (initdb, postgres) or \
             LAGSCOPE_TEST_DATABASE_URL pointing at a server. Install it with `apt-get install -y postgresql-15` \
             (.ci/run does)."
        )
    })
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|output| String::from_utf8_lossy(&output.stdout).trim() == "0")
}

/// Runs `program args` as the `postgres` user when root (PostgreSQL refuses to run as root).
fn as_server_user(program: &Path, args: &[&str]) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program).args(args);
        command
    } else {
        let mut command = Command::new(program);
        command.args(args);
        command
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|listener| listener.local_addr()).map_or(55432, |a| a.port())
}

fn start_cluster(durable: bool) -> String {
    let bin = postgres_bin();
    let directory = tempfile::Builder::new().prefix("lagscope-pg-").tempdir().expect("temp dir").keep();
    let (data, socket) = (directory.join("data"), directory.join("sock"));
    std::fs::create_dir_all(&data).expect("data dir");
    std::fs::create_dir_all(&socket).expect("socket dir");
    if is_root() {
        let exists = Command::new("id").arg("postgres").output().is_ok_and(|output| output.status.success());
        if !exists {
            let status = Command::new("useradd").args(["--system", "--no-create-home", "postgres"]).status();
            assert!(status.is_ok_and(|status| status.success()), "cannot create the postgres OS user");
        }
        let status = Command::new("chown").args(["-R", "postgres"]).arg(&directory).status();
        assert!(status.is_ok_and(|status| status.success()), "cannot chown {}", directory.display());
    }
    let output = as_server_user(
        &bin.join("initdb"),
        &["-D", &data.to_string_lossy(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"],
    )
    .output()
    .expect("initdb runs");
    assert!(output.status.success(), "initdb failed: {}", String::from_utf8_lossy(&output.stderr));
    let port = free_port();
    let log = directory.join("server.log");
    // The server, and a watchdog that stops it (fast shutdown) and removes its directory once
    // this test process is gone: the watchdog waits for EOF on a pipe whose write end only this
    // process holds.
    let script = format!(
        "{postgres} -D {data} -k {socket} -h 127.0.0.1 -p {port} -c fsync={fsync} -c max_connections=200 \
         > {log} 2>&1 & server=$!; read _; kill -INT $server 2>/dev/null; wait $server; rm -rf {directory}",
        fsync = if durable { "on" } else { "off" },
        postgres = bin.join("postgres").display(),
        data = data.display(),
        socket = socket.display(),
        log = log.display(),
        directory = directory.display(),
    );
    // Kept (with its stdin) for the life of the process, never waited on: exiting closes it.
    static WATCHDOGS: std::sync::Mutex<Vec<std::process::Child>> = std::sync::Mutex::new(Vec::new());
    let watchdog = as_server_user(Path::new("/bin/sh"), &["-c", &script])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("postgres starts");
    WATCHDOGS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(watchdog);
    let url = format!("postgres://postgres@127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            let ready =
                Command::new(bin.join("pg_isready")).args(["-h", "127.0.0.1", "-p", &port.to_string()]).status();
            if ready.is_ok_and(|status| status.success()) {
                break;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "PostgreSQL did not start within 30 s: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    url
}

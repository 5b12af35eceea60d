//! The offline commands' access to a store (`analyze`, `export`, `export --dump`, `import`):
//! opening it by `--data-dir` or `--database-url` (a time-ordered table of it is read a page
//! at a time by `lagscope_store::paging`).

use std::path::Path;

use anyhow::{Context, bail};
use lagscope_store::{PgStore, SqliteStore, Store};

pub(crate) use lagscope_store::paging::PAGE;

/// The store at `database_url` (PostgreSQL) or in `data_dir` (SQLite), and how to name it in
/// messages. `missing`: when there is no SQLite store in `data_dir`, refuse with this advice
/// instead of creating an empty one.
pub(crate) async fn open(
    database_url: Option<&str>,
    data_dir: &Path,
    missing: Option<&str>,
) -> anyhow::Result<(String, Box<dyn Store>)> {
    match database_url {
        Some(url) => {
            let name = format!("PostgreSQL {}", lagscope_store::redact_url(url));
            let store = PgStore::connect(url).await.with_context(|| format!("cannot open {name}"))?;
            Ok((name, Box::new(store)))
        }
        None => {
            let file = data_dir.join(lagscope_store::sqlite_database_file());
            if let Some(advice) = missing
                && !file.exists()
            {
                bail!("no store at {} ({advice})", file.display());
            }
            let store = SqliteStore::open_dir(data_dir)
                .await
                .with_context(|| format!("cannot open the store in {}", data_dir.display()))?;
            Ok((file.display().to_string(), Box::new(store)))
        }
    }
}

/// The single-threaded runtime the offline commands run their store queries on.
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the async runtime")
}

/// A runtime whose tasks run on `threads` threads of their own (what `block_on` runs stays on
/// the calling thread).
pub(crate) fn runtime_on_threads(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("lagscope-read")
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

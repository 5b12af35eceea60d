//! `lagscope migrate [status|apply]`: the store's schema migrations, for the embedded SQLite
//! file or a PostgreSQL database (`--database-url`). `serve` applies them at start-up too;
//! this command lets an operator see and apply them before rolling instances out.

use std::path::PathBuf;

use anyhow::Context;
use lagscope_store::{MigrationState, PgStore, SqliteStore};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Action {
    /// List the migrations and whether the database has each (changes nothing).
    Status,
    /// Apply the pending migrations.
    Apply,
}

/// Where the store is.
#[derive(Debug, Clone)]
pub enum Target {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Target {
    pub fn describe(&self) -> String {
        match self {
            Self::Sqlite(data_dir) => {
                format!("SQLite {}", data_dir.join(lagscope_store::sqlite_database_file()).display())
            }
            Self::Postgres(url) => format!("PostgreSQL {}", lagscope_store::redact_url(url)),
        }
    }
}

/// Runs `action` and returns the migrations' states afterwards.
pub async fn run(action: Action, target: &Target) -> anyhow::Result<Vec<MigrationState>> {
    if action == Action::Apply {
        let context = || format!("cannot apply the migrations to {}", target.describe());
        match target {
            Target::Sqlite(data_dir) => SqliteStore::open_dir(data_dir).await.with_context(context)?.close().await,
            Target::Postgres(url) => PgStore::connect(url).await.with_context(context)?.close().await,
        }
    }
    let states = match target {
        Target::Sqlite(data_dir) => {
            SqliteStore::migration_status(&data_dir.join(lagscope_store::sqlite_database_file())).await
        }
        Target::Postgres(url) => PgStore::migration_status(url).await,
    };
    states.with_context(|| format!("cannot read the migrations of {}", target.describe()))
}

/// One line per migration: version, description, state.
pub fn render(states: &[MigrationState]) -> String {
    let mut out = String::new();
    for state in states {
        let status = match (state.applied, state.modified) {
            (true, false) => "applied",
            (true, true) => "applied, but its file has changed since",
            (false, _) => "pending",
        };
        out.push_str(&format!("{:04}  {:<40}  {status}\n", state.version, state.description));
    }
    out
}

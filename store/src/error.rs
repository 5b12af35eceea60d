use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("cannot open the store at {path}: {source}")]
    Open { path: String, source: sqlx::Error },
    #[error("cannot apply the store's migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("store query failed: {0}")]
    Query(#[from] sqlx::Error),
    #[error("stored {what} is corrupt: {detail}")]
    Corrupt { what: &'static str, detail: String },
    #[error(
        "{running} ingest(s) still running after {waited:?}: what they write is not yet known to be committed in order, \
         so the span feed cannot answer yet"
    )]
    Unsettled { running: usize, waited: std::time::Duration },
    #[error("more rows share one instant than one read can hold")]
    InstantTooLarge,
    #[error("the reading of the {what} stopped before their last page")]
    ReadStopped { what: &'static str },
}

-- Per node and minute, how stale the reads it served were (lagscope_model::ReadRollup),
-- written by the live analyzer as data arrives so that pages read a few rows per node and
-- minute instead of every read. An absent cluster, namespace or node is '' (a key column
-- cannot hold NULL and stay unique). Histograms are JSON [[bucket, count], ...].
CREATE TABLE read_rollups (
    minute_unix_nano   INTEGER NOT NULL,
    cluster            TEXT    NOT NULL,
    namespace          TEXT    NOT NULL,
    node_id            TEXT    NOT NULL,
    reads              INTEGER NOT NULL,
    compared           INTEGER NOT NULL,
    behind_reads       INTEGER NOT NULL,
    behind_states      TEXT    NOT NULL,
    behind_millis      TEXT    NOT NULL,
    max_behind_states  INTEGER,
    max_behind_seconds REAL,
    PRIMARY KEY (minute_unix_nano, cluster, namespace, node_id)
) WITHOUT ROWID;

-- A series is a metric name plus its full label set (resource attributes merged with the
-- data point's). Samples reference their series; the conventions' labels are promoted so
-- that the analyzer's per-node and per-namespace lookups use an index.
CREATE TABLE series (
    id          INTEGER PRIMARY KEY,
    name        TEXT NOT NULL,
    labels      TEXT NOT NULL,              -- canonical JSON object, keys sorted
    kind        TEXT NOT NULL,
    unit        TEXT,
    description TEXT,
    cluster     TEXT,
    namespace   TEXT,
    node_id     TEXT,
    UNIQUE (name, labels)
);

CREATE INDEX series_by_name_scope ON series (name, cluster, namespace, node_id);

-- "one series over a time range": the primary key is the range index.
CREATE TABLE samples (
    series_id            INTEGER NOT NULL REFERENCES series (id),
    time_unix_nano       INTEGER NOT NULL,
    start_time_unix_nano INTEGER,
    value                REAL,              -- NULL for distributions and NaN
    distribution         TEXT,              -- JSON histogram/summary point
    PRIMARY KEY (series_id, time_unix_nano)
) WITHOUT ROWID;

-- Per node and minute, how stale the reads it served were (lagscope_model::ReadRollup),
-- written by the live analyzer as data arrives so that pages read a few rows per node and
-- minute instead of every read. An absent cluster, namespace or node is '' (a key column
-- cannot hold NULL). Histograms are JSON [[bucket, count], ...]. Small (one row per node and
-- minute): not partitioned; retention deletes by minute. Distribution key: cluster.
CREATE TABLE read_rollups (
    minute_unix_nano   BIGINT           NOT NULL,
    cluster            TEXT             NOT NULL,
    namespace          TEXT             NOT NULL,
    node_id            TEXT             NOT NULL,
    reads              BIGINT           NOT NULL,
    compared           BIGINT           NOT NULL,
    behind_reads       BIGINT           NOT NULL,
    behind_states      TEXT             NOT NULL,
    behind_millis      TEXT             NOT NULL,
    max_behind_states  BIGINT,
    max_behind_seconds DOUBLE PRECISION,
    PRIMARY KEY (minute_unix_nano, cluster, namespace, node_id)
);

-- lagscope's PostgreSQL schema: the same tables and columns as the SQLite schema
-- (migrations/sqlite), with the large tables (spans, samples, logs) partitioned by time.
--
-- Partitions are daily ranges of Unix nanoseconds named <table>_pYYYYMMDD, created ahead of
-- time by the store (store/src/postgres/partitions.rs) at start-up, hourly, and for the days a
-- batch brings; whatever falls outside them lands in the DEFAULT partition. Retention drops
-- whole daily partitions. JSON columns are TEXT holding JSON (as in SQLite): they accept every
-- string a sender can send (jsonb refuses \u0000) and cast to jsonb in queries.
--
-- Every large table carries its distribution keys (cluster, client_id / series_id) and has no
-- foreign key to another large table, so that it can be distributed (ARCHITECTURE.md).

CREATE TABLE spans (
    id                  BIGSERIAL,
    trace_id            TEXT,
    span_id             TEXT,
    parent_span_id      TEXT,
    name                TEXT    NOT NULL,
    kind                INTEGER NOT NULL,
    start_unix_nano     BIGINT  NOT NULL,
    end_unix_nano       BIGINT  NOT NULL,
    status_code         INTEGER NOT NULL,
    status_message      TEXT,
    service_name        TEXT,
    system              TEXT,
    cluster             TEXT,
    component           TEXT,
    node_id             TEXT,
    resource_attributes TEXT    NOT NULL DEFAULT '{}',
    scope_name          TEXT,
    scope_version       TEXT,
    scope_attributes    TEXT    NOT NULL DEFAULT '{}',
    client_id           TEXT,
    call_id             TEXT,
    attempt             BIGINT,
    namespace           TEXT,
    op                  TEXT,
    rpc_method          TEXT,
    target_node         TEXT,
    target_role         TEXT,
    node_role           TEXT,
    consistency         TEXT,
    follower_read       BOOLEAN,
    state_carried       BIGINT,
    state_returned      BIGINT,
    state_served        BIGINT,
    state_committed     BIGINT,
    state_router        BIGINT,
    outcome             TEXT,
    error_type          TEXT,
    requeues            BIGINT,
    retry_delay_ms      BIGINT,
    bytes               BIGINT,
    attributes          TEXT    NOT NULL DEFAULT '{}',
    events              TEXT    NOT NULL DEFAULT '[]',
    links               TEXT    NOT NULL DEFAULT '[]'
) PARTITION BY RANGE (start_unix_nano);

CREATE TABLE spans_default PARTITION OF spans DEFAULT;

-- "one client's timeline over a time range"
CREATE INDEX spans_by_client_time ON spans (client_id, start_unix_nano) WHERE client_id IS NOT NULL;
-- joining a call's hops by trace context; unique (with the partition key, as PostgreSQL
-- requires) so that an exporter re-sending a batch whose answer it lost stores nothing twice
CREATE UNIQUE INDEX spans_by_trace ON spans (trace_id, span_id, start_unix_nano)
    WHERE trace_id IS NOT NULL AND span_id IS NOT NULL;
CREATE INDEX spans_by_trace_id ON spans (trace_id) WHERE trace_id IS NOT NULL;
CREATE INDEX spans_by_namespace_time ON spans (cluster, namespace, start_unix_nano);

CREATE TABLE series (
    id          BIGSERIAL PRIMARY KEY,
    name        TEXT NOT NULL,
    labels      TEXT NOT NULL,
    kind        TEXT NOT NULL,
    unit        TEXT,
    description TEXT,
    cluster     TEXT,
    namespace   TEXT,
    node_id     TEXT,
    UNIQUE (name, labels)
);

CREATE INDEX series_by_name_scope ON series (name, cluster, namespace, node_id);
CREATE INDEX series_by_scope ON series (cluster, namespace);

-- "one series over a time range": the primary key is the range index.
CREATE TABLE samples (
    series_id            BIGINT NOT NULL,
    time_unix_nano       BIGINT NOT NULL,
    start_time_unix_nano BIGINT,
    value                DOUBLE PRECISION,
    distribution         TEXT,
    PRIMARY KEY (series_id, time_unix_nano)
) PARTITION BY RANGE (time_unix_nano);

CREATE TABLE samples_default PARTITION OF samples DEFAULT;
CREATE INDEX samples_by_time ON samples (time_unix_nano);

CREATE TABLE anomalies (
    id                   BIGSERIAL PRIMARY KEY,
    fingerprint          TEXT    NOT NULL UNIQUE,
    kind                 TEXT    NOT NULL,
    severity             TEXT    NOT NULL,
    cluster              TEXT,
    namespace            TEXT,
    client_id            TEXT,
    node_id              TEXT,
    start_unix_nano      BIGINT  NOT NULL,
    end_unix_nano        BIGINT  NOT NULL,
    summary              TEXT    NOT NULL,
    cause                TEXT    NOT NULL,
    evidence             TEXT    NOT NULL,
    first_seen_unix_nano BIGINT  NOT NULL,
    last_seen_unix_nano  BIGINT  NOT NULL,
    open                 BOOLEAN NOT NULL DEFAULT false
);

CREATE INDEX anomalies_by_start ON anomalies (start_unix_nano);
CREATE INDEX anomalies_by_kind_start ON anomalies (kind, start_unix_nano);
CREATE INDEX anomalies_by_client ON anomalies (client_id, start_unix_nano);
CREATE INDEX anomalies_open ON anomalies (open, start_unix_nano) WHERE open;

CREATE TABLE logs (
    id                      BIGSERIAL,
    time_unix_nano          BIGINT  NOT NULL,
    observed_time_unix_nano BIGINT,
    severity_number         INTEGER NOT NULL,
    severity_text           TEXT,
    body                    TEXT    NOT NULL,
    event_name              TEXT,
    trace_id                TEXT,
    span_id                 TEXT,
    service_name            TEXT,
    system                  TEXT,
    cluster                 TEXT,
    component               TEXT,
    node_id                 TEXT,
    resource_attributes     TEXT    NOT NULL DEFAULT '{}',
    scope_name              TEXT,
    scope_version           TEXT,
    attributes              TEXT    NOT NULL DEFAULT '{}',
    -- the lines the analyzer recognises (analyzer/src/log_events.rs PHRASES; a test keeps
    -- the lists equal), as in SQLite's migration 0007
    recognised              BOOLEAN GENERATED ALWAYS AS (
        strpos(body, 'Cannot get available namenode for ') > 0
        OR strpos(body, 'No namenodes available under nameservice ') > 0
        OR strpos(body, 'Disable OM follower read and retry OM leader directly') > 0
        OR strpos(body, 'Observer Node is too far behind') > 0
        OR strpos(body, 'switch to the service ') > 0
        OR strpos(body, 'switch back to the primary service') > 0
        OR strpos(body, 'rejected execution of ') > 0
    ) STORED
) PARTITION BY RANGE (time_unix_nano);

CREATE TABLE logs_default PARTITION OF logs DEFAULT;

CREATE INDEX logs_by_time ON logs (time_unix_nano);
CREATE INDEX logs_by_node_time ON logs (cluster, node_id, time_unix_nano);
CREATE INDEX logs_by_cluster_time ON logs (cluster, time_unix_nano);
CREATE INDEX logs_recognised_by_cluster_time ON logs (cluster, time_unix_nano) WHERE recognised;

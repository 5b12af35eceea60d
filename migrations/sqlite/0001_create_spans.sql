-- One row per span (one attempt as one participant saw it). The telemetry conventions'
-- fields have columns of their own; everything else the sender sent is kept as JSON and
-- stays queryable with json_extract().
CREATE TABLE spans (
    id                  INTEGER PRIMARY KEY,
    trace_id            TEXT,
    span_id             TEXT,
    parent_span_id      TEXT,
    name                TEXT    NOT NULL,
    kind                INTEGER NOT NULL,
    start_unix_nano     INTEGER NOT NULL,
    end_unix_nano       INTEGER NOT NULL,
    status_code         INTEGER NOT NULL,
    status_message      TEXT,
    -- resource
    service_name        TEXT,
    system              TEXT,
    cluster             TEXT,
    component           TEXT,
    node_id             TEXT,
    resource_attributes TEXT    NOT NULL DEFAULT '{}',
    scope_name          TEXT,
    scope_version       TEXT,
    scope_attributes    TEXT    NOT NULL DEFAULT '{}',
    -- conventions
    client_id           TEXT,
    call_id             TEXT,
    attempt             INTEGER,
    namespace           TEXT,
    op                  TEXT,
    rpc_method          TEXT,
    target_node         TEXT,
    target_role         TEXT,
    node_role           TEXT,
    consistency         TEXT,
    follower_read       INTEGER,
    state_carried       INTEGER,
    state_returned      INTEGER,
    state_served        INTEGER,
    state_committed     INTEGER,
    state_router        INTEGER,
    outcome             TEXT,
    error_type          TEXT,
    requeues            INTEGER,
    retry_delay_ms      INTEGER,
    bytes               INTEGER,
    -- the rest
    attributes          TEXT    NOT NULL DEFAULT '{}',
    events              TEXT    NOT NULL DEFAULT '[]',
    links               TEXT    NOT NULL DEFAULT '[]'
);

-- "one client's timeline over a time range"
CREATE INDEX spans_by_client_time ON spans (client_id, start_unix_nano) WHERE client_id IS NOT NULL;
-- joining the router and server hops of a call by trace context; unique so that an
-- exporter re-sending a batch whose response it lost does not store the spans twice
CREATE UNIQUE INDEX spans_by_trace ON spans (trace_id, span_id)
    WHERE trace_id IS NOT NULL AND span_id IS NOT NULL;
-- per-node and per-namespace views
CREATE INDEX spans_by_namespace_time ON spans (cluster, namespace, start_unix_nano);

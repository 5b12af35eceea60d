-- One row per log record, body and attributes kept whole (JSON), the resource's conventions
-- promoted so that one node's or one cluster's lines over a time range use an index.
CREATE TABLE logs (
    id                      INTEGER PRIMARY KEY,
    time_unix_nano          INTEGER NOT NULL,
    observed_time_unix_nano INTEGER,
    severity_number         INTEGER NOT NULL,
    severity_text           TEXT,
    body                    TEXT    NOT NULL,     -- JSON
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
    attributes              TEXT    NOT NULL DEFAULT '{}'
);

CREATE INDEX logs_by_time ON logs (time_unix_nano);
CREATE INDEX logs_by_node_time ON logs (cluster, node_id, time_unix_nano);

-- Anomalies as the analyzer reported them. The fingerprint identifies one incident: finding
-- it again (a later analysis pass over more data) updates the row instead of adding one.
CREATE TABLE anomalies (
    id               INTEGER PRIMARY KEY,
    fingerprint      TEXT    NOT NULL UNIQUE,
    kind             TEXT    NOT NULL,
    severity         TEXT    NOT NULL,
    cluster          TEXT,
    namespace        TEXT,
    client_id        TEXT,
    node_id          TEXT,
    start_unix_nano  INTEGER NOT NULL,
    end_unix_nano    INTEGER NOT NULL,
    summary          TEXT    NOT NULL,
    cause            TEXT    NOT NULL,
    evidence         TEXT    NOT NULL,
    first_seen_unix_nano INTEGER NOT NULL,
    last_seen_unix_nano  INTEGER NOT NULL
);

CREATE INDEX anomalies_by_start ON anomalies (start_unix_nano);
CREATE INDEX anomalies_by_kind_start ON anomalies (kind, start_unix_nano);
CREATE INDEX anomalies_by_client ON anomalies (client_id, start_unix_nano);

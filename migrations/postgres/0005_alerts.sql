-- Alerting (lagscope::alerting): where the alerter is in the stream of anomaly changes, the
-- incidents it has paged per receiver, and the outbox of messages to deliver at least once.

-- The anomalies' stream of changes, in the order the alerter reads it.
CREATE INDEX anomalies_by_last_seen ON anomalies (last_seen_unix_nano, id);

-- One row: the last change the alerter has turned into incidents and messages.
CREATE TABLE alert_cursor (
    id                  INTEGER PRIMARY KEY CHECK (id = 1),
    last_seen_unix_nano BIGINT  NOT NULL,
    anomaly_id          BIGINT  NOT NULL
);

-- What each receiver has been told about each incident.
CREATE TABLE alert_incidents (
    receiver            TEXT    NOT NULL,
    incident            TEXT    NOT NULL,
    dedup_key           TEXT    NOT NULL,
    firing              BOOLEAN NOT NULL,
    alert               TEXT    NOT NULL,   -- lagscope_alerts::Alert as JSON
    latest_anomaly_id   BIGINT  NOT NULL,
    members             BIGINT  NOT NULL,
    last_member_unix_nano BIGINT  NOT NULL, -- wall clock of the latest member's change
    last_sent_unix_nano   BIGINT  NOT NULL, -- wall clock of the latest message enqueued
    PRIMARY KEY (receiver, incident)
);

-- Messages to deliver, oldest first per (receiver, dedup key); kept after delivery as the
-- delivery record (retention removes finished ones with the resolved anomalies).
CREATE TABLE alert_outbox (
    id                     BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    receiver               TEXT    NOT NULL,
    dedup_key              TEXT    NOT NULL,
    event                  TEXT    NOT NULL,   -- trigger, refresh, resolve or test
    body                   TEXT    NOT NULL,   -- what the receiver is sent (JSON)
    created_unix_nano      BIGINT  NOT NULL,
    attempts               BIGINT  NOT NULL DEFAULT 0,
    next_attempt_unix_nano BIGINT  NOT NULL,
    state                  TEXT    NOT NULL DEFAULT 'pending',  -- pending, delivered, failed
    finished_unix_nano     BIGINT,
    last_error             TEXT
);
CREATE INDEX alert_outbox_pending ON alert_outbox (id) WHERE state = 'pending';

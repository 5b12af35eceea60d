-- Several lagscope instances on one database (store/src/coordination.rs).
--
-- analysis_marks: what committed data asks the live analyzer to look at again (a client, a
-- trace, a (cluster, namespace) scope, a log cluster), written in the ingest transaction.
-- A mark written again gets a new seq (taken from the sequence when the row is locked, so
-- it only grows), and an analysed mark is removed only while its seq is the one read: a batch
-- committed during the analysis leaves its mark behind.
--
-- analysis_leases: the work is split into 64 shards (hash of the mark); an instance analyses
-- the marks of the shards whose lease it holds. Leases expire unless renewed; expired ones
-- are taken by the live instances (analysis_instances' heartbeats say which are live).
-- Small, hot, coordination-only tables: not partitioned, and never distributed.

CREATE SEQUENCE analysis_marks_seq;

-- Re-marking only changes seq, which no index holds, and pages keep room for the new row
-- version: the ingest transaction's update is a heap-only (HOT) update.
CREATE TABLE analysis_marks (
    kind  SMALLINT NOT NULL,
    key   TEXT     NOT NULL,
    shard INTEGER  NOT NULL,
    seq   BIGINT   NOT NULL,
    PRIMARY KEY (kind, key)
) WITH (fillfactor = 50);

CREATE INDEX analysis_marks_by_shard ON analysis_marks (shard);

CREATE TABLE analysis_instances (
    instance     TEXT        PRIMARY KEY,
    lease_ms     BIGINT      NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL,
    heartbeat_at TIMESTAMPTZ NOT NULL
);

CREATE TABLE analysis_leases (
    shard       INTEGER     PRIMARY KEY,
    owner       TEXT,
    expires_at  TIMESTAMPTZ NOT NULL DEFAULT '-infinity',
    acquired_at TIMESTAMPTZ,
    -- how many times the shard changed hands
    generation  BIGINT      NOT NULL DEFAULT 0
);

INSERT INTO analysis_leases (shard) SELECT generate_series(0, 63);

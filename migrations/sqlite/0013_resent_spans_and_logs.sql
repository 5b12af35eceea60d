-- What counts as the same span or log record sent again (an exporter retrying a request whose
-- acknowledgement it lost), the same in SQLite as in PostgreSQL:
--
-- A span is one already stored when its trace id, span id and start match (PostgreSQL's index
-- has carried the start, its partition key, from the first migration). Two different spans
-- that drew the same ids, as two runs of the simulator with one seed do, were kept by
-- PostgreSQL and the second one silently dropped here.
DROP INDEX spans_by_trace;
CREATE UNIQUE INDEX spans_by_trace ON spans (trace_id, span_id, start_unix_nano)
    WHERE trace_id IS NOT NULL AND span_id IS NOT NULL;

-- A log record has no ids in OTLP: its identity is a digest of every field
-- (store/src/rows.rs, `LogColumns`), unique with its time. Rows stored before this migration
-- have none (NULL, distinct from every other) and stay as they are. The unique index serves
-- every range read the time index did.
ALTER TABLE logs ADD COLUMN identity INTEGER;
CREATE UNIQUE INDEX logs_by_identity ON logs (time_unix_nano, identity);
DROP INDEX logs_by_time;

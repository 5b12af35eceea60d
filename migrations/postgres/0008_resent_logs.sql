-- A log record sent again (an exporter retrying a request whose acknowledgement it lost) is
-- stored once. OTLP log records have no ids: a record's identity is a digest of every field
-- (store/src/rows.rs, `LogColumns`), unique with its time (the partition key, which a unique
-- index on a partitioned table must contain). Rows stored before this migration have none
-- (NULL, distinct from every other) and stay as they are. The unique index serves every range
-- read the time index did.
ALTER TABLE logs ADD COLUMN identity BIGINT;
CREATE UNIQUE INDEX logs_by_identity ON logs (time_unix_nano, identity);
DROP INDEX logs_by_time;

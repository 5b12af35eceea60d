-- Log lines the analyzer recognises (analyzer/src/log_events.rs PHRASES; a test keeps the two
-- lists equal), marked by a generated column and indexed with the cluster and time, so that
-- the live analyzer reads a cluster's recent failure lines without scanning its chatter.
ALTER TABLE logs ADD COLUMN recognised INTEGER GENERATED ALWAYS AS (
    CASE WHEN instr(body, 'Cannot get available namenode for ') > 0
        OR instr(body, 'No namenodes available under nameservice ') > 0
        OR instr(body, 'Disable OM follower read and retry OM leader directly') > 0
        OR instr(body, 'Observer Node is too far behind') > 0
        OR instr(body, 'switch to the service ') > 0
        OR instr(body, 'switch back to the primary service') > 0
        OR instr(body, 'rejected execution of ') > 0
    THEN 1 ELSE 0 END
) VIRTUAL;

CREATE INDEX logs_recognised_by_cluster_time ON logs (cluster, recognised, time_unix_nano);

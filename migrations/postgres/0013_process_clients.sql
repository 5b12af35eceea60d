-- Several lagscope instances on one database: which clients called cluster URLs
-- (`server.address`) from which process (a resource's cluster and node), as each instance's
-- client passes saw them. A Pulsar client's switch lines seldom name the client: a process's
-- lines are its one such client's switches, and no one's where it has several
-- (analyzer/src/detectors/failover_flapping.rs). With the clients of one process analysed by
-- different instances, only the database knows whether it has one or several.
--
-- process: the (cluster, node) as JSON (`[cluster, node]`, which keeps "no cluster" apart from
-- an empty one); seen_at: the database's clock when an instance last wrote the pair. Rows
-- older than the scope window are deleted by the instances. Small and hot, like the other
-- coordination tables: not partitioned.
CREATE TABLE analysis_process_clients (
    process   TEXT        NOT NULL,
    client_id TEXT        NOT NULL,
    seen_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (process, client_id)
);

CREATE INDEX analysis_process_clients_by_seen ON analysis_process_clients (seen_at);

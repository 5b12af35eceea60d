-- A client's timeline starts from its own spans' traces: with their trace ids and ends in the
-- (client, start) index, the traces are known from the index alone (an index-only scan of the
-- client's adjacent entries, once vacuumed), so the lookups of the traces' router and server
-- spans run at the same time as the read of the client's own rows instead of after it
-- (BENCHMARKS.md, "A client's timeline from PostgreSQL as the table grows").
CREATE INDEX spans_by_client_time_traces ON spans (client_id, start_unix_nano)
    INCLUDE (trace_id, end_unix_nano) WHERE client_id IS NOT NULL;
DROP INDEX spans_by_client_time;

-- A cluster's series without a scan of every series: the overview's `cluster_latest_time`
-- seeks each series of a cluster for its latest sample. PostgreSQL has had this index since
-- its first migration.
CREATE INDEX series_by_scope ON series (cluster, namespace);

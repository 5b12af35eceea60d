-- The live analyzer reads one cluster's recent log lines (router NoNamenodesAvailable lines
-- and the other recognised failures) after each batch of logs.
CREATE INDEX logs_by_cluster_time ON logs (cluster, time_unix_nano);

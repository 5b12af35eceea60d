-- A client's anomalies in a time range: a window that ends at or after the range's start.
-- `(client_id, start)` bounded only the start from above, so a client page read every anomaly
-- the client ever had before the range's end; ordered by end, the index reads only those that
-- end inside or after the range (with the id, for the list's index-only scan).
DROP INDEX anomalies_by_client;
CREATE INDEX anomalies_by_client_end ON anomalies (client_id, end_unix_nano, start_unix_nano, id);

-- A client's anomalies in a time range: a window that ends at or after the range's start.
-- `(client_id, start)` bounded only the start from above, so a client page read every anomaly
-- the client ever had before the range's end (43 000 rows for a busy client of a 10-million-
-- span store); ordered by end, the index reads only those that end inside or after the range.
DROP INDEX anomalies_by_client;
CREATE INDEX anomalies_by_client_end ON anomalies (client_id, end_unix_nano, start_unix_nano);

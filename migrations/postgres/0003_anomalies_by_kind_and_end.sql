-- Anomaly lists and counts over a time range read their ids from these indexes alone: a
-- window that ends at or after the range's start and starts before its end. `(kind, id)`
-- keeps one kind's anomalies in id order, for paging newest first without a sort.
CREATE INDEX anomalies_by_kind_end ON anomalies (kind, end_unix_nano, start_unix_nano, id);
CREATE INDEX anomalies_by_end ON anomalies (end_unix_nano, start_unix_nano, id);
CREATE INDEX anomalies_by_kind_id ON anomalies (kind, id);

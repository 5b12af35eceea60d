-- Retention deletes the oldest rows first, in batches: by start for spans and by time for
-- samples (whose primary key leads with the series).
CREATE INDEX spans_by_start ON spans (start_unix_nano);
CREATE INDEX samples_by_time ON samples (time_unix_nano);

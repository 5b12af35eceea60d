-- A scope's mark carries the oldest time of the metric samples committed to it since it was
-- last analysed (NULL: none), so that the live analyzer can hold a scope's samples between
-- passes and read again only from there (lagscope/src/sample_cache.rs), as it does on SQLite
-- from the marks it keeps in memory. Marking a scope again keeps the older time: the oldest
-- of what waits. Not indexed, so a re-mark stays a heap-only (HOT) update.
ALTER TABLE analysis_marks ADD COLUMN samples_from BIGINT;

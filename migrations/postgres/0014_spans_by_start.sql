-- A time range's spans of any scope, oldest first (`Store::spans_in_range` without a cluster,
-- which `analyze --database-url`, `export` and `/api/v1/lag` page through; `committed_on_spans`):
-- without an index in their order each page sorted every span of the range after the page's
-- start, so reading a million spans in pages of 10 000 took 51 s (BENCHMARKS.md). SQLite has
-- had `spans_by_start` since its migration 0008.
CREATE INDEX spans_by_start ON spans (start_unix_nano, id);

-- The log rows stored before migration 0013 gave records an identity: the store gives each the
-- identity its insert would now, and removes those that are copies of another, when it opens
-- (store/src/sqlite/logs.rs, `identify_old_rows`). This partial index finds them; every row
-- inserted since has an identity, so it is empty once they are done, and checking for them
-- costs one read of an empty index.
CREATE INDEX logs_without_identity ON logs (id) WHERE identity IS NULL;

-- The log rows stored before migration 0008 gave records an identity: the store gives each the
-- identity its insert would now, and removes those that are copies of another, when it
-- connects (store/src/postgres.rs, `identify_old_logs`). This partial index finds them; every
-- row inserted since has an identity, so it is empty once they are done, and checking for them
-- costs one read of an empty index per partition.
CREATE INDEX logs_without_identity ON logs (id) WHERE identity IS NULL;

-- A window (or a run of attempts) stored from a pass that saw only part of its telemetry, and
-- found again whole under another fingerprint (telemetry of its start came late): the partial
-- row points at the one that replaced it, is closed, and is no longer listed. Kept, not
-- deleted, so that the alerter sees it close and resolves what it paged for it.
ALTER TABLE anomalies ADD COLUMN superseded_by BIGINT;

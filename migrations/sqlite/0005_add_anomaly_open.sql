-- Window anomalies (a lag, a storm, a NoNamenodesAvailable window) stay open while their
-- condition holds at the end of the data seen so far, and are resolved when it ends.
ALTER TABLE anomalies ADD COLUMN open INTEGER NOT NULL DEFAULT 0;

CREATE INDEX anomalies_open ON anomalies (open, start_unix_nano) WHERE open = 1;

-- The live analyzer holds clients and scopes between passes and reads only the spans committed
-- since its last read (store/src/postgres/feed.rs): spans by id, the id's range read through
-- this index. Ids come from one sequence and grow at the right edge: each partition's index
-- takes new ids as appends.
CREATE INDEX spans_by_id ON spans (id);

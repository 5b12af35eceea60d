#!/usr/bin/env python3
"""The stale-read check (read-your-writes and monotonic reads) as one DuckDB SQL query.

Usage: stale_read_duckdb.py SPANS.parquet [RUNS]

SPANS.parquet may be a glob ('DIR/piece-*/spans.parquet'): the files are read as one table
(for captures exported in pieces).

Loads the spans `lagscope export --parquet` wrote into an in-memory table (timed apart),
then runs the query RUNS times and prints each run's wall time and the number of stale
reads it found, as JSON on the last line. Then, on a fresh connection, the same query RUNS
times over the Parquet file itself (a view on `read_parquet`, so each run reads the columns it
needs from the file): what someone running the check on a capture on disk waits for, to set
beside `lagscope analyze --kind stale_read`'s whole wall time on its capture.

The query is the textbook formulation: for each client and namespace, the running maximum
(a window max) of the states its completed calls established (a write's returned state, a
read's served state), as-of-joined to each successful read at the read's start; a read served
below that floor is stale. The served state is the server span's, found by trace id.
"""

import json
import statistics
import sys
import time

import duckdb

QUERY = """
WITH client AS (
    SELECT trace_id, client_id, coalesce(namespace, '') AS namespace, op, outcome,
           start_unix_nano AS started, end_unix_nano AS ended, state_returned, state_served
    FROM spans
    WHERE component = 'client' AND client_id IS NOT NULL AND op IN ('read', 'write')
),
server AS (
    SELECT trace_id, max(state_served) AS served FROM spans
    WHERE component = 'server' AND state_served IS NOT NULL GROUP BY trace_id
),
attempts AS (
    SELECT client.*, coalesce(server.served, client.state_served) AS served
    FROM client LEFT JOIN server USING (trace_id)
),
established AS (
    SELECT client_id, namespace, ended AS completed,
           CASE WHEN op = 'write' THEN state_returned ELSE served END AS state
    FROM attempts
    WHERE outcome = 'ok' AND (CASE WHEN op = 'write' THEN state_returned ELSE served END) IS NOT NULL
),
floors AS (
    SELECT client_id, namespace, completed,
           max(state) OVER (PARTITION BY client_id, namespace ORDER BY completed
                            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS floor
    FROM established
),
reads AS (
    SELECT * FROM attempts WHERE op = 'read' AND outcome = 'ok' AND served IS NOT NULL
)
SELECT count(*) FROM reads
ASOF JOIN floors
  ON reads.client_id = floors.client_id AND reads.namespace = floors.namespace
 AND floors.completed <= reads.started
WHERE reads.served < floors.floor
"""


def time_query(connection, runs: int, label: str) -> tuple[list[float], int]:
    """Runs the query `runs` times on `connection`: each run's seconds, and the count found."""
    times, found = [], None
    for run in range(runs):
        started = time.perf_counter()
        found = connection.execute(QUERY).fetchone()[0]
        times.append(time.perf_counter() - started)
        print(f"{label} run {run + 1}: {times[-1]:.3f} s, {found} stale reads", file=sys.stderr)
    return times, found


def connect():
    connection = duckdb.connect()
    connection.execute("SET threads TO 1")  # one core, as lagscope's offline analyzer
    return connection


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: stale_read_duckdb.py SPANS.parquet [RUNS]")
    path, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    connection = connect()
    started = time.perf_counter()
    connection.execute("CREATE TABLE spans AS SELECT * FROM read_parquet(?)", [path])
    load = time.perf_counter() - started
    rows = connection.execute("SELECT count(*) FROM spans").fetchone()[0]
    times, found = time_query(connection, runs, "duckdb")
    from_file = connect()
    # A view's definition cannot take a parameter: the path goes in as an escaped literal.
    from_file.execute("CREATE VIEW spans AS SELECT * FROM read_parquet('%s')" % path.replace("'", "''"))
    file_times, file_found = time_query(from_file, runs, "duckdb from the file,")
    if file_found != found:
        sys.exit(f"the query over the file found {file_found} stale reads, over the table {found}")
    print(json.dumps({
        "duckdb_version": duckdb.__version__,
        "spans": rows,
        "load_seconds": round(load, 3),
        "query_seconds": [round(value, 3) for value in times],
        "query_median_seconds": round(statistics.median(times), 3),
        "from_file_seconds": [round(value, 3) for value in file_times],
        "from_file_median_seconds": round(statistics.median(file_times), 3),
        "stale_reads": found,
    }))

if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Hostile query parameters for a running `lagscope serve`'s API and pages.

Usage: api.py BASE_URL [SEED] [REQUESTS]     e.g. api.py http://127.0.0.1:8080 1 2000

Requests every path of the OpenAPI document (`/api/v1/openapi.json`) and the pages, each
parameter present half the time with a value drawn from a list of hostile ones (empty,
signs, overflowing numbers, NaN, bad dates, SQL, HTML, NUL, right-to-left marks, 20 000
characters, ...). A request fails when it is answered 5xx or not at all, or when an HTML
answer carries the HTML it was sent unescaped. Prints each failure, a count, and the requests
that took over 2 s.
"""

import json
import random
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

VALUES = [
    "", "-1", "0", "1", "99999999999999999999", "1e400", "NaN", "inf", "-inf", "2026-13-40T00:00:00Z",
    "2026-11-30T00:00:00Z", "' OR 1=1--", "<script>alert(1)</script>", "\x00", "%", "ü\u202e", "x" * 20000,
    "1h", "-1h", "0s", "9223372036854775807", "-9223372036854775808", "18446744073709551616", "1.5", "1m",
    "1ns", "100000000d", "stale_read", "read_your_writes", "open", "resolved", "[]", "{}",
    "1970-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "0000-01-01T00:00:00Z", "+1", " 1", "0x10", "1_000", "-0",
    "1e3", "9e18", "1e19",
]
PAGES = [
    ("/", ["from", "to", "last", "kind", "cluster"]),
    ("/anomalies/1", ["from", "to", "last"]),
    ("/clients/app-rpc-1", ["from", "to", "last"]),
    ("/dashboards/lag", ["from", "to", "last", "cluster", "namespace"]),
    ("/dashboards/routers", ["from", "to", "last"]),
    ("/dashboards/shards", ["from", "to", "last"]),
    ("/dashboards/failover", ["from", "to", "last"]),
    ("/metrics", []),
    ("/clients", ["q", "after"]),
]


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    base = sys.argv[1].rstrip("/")
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    requests = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    spec = json.load(urllib.request.urlopen(base + "/api/v1/openapi.json"))
    paths = [
        (path, [parameter["name"] for method in item.values() for parameter in method.get("parameters", [])])
        for path, item in spec["paths"].items()
    ]
    failed, slow = 0, []
    for _ in range(requests):
        path, names = rng.choice(paths + PAGES)
        path = path.replace("{id}", rng.choice(["1", "0", "-1", "abc", "99999999999999999999", "%2e%2e", "1.0"]))
        path = path.replace("{client_id}", urllib.parse.quote(rng.choice(VALUES + ["app-rpc-1"]), safe=""))
        query = [(name, rng.choice(VALUES)) for name in names if name not in ("id", "client_id") and rng.random() < 0.5]
        url = base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        started, content_type = time.time(), ""
        try:
            answer = urllib.request.urlopen(url, timeout=30)
            code, body, content_type = answer.status, answer.read(), answer.headers.get("content-type", "")
        except urllib.error.HTTPError as error:
            code, body, content_type = error.code, error.read(), error.headers.get("content-type", "")
        except Exception as error:  # noqa: BLE001 (any failure to answer is the finding)
            code, body = -1, str(error).encode()
        took = time.time() - started
        if took > 2:
            slow.append((round(took, 2), url[:200]))
        if code >= 500 or code < 0:
            failed += 1
            print(code, url[:300], body[:300])
        elif "html" in content_type and b"<script>alert(1)</script>" in body:
            failed += 1
            print("unescaped:", url[:200])
    print(f"{requests} requests, {failed} failed; over 2 s: {slow[:10]}")


if __name__ == "__main__":
    main()

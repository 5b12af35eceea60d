#!/usr/bin/env python3
"""Mutated OTLP/HTTP bodies for a running `lagscope serve`'s receiver.

Usage: otlp_http.py BASE_URL FRAMED_CAPTURE EXAMPLES_DIR SEED BODIES
       e.g. otlp_http.py http://127.0.0.1:4318 run.binpb ../shared/reference/otlp-examples 1 3000

Takes the protobuf requests of a length-prefixed capture (`lagscope sim --out run.binpb`) and
the official OTLP JSON examples (trace.json, metrics.json, logs.json, events.json), changes a
few bytes of one (or cuts it short, inserts bytes, flips a bit), gzips some (and corrupts some
of those), and posts it to /v1/traces, /v1/metrics or /v1/logs at random. Every answer must be
200 (partial success allowed), 400, 413, 415 or 429, as the OTLP specification lists; prints
any other with its body, and the count of each code.
"""

import gzip
import random
import struct
import sys
import urllib.error
import urllib.request

from mutate import mutate


def main() -> None:
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    base, capture, examples = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
    rng, bodies = random.Random(int(sys.argv[4])), int(sys.argv[5])
    data, frames, at = open(capture, "rb").read(), [], 0
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        frames.append(data[at + 4 : at + 4 + length])
        at += 4 + length
    jsons = [open(f"{examples}/{name}.json", "rb").read() for name in ("trace", "metrics", "logs", "events")]
    codes, failed = {}, 0
    for _ in range(bodies):
        protobuf = rng.random() < 0.7
        body = bytearray(mutate(rng.choice(frames) if protobuf else rng.choice(jsons), rng, kinds=4))
        headers = {"Content-Type": "application/x-protobuf" if protobuf else "application/json"}
        if rng.random() < 0.3:
            body = bytearray(gzip.compress(bytes(body)))
            headers["Content-Encoding"] = "gzip"
            if rng.random() < 0.3:
                body[rng.randrange(len(body))] ^= 0xFF
        signal = rng.choice(["traces", "metrics", "logs"])
        request = urllib.request.Request(f"{base}/v1/{signal}", data=bytes(body), headers=headers, method="POST")
        try:
            answer = urllib.request.urlopen(request, timeout=30)
            code, out = answer.status, answer.read()
        except urllib.error.HTTPError as error:
            code, out = error.code, error.read()
        except Exception as error:  # noqa: BLE001 (any failure to answer is the finding)
            code, out = -1, str(error).encode()
        codes[code] = codes.get(code, 0) + 1
        if code not in (200, 400, 413, 415, 429):
            failed += 1
            print(code, signal, headers, out[:300])
    print(f"{bodies} bodies, answered {dict(sorted(codes.items()))}, {failed} failed")


if __name__ == "__main__":
    main()

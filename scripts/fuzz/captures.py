#!/usr/bin/env python3
"""Mutation fuzzing of `lagscope analyze`'s capture readers.

Usage: captures.py LAGSCOPE CAPTURE CASES [FIRST_SEED]

Each case is CAPTURE with a few bytes changed, cut short, bytes inserted, a chunk repeated or
one bit flipped (the seed decides), written beside it with the same extension (so that
`.lscap`, `.binpb`, `.jsonl`, `.zst` and `.gz` captures are read as such) and analyzed. A case
fails when `analyze` panics, is killed, runs past 20 s, or exits non-zero without an error
message; each failing case is kept as `bad-SEED.EXT` beside CAPTURE. Prints each failure and
a count.
"""

import os
import random
import subprocess
import sys

from mutate import mutate




def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    binary, capture, cases = sys.argv[1], sys.argv[2], int(sys.argv[3])
    first = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    name = os.path.basename(capture)
    extension = name[name.index(".") :] if "." in name else ""
    data = open(capture, "rb").read()
    case_path = os.path.join(os.path.dirname(os.path.abspath(capture)), "case" + extension)
    failed = 0
    for seed in range(first, first + cases):
        with open(case_path, "wb") as out:
            out.write(mutate(data, random.Random(seed)))
        try:
            run = subprocess.run([binary, "analyze", "--format", "jsonl", case_path], capture_output=True, timeout=20)
            error = run.stderr.decode(errors="replace")
            bad = (
                run.returncode not in (0, 1)
                or "panicked" in error
                or (run.returncode == 1 and "error" not in error.lower())
            )
            why = f"exit {run.returncode}: {error.strip().splitlines()[-3:]}"
        except subprocess.TimeoutExpired:
            bad, why = True, "still running after 20 s"
        if bad:
            failed += 1
            print(f"seed {seed}: {why}")
            os.replace(case_path, case_path.replace("case" + extension, f"bad-{seed}{extension}"))
    if os.path.exists(case_path):
        os.remove(case_path)
    print(f"{cases} cases of {name}, {failed} failed")


if __name__ == "__main__":
    main()

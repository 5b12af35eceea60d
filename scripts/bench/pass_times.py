#!/usr/bin/env python3
"""Where the live analyzer's passes spent their time, from a `serve` log at debug level.

Usage: pass_times.py SERVE.log [LABEL] [--by-minute]

Run `serve` with `LAGSCOPE_LOG=info,lagscope::live=debug` (as `bench-demo-live` does): each
pass logs one "analysis pass" line with its stages' times in milliseconds. This sums each
pass's stages (reading logs and traces, client reads and analysis, scope samples, spans and
analysis, writes, the per-cluster pass) and prints the passes' percentiles, the longest, how
many took over 0.5 and 1 s, and each stage summed over the run, for two builds' logs to be set
side by side. A build that stores each pass's findings while the next pass analyses logs the
write apart ("pass findings stored": its time, how long it waited for the write before, and
the pass's delay from its first batch queued to its findings stored): those lines give the
writes, and the delays' percentiles. With --by-minute, also each minute's passes: how many, their p50 and longest,
and how many clients and scopes a pass took on average and at most. Prints nothing for a log
without such lines (an info-level run).
"""

import datetime
import re
import sys

# The stages a pass runs one after another; their sum is the pass's time. (The finer timings,
# client_catch_up_ms, client_probes_ms, client_lines_ms, scope_catch_up_ms and
# scope_timelines_ms, are parts of these and are summed apart.) A build that writes each pass's findings while the next pass runs
# has no writes_ms in its pass lines: its writes are on lines of their own (WRITE_LINE).
STAGES = ["logs_and_traces_ms", "client_reads_ms", "client_analysis_ms", "scope_samples_ms", "scope_spans_ms",
          "scope_analysis_ms", "writes_ms", "clusters_ms"]
PARTS = ["client_catch_up_ms", "client_probes_ms", "client_lines_ms", "scope_catch_up_ms", "scope_timelines_ms"]
FIELD = re.compile(r"\b(\w+_ms)=(\d+)")
COUNT = re.compile(r"\b(clients|scopes)=(\d+)")
WRITE_LINE = "pass findings stored"


def took(times: dict) -> int:
    """A pass's time: its stages summed."""
    return sum(times.get(stage, 0) for stage in STAGES)


def main() -> None:
    by_minute = "--by-minute" in sys.argv[1:]
    args = [arg for arg in sys.argv[1:] if arg != "--by-minute"]
    if not args:
        sys.exit("usage: pass_times.py SERVE.log [LABEL] [--by-minute]")
    label = args[1] if len(args) > 1 else args[0]
    passes, minutes, writes = [], [], []
    with open(args[0], errors="replace") as log:
        for line in log:
            if WRITE_LINE in line:
                writes.append({name: int(value) for name, value in FIELD.findall(line)})
            elif "analysis pass" in line:
                passes.append({name: int(value) for name, value in FIELD.findall(line)})
                passes[-1].update({name: int(value) for name, value in COUNT.findall(line)})
                minutes.append(datetime.datetime.fromisoformat(line.split()[0]))
    if not passes:
        return
    totals = sorted(took(times) for times in passes)
    at = lambda share: totals[min(len(totals) - 1, int(share * len(totals)))]
    print(f"{label}: {len(totals)} passes by their debug timings: p50 {at(0.5)} ms, p99 {at(0.99)} ms,"
          f" p99.9 {at(0.999)} ms, longest {totals[-1]} ms; over 0.5 s {sum(t > 500 for t in totals)},"
          f" over 1 s {sum(t > 1000 for t in totals)}")
    summed = ", ".join(f"{name[:-3]} {sum(times.get(name, 0) for times in passes) / 1000:.1f}"
                       for name in STAGES + PARTS)
    print(f"{label}: each stage summed over the passes, seconds: {summed}")
    if writes:
        delays = sorted(write.get("delay_ms", 0) for write in writes)
        at_delay = lambda share: delays[min(len(delays) - 1, int(share * len(delays)))]
        summed = lambda name: sum(write.get(name, 0) for write in writes) / 1000
        print(f"{label}: {len(writes)} passes' findings stored apart, writes {summed('writes_ms'):.1f} s,"
              f" waiting for the write before {summed('waited_ms'):.1f} s; delay to stored p50 {at_delay(0.5)} ms,"
              f" p99 {at_delay(0.99)} ms, p99.9 {at_delay(0.999)} ms, longest {delays[-1]} ms,"
              f" over 1 s {sum(delay > 1000 for delay in delays)}")
    if by_minute:
        of_minutes = {}
        for times, at_time in zip(passes, minutes):
            of_minutes.setdefault(int((at_time - minutes[0]).total_seconds() // 60), []).append(times)
        for minute, of_minute in sorted(of_minutes.items()):
            times_taken = sorted(took(times) for times in of_minute)
            mean = lambda name: sum(times.get(name, 0) for times in of_minute) / len(of_minute)
            most = lambda name: max(times.get(name, 0) for times in of_minute)
            print(f"{label}: minute {minute + 1}: {len(times_taken)} passes, p50 {times_taken[len(times_taken) // 2]} ms,"
                  f" longest {times_taken[-1]} ms; clients a pass {mean('clients'):.1f} (most {most('clients')}),"
                  f" scopes {mean('scopes'):.1f} (most {most('scopes')})")


if __name__ == "__main__":
    main()

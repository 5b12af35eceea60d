#!/usr/bin/env bash
# Several `/api/v1/lag` requests at once against one `serve`: when each was answered, when all
# were, and the server's peak resident memory (VmHWM).
#
#   scripts/bench/lag_concurrency.sh BINARY DATA_DIR REQUESTS FROM TO [STEP]
#   scripts/bench/lag_concurrency.sh target/release/lagscope /tmp/qa/data 4 1767225600 1767226000 60
#
# DATA_DIR is a store `serve` wrote (e.g. 400 s of `sim --scenario mixed` sent to it); FROM and
# TO are Unix seconds. The server listens on 127.0.0.1:18080 (OTLP on 14317/14318) and is
# stopped at the end; each answer is kept as $OUT/lag-N.json (OUT defaults to a new temporary
# directory) so that they can be compared with `cmp`.
set -euo pipefail
if [ $# -lt 5 ]; then
  sed -n '2,11p' "$0" >&2
  exit 2
fi
binary=$1 data=$2 requests=$3 from=$4 to=$5 step=${6:-60}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
"$binary" serve --data-dir "$data" --listen 127.0.0.1:18080 --otlp-http 127.0.0.1:14318 \
  --otlp-grpc 127.0.0.1:14317 > "$out/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 50); do
  curl -sf -o /dev/null http://127.0.0.1:18080/api/v1/health && break
  sleep 0.2
done
start=$(date +%s.%N)
clients=()
for i in $(seq "$requests"); do
  curl -s -o "$out/lag-$i.json" -w "request $i: %{http_code} after %{time_total} s\n" \
    "http://127.0.0.1:18080/api/v1/lag?from=$from&to=$to&step=$step" &
  clients+=($!)
done
wait "${clients[@]}"
echo "all $requests answered after $(echo "$(date +%s.%N) - $start" | bc) s;" \
  "server's peak RSS $(awk '/VmHWM/ {print $2, $3}' /proc/$server/status)"
curl -s http://127.0.0.1:18080/metrics | grep -E '^lagscope_api_lag' || true
echo "answers in $out"

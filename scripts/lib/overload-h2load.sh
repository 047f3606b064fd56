#!/usr/bin/env bash
# The overload curve with h2load as the load generator: `scripts/overload h2load …` (see
# there for what it reports).
#   scripts/lib/overload-h2load.sh [memory|redis] [seconds per step] [connections] [tollgate serve flags…]
# STREAMS=n: at most n calls in flight per connection on h2load's side (default 256; Envoy's
# default circuit breaker holds an Envoy to 1,024 across its connections); CAPACITY_STREAMS=n
# the same for the capacity measurement alone (default STREAMS).
set -euo pipefail
cd "$(dirname "$0")/../.."
store=${1:-memory}
seconds=${2:-20}
connections=${3:-8}
shift $(($# < 3 ? $# : 3))
streams=${STREAMS:-256}
capacity_streams=${CAPACITY_STREAMS:-$streams}
source scripts/lib/local.sh
command -v h2load >/dev/null || { echo "h2load missing (apt-get install nghttp2-client)" >&2; exit 1; }
cargo build --release --locked -q
bin=target/release/tollgate
server_bin=${SERVER:-$bin}

pin_server=(); pin_client=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    pin_server=(taskset -c 1); pin_client=(taskset -c 0)
fi
store_url=memory
if [ "$store" = redis ]; then
    port=$(free_port)
    redis_prefix="${pin_server[*]}" start_redis "$port"
    store_url="redis://127.0.0.1:$port"
fi
# A limit no step reaches: every call is a decision that counts, none a cached denial.
mkdir -p "$work/config"
printf 'domain: load\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n' \
    > "$work/config/load.yaml"
"$bin" bench --domain load --key user --values 1 --write-body "$work/body"
grpc=$(free_port); http=$(free_port)
"${pin_server[@]}" "$server_bin" serve --config "$work/config" --store "$store_url" \
    --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" --log-level warn "$@" &
server=$!
pids+=($server)
wait_ready "$http"

url="http://127.0.0.1:$grpc/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
h2() {
    "${pin_client[@]}" h2load -c "$connections" -d "$work/body" -H 'content-type: application/grpc' \
        -H 'te: trailers' -H 'grpc-timeout: 20m' "$@" "$url"
}
metrics() { curl -fs "http://127.0.0.1:$http/metrics" > "$1"; }

# Capacity: closed loop with as many streams as the server grants each connection, so that
# it is saturated (and batches as it does under overload).
# Decisions only: answers that are not (UNAVAILABLE, RESOURCE_EXHAUSTED) are no capacity.
echo "== capacity ($store store, $connections connections, their streams full): h2load closed loop, 10 s"
metrics "$work/before.txt"
h2 -m "$capacity_streams" -D 10 > "$work/capacity.txt"
metrics "$work/after.txt"
grep -E '^(finished|requests|time for request)' "$work/capacity.txt"
capacity=$(python3 - "$work/before.txt" "$work/after.txt" <<'PY'
import re, sys
def ok(path):
    for line in open(path):
        m = re.match(r'tollgate_requests_total\{code="OK"\} (\S+)', line)
        if m:
            return float(m[1])
    return 0.0
print(max(1, int((ok(sys.argv[2]) - ok(sys.argv[1])) / 10)))
PY
)
echo "capacity: $capacity decisions/s"

echo
echo "| offered | offered/s | started/s | answered/s | decisions within 20 ms /s | × capacity | decision p99 (at most) | refusals | RSS MiB (first, peak) |"
echo "|---|---|---|---|---|---|---|---|---|"
for multiple in 0.5 1 1.5 2 3; do
    per_connection=$(python3 -c "print(max(1, round($multiple * $capacity / $connections)))")
    metrics "$work/before.txt"
    rm -f "$work/log"  # h2load appends to it
    h2 -m "$streams" --rps "$per_connection" -D "$seconds" --log-file "$work/log" > "$work/step.txt" &
    load=$!
    rss=()
    while kill -0 "$load" 2>/dev/null; do
        rss+=("$(awk '/VmRSS/{print $2}' "/proc/$server/status")")
        sleep 2
    done
    wait "$load"
    metrics "$work/after.txt"
    python3 - "$multiple" "$capacity" "$((per_connection * connections))" "$seconds" \
        "$work/step.txt" "$work/log" "$work/before.txt" "$work/after.txt" "${rss[*]}" <<'PY'
import math, re, sys
multiple, capacity, offered, seconds, step, log, before, after, rss = sys.argv[1:]
capacity, offered, seconds = int(capacity), int(offered), float(seconds)

def codes(path):
    found = {}
    for line in open(path):
        m = re.match(r'tollgate_requests_total\{code="(\w+)"\} (\S+)', line)
        if m:
            found[m[1]] = float(m[2])
    return found

b, a = codes(before), codes(after)
delta = {code: int(a[code] - b.get(code, 0)) for code in a if a[code] - b.get(code, 0)}
refused = sum(count for code, count in delta.items() if code != "OK")
started = int(re.search(r"requests: \d+ total, (\d+) started", open(step).read())[1])
latencies = sorted(int(line.split("\t")[2]) for line in open(log) if line.strip())
answered = len(latencies)
# h2load sees HTTP status 200 for a refusal too: count every refusal among the fast answers
# and among the fastest (a lower bound on decisions within 20 ms, an upper bound on their p99).
within = max(0, sum(1 for us in latencies if us <= 20_000) - refused)
decisions = max(0, answered - refused)
p99 = latencies[min(answered - 1, refused + math.ceil(0.99 * decisions) - 1)] / 1000 if decisions else float("nan")
samples = [int(kib) // 1024 for kib in rss.split()] or [0]
shown = ", ".join(f"{code} {count}" for code, count in sorted(delta.items()) if code != "OK") or "none"
print(f"| {multiple}× | {offered:,} | {started / seconds:,.0f} | {answered / seconds:,.0f} "
      f"| {within / seconds:,.0f} | {within / seconds / capacity:.2f} | {p99:.1f} ms | {shown} "
      f"| {samples[0]}, {max(samples)} |")
PY
done

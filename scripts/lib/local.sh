# Shared by the measurement scripts (bench-redis, soak, overload): a scratch directory, the
# processes they start (all stopped on exit), free loopback ports, a local redis-server.
# Source it after `cd` to the repository root.

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# A loopback port that was free a moment ago.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# start_redis PORT [redis-server flags...]: a throwaway redis-server on 127.0.0.1:PORT,
# started with $redis_prefix (e.g. a taskset) when set; returns once it answers PING.
start_redis() {
    local port=$1; shift
    command -v redis-server >/dev/null || { echo "redis-server missing (apt-get install redis-server)" >&2; exit 1; }
    mkdir -p "$work/redis-$port"
    ${redis_prefix:-} redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
        --dir "$work/redis-$port" --logfile "$work/redis-$port.log" "$@" &
    pids+=($!)
    until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
}

# wait_ready HTTP_PORT: until tollgate's /readyz answers 200.
wait_ready() {
    until curl -fs "http://127.0.0.1:$1/readyz" >/dev/null 2>&1; do sleep 0.1; done
}

# Shared by the measurement scripts (scripts/README.md): a scratch directory, the
# processes they start (all stopped on exit), free loopback ports, a local redis-server.
# Source it after `cd` to the repository root.

work=$(mktemp -d)
pids=()
redis_pids=()
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
    redis_pids+=($!)
    until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
}

# start_cluster: a 3-master Redis Cluster of throwaway redis-servers (ports below 55000, so
# that the cluster bus, port + 10000, is a valid port); sets $cluster_url.
start_cluster() {
    local nodes=() port
    for _ in 1 2 3; do
        port=$(free_port)
        while [ "$port" -gt 55000 ]; do port=$(free_port); done
        start_redis "$port" --cluster-enabled yes --cluster-config-file nodes.conf
        nodes+=("127.0.0.1:$port")
    done
    redis-cli --cluster create "${nodes[@]}" --cluster-yes >/dev/null
    until redis-cli -p "${nodes[0]#*:}" cluster info | grep -q cluster_state:ok; do sleep 0.1; done
    sleep 1
    cluster_url="redis-cluster://$(IFS=,; echo "${nodes[*]}")"
}

# stop_redis_all: stops every redis-server started so far.
stop_redis_all() {
    for pid in "${redis_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${redis_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    redis_pids=()
}

# wait_ready HTTP_PORT: until tollgate's /readyz answers 200.
wait_ready() {
    until curl -fs "http://127.0.0.1:$1/readyz" >/dev/null 2>&1; do sleep 0.1; done
}

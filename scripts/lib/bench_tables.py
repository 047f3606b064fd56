"""Markdown tables from scripts/bench's results (JSON lines): the median of each scenario's
rounds per server, and the ratios docs/performance.md reads its targets from."""

import json
import statistics
import sys

SERVERS = ["null", "memory", "redis", "cluster", "null-pc", "memory-pc", "redis-pc",
           "memory-base", "redis-base", "cluster-base", "fresh"]


def load(path):
    with open(path) as results:
        return [json.loads(line) for line in results if line.strip()]


def medians(reports):
    """scenario -> server -> median figures over that scenario's rounds."""
    grouped = {}
    for report in reports:
        if "server" in report:
            grouped.setdefault(report["scenario"], {}).setdefault(report["server"], []).append(report)
    table = {}
    for scenario, servers in grouped.items():
        for server, runs in servers.items():
            median = lambda pick: statistics.median(pick(run) for run in runs)
            table.setdefault(scenario, {})[server] = {
                "rounds": len(runs),
                "rate": median(lambda r: r["decisions_per_second"]),
                "cpu": median(lambda r: r["server_cpu_us_per_decision"] or 0.0),
                "p50": median(lambda r: r["latency_us"]["p50"]),
                "p99": median(lambda r: r["latency_us"]["p99"]),
                "p999": median(lambda r: r["latency_us"]["p999"]),
                "ok": sum(r["ok"] for r in runs) // len(runs),
                "over": sum(r["over_limit"] for r in runs) // len(runs),
                "errors": sum(r["errors"] + r["shed"] + r["unsent"] for r in runs),
            }
    return table


def render(table):
    print("| scenario | server | rounds | requests/s | server CPU µs/request | p50 ms | p99 ms | p99.9 ms | OK | OVER_LIMIT | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for scenario, servers in table.items():
        for server in SERVERS:
            if server not in servers:
                continue
            f = servers[server]
            print(
                f"| {scenario} | {server} | {f['rounds']} | {f['rate']:,.0f} | {f['cpu']:.2f} | "
                f"{f['p50'] / 1000:.2f} | {f['p99'] / 1000:.2f} | {f['p999'] / 1000:.2f} | "
                f"{f['ok']:,} | {f['over']:,} | {f['errors']} |"
            )


def ratios(table, reports):
    def get(scenario, server, figure):
        return table.get(scenario, {}).get(server, {}).get(figure)

    print()
    one, ten = "1 descriptor, 10,000 keys", "10 descriptors, 10,000 keys"
    for scenario in (one, ten):
        null_cpu, mem_cpu = get(scenario, "null", "cpu"), get(scenario, "memory", "cpu")
        null_rate, mem_rate = get(scenario, "null", "rate"), get(scenario, "memory", "rate")
        if null_cpu and mem_cpu:
            print(f"- {scenario}: memory/null CPU per request {mem_cpu / null_cpu:.3f}, "
                  f"throughput {mem_rate / null_rate:.3f}")
        null_cpu, mem_cpu_pc = get(scenario, "null-pc", "cpu"), get(scenario, "memory-pc", "cpu")
        null_rate, mem_rate = get(scenario, "null-pc", "rate"), get(scenario, "memory-pc", "rate")
        if null_cpu and mem_cpu_pc:
            print(f"- {scenario}, per-core: memory/null CPU per request {mem_cpu_pc / null_cpu:.3f}, "
                  f"throughput {mem_rate / null_rate:.3f}")
        redis_cpu = get(scenario, "redis", "cpu")
        if redis_cpu and mem_cpu:
            print(f"- {scenario}: redis/memory CPU per request {redis_cpu / mem_cpu:.3f}")
        redis_cpu = get(scenario, "redis-pc", "cpu")
        if redis_cpu and mem_cpu_pc:
            print(f"- {scenario}, per-core: redis/memory CPU per request {redis_cpu / mem_cpu_pc:.3f}")
    for scenario in (one, ten):
        for server in ("memory", "redis", "cluster"):
            cpu, base_cpu = get(scenario, server, "cpu"), get(scenario, f"{server}-base", "cpu")
            rate, base_rate = get(scenario, server, "rate"), get(scenario, f"{server}-base", "rate")
            if cpu and base_cpu:
                print(f"- {scenario}, {server}: this build / BASELINE: CPU per request "
                      f"{cpu / base_cpu:.3f}, throughput {rate / base_rate:.3f}")
    p50_one = get(one, "cluster", "p50")
    p50_ten = get(ten, "cluster", "p50")
    if p50_one and p50_ten:
        print(f"- cluster, closed loop 64 in flight: p50 10 descriptors / 1 descriptor {p50_ten / p50_one:.2f}")
    for in_flight in (1, 8):
        p50_one = get(f"cluster, {in_flight} in flight, 1 descriptor(s)", "cluster", "p50")
        p50_ten = get(f"cluster, {in_flight} in flight, 10 descriptor(s)", "cluster", "p50")
        if p50_one and p50_ten:
            print(f"- cluster, {in_flight} in flight: p50 10 descriptors / 1 descriptor {p50_ten / p50_one:.2f}")
    fixed = "open loop 40,000/s, 1 descriptor"
    for null, memory in (("null", "memory"), ("null-pc", "memory-pc")):
        null_cpu, mem_cpu = get(fixed, null, "cpu"), get(fixed, memory, "cpu")
        if null_cpu and mem_cpu:
            print(f"- {fixed}: {memory}/{null} CPU per request {mem_cpu / null_cpu:.3f}")
    for report in reports:
        if report.get("scenario") == "memory per key":
            keys = report["keys_after"] - report["keys_before"]
            grown = (report["rss_after_kib"] - report["rss_before_kib"]) * 1024
            print(f"- memory: {keys:,} more counters, RSS +{grown / 2**20:.1f} MiB: "
                  f"{grown / max(keys, 1):.0f} bytes per counter")
    small = get("keys: 10,000", "fresh", "rate")
    for scenario in ("keys: 1,000,000, first pass (inserting)", "keys: 1,000,000, held"):
        large = get(scenario, "fresh", "rate")
        if small and large:
            print(f"- memory: {scenario[6:]} / 10,000 keys throughput {large / small:.3f}")


def record(scenario, server, report):
    """One report as a JSON line, labelled with its scenario and server."""
    report = json.loads(report)
    report["scenario"], report["server"] = scenario, server
    print(json.dumps(report))


def line():
    """A one-line summary of the JSON report on stdin, for progress output."""
    r = json.loads(sys.stdin.read())
    print(f"  {r['scenario']} on {r['server']}: {r['decisions_per_second']:,.0f}/s, "
          f"{r['server_cpu_us_per_decision'] or 0:.2f} µs CPU, p50 {r['latency_us']['p50']} µs, "
          f"p99 {r['latency_us']['p99']} µs, OK {r['ok']}, OVER {r['over_limit']}, errors {r['errors']}")


def main():
    if sys.argv[1] == "record":
        return record(*sys.argv[2:5])
    if sys.argv[1] == "line":
        return line()
    reports = load(sys.argv[1])
    table = medians(reports)
    render(table)
    ratios(table, reports)


if __name__ == "__main__":
    main()

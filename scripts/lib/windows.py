"""Admissions per window of a hot key, from the instants of its OK answers.

A fixed-window limit offered far more than its rate admits each window's quota in one burst at
the window's start, so the OK answers fall into bursts separated by quiet gaps, one burst per
window. This groups the instants (Unix µs, one per line, in the files of `tollgate bench
--ok-times`: several files are merged, for several replicas sharing one limit) into bursts and
drops the first and the last, which may be partial windows. With --window-seconds N the
instants are grouped by the epoch-aligned windows of N seconds instead (for a load that may
not exhaust every window, so that no quiet gap parts them), the first and last dropped; an
answer is counted in the window it arrived in, which is its decision's but for one that
crossed the edge in flight.

    python3 scripts/lib/windows.py [--gap-ms 200 | --window-seconds N] [--json] FILE...

Prints the counts of the full windows and their maximum (or, with --json, one object).
"""

import argparse
import json
import sys


def bursts(instants, gap_us):
    """Counts of OK answers per burst, a burst ending where no answer came for `gap_us`."""
    counts = []
    last = None
    for instant in sorted(instants):
        if last is None or instant - last >= gap_us:
            counts.append(0)
        counts[-1] += 1
        last = instant
    return counts


def full_windows(instants, gap_us):
    """The counts of every burst but the first and the last."""
    return bursts(instants, gap_us)[1:-1]


def epoch_windows(instants, seconds):
    """The counts of every epoch-aligned window of `seconds` but the first and the last."""
    counts = {}
    for instant in instants:
        window = instant // (seconds * 1_000_000)
        counts[window] = counts.get(window, 0) + 1
    if not counts:
        return []
    first, last = min(counts), max(counts)
    return [counts.get(window, 0) for window in range(first + 1, last)]


def read_instants(paths):
    instants = []
    for path in paths:
        with open(path) as f:
            instants.extend(int(line) for line in f if line.strip())
    return instants


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gap-ms", type=float, default=200.0)
    parser.add_argument("--window-seconds", type=int)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    instants = read_instants(args.files)
    if args.window_seconds:
        windows = epoch_windows(instants, args.window_seconds)
    else:
        windows = full_windows(instants, args.gap_ms * 1000)
    summary = {
        "ok": len(instants),
        "windows": windows,
        "max": max(windows) if windows else None,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{summary['ok']} OK; full windows: {windows}; max {summary['max']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The server benchmark's table: medians over the repeats of each setup at each load.

Usage: python report.py RESULTS_DIR DELAY "LOADS" "SETUPS"
"""

import json
import pathlib
import statistics
import sys

results, delay = pathlib.Path(sys.argv[1]), float(sys.argv[2])
loads, setups = sys.argv[3].split(), sys.argv[4].split()
STEPS = 6


def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def row(setup, load):
    runs = [json.loads(p.read_text()) for p in sorted(results.glob(f"{setup}-{load}-*.json"))]
    if not runs:
        return None
    n = int(load)
    median = lambda f: statistics.median(f(r) for r in runs)
    added = lambda r, q: quantile([(l - STEPS * delay) / STEPS * 1000 for l in r["latencies"]], q)
    cells = [
        setup, load,
        f"{median(lambda r: (n - r['failed']) / r['wall']):.1f}",
        f"{median(lambda r: added(r, 0.5)):.1f}", f"{median(lambda r: added(r, 0.99)):.1f}",
        f"{median(lambda r: r['failed']):.0f}",
        f"{median(lambda r: r['cpu_s'] * 1000 / n):.1f}",
        f"{median(lambda r: r['mock_cpu_s'] * 1000 / n):.1f}",
        f"{median(lambda r: r.get('client_cpu_s', 0) * 1000 / n):.1f}",
        runs[len(runs) // 2]["rss"],
    ]
    if setup == "cluster":
        cells += [f"{median(lambda r: r[k] / (n * STEPS)):.1f}" for k in ("xacts", "rows", "redis")]
    else:
        cells += ["-", "-", "-"]
    return "| " + " | ".join(cells) + " |"


print("| setup | concurrent runs | runs/s | added ms/step p50 | p99 | failed | server CPU ms/run "
      "| mock CPU ms/run | client CPU ms/run | peak RSS MB | PG xacts/step | PG rows/step | Redis cmds/step |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for load in loads:
    for setup in setups:
        line = row(setup, load)
        if line:
            print(line)
floor = STEPS * delay
print(f"\nEach run: {STEPS} model calls of {delay}s (floor {floor:.1f}s); the model-bound limit at "
      f"N concurrent runs is N / {floor:.1f} runs/s.")

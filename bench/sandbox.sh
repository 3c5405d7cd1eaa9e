#!/usr/bin/env bash
# What confinement costs per `execute`: the same command (`true`) run through
# `deepagents sandbox run` unconfined, under bubblewrap and under the Landlock fallback,
# interleaved, wall clock; prints the median of each and the difference against unconfined.
#
#   bench/sandbox.sh [RUNS]     (default 100)
#
# Uses the release binary (built when missing). The difference is what one `execute` call
# pays for its sandbox; the unconfined number is the CLI's own start-up plus `sh -c true`.
set -euo pipefail

RUNS="${1:-100}"
cd "$(dirname "$0")/.."
BIN=target/release/deepagents
if [ ! -x "$BIN" ]; then
    cargo build --release --locked -p deepagents-cli >&2
fi
ROOT="$(mktemp -d)"
trap 'rm -rf "$ROOT"' EXIT

python3 - "$BIN" "$ROOT" "$RUNS" <<'PY'
import statistics, subprocess, sys, time

binary, root, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
modes = {
    "unconfined": ["--sandbox", "off"],
    "bubblewrap": ["--sandbox-engine", "bubblewrap"],
    "landlock": ["--sandbox-engine", "landlock"],
}
times = {name: [] for name in modes}
for _ in range(runs):
    for name, flags in modes.items():
        command = [binary, "sandbox", "run", "--root", root, *flags, "--", "true"]
        start = time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"{name}: `{' '.join(command)}` failed with {done.returncode}")
        times[name].append(elapsed * 1000)
base = statistics.median(times["unconfined"])
print(f"{'mode':<12} {'median ms':>10} {'vs unconfined':>14}")
for name, samples in times.items():
    median = statistics.median(samples)
    print(f"{name:<12} {median:>10.2f} {median - base:>+11.2f} ms ({median / base:.2f}x)")
PY

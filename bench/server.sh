#!/usr/bin/env bash
# Load benchmark of `deepagents serve` (release build): RUNS concurrent runs, each a new
# thread with a five-step tool loop (write_file, read_file, edit_file, ls, read_file, then an
# answer: six model calls) against a mock model that answers every call in DELAY seconds.
# Side by side: one embedded server (SQLite, runs in the process) as the baseline, then two
# servers sharing PostgreSQL and Redis (the cluster), all runs through the official
# langgraph-sdk client spread over the servers.
#
#   bash bench/server.sh [--runs N] [--delay SECONDS] [--no-build]
#
# Needs PostgreSQL and Redis as scripts/test starts them (BENCH_DATABASE_URL, BENCH_REDIS_URL
# override), and the langgraph-sdk venv scripts/test installs (target/test-deps/langgraph-venv).
# Reports, for each setup: throughput, the latency a run adds to its six model calls per
# step (p50/p99: (run latency - 6 x DELAY) / 6, queueing included), each server's peak RSS,
# and in the cluster PostgreSQL transactions and rows written and Redis commands per step.
# Nothing in CI depends on a number.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=1000
DELAY=0.2
BUILD=1
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS="$2"; shift 2 ;;
    --delay) DELAY="$2"; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
DATABASE_URL="${BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:55432/deepagents_test}"
REDIS_URL="${BENCH_REDIS_URL:-redis://127.0.0.1:56379}"
PY="${BENCH_PYTHON:-target/test-deps/langgraph-venv/bin/python}"
BIN=target/release/deepagents
[ "$BUILD" = 1 ] && cargo build --release -q -p deepagents-cli
"$PY" -c 'import langgraph_sdk' || { echo "no langgraph-sdk at $PY; run scripts/test once" >&2; exit 1; }
psql "$DATABASE_URL" -tAc 'select 1' >/dev/null || { echo "no PostgreSQL at $DATABASE_URL" >&2; exit 1; }
redis-cli -u "$REDIS_URL" ping >/dev/null || { echo "no Redis at $REDIS_URL" >&2; exit 1; }
ulimit -n 65536 2>/dev/null || true

WORK="$(mktemp -d)"
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

MOCK_PORT=58100
"$PY" bench/server/mock_model.py "$MOCK_PORT" "$DELAY" > "$WORK/mock.log" 2>&1 &
PIDS+=($!)

# serve NAME PORT [ENV=VALUE...]: a server of the mock model, its pid in $SERVED.
serve() {
  local name="$1" port="$2"; shift 2
  mkdir -p "$WORK/$name"
  env -u DEEPAGENTS_MODEL -u DEEPAGENTS_CONFIG -u DEEPAGENTS_DATABASE_URL -u DEEPAGENTS_REDIS_URL \
    OPENAI_API_KEY=bench DEEPAGENTS_DATA_DIR="$WORK/$name" HOME="$WORK/$name" "$@" \
    "$BIN" serve --model openai_chat:mock --base-url "http://127.0.0.1:$MOCK_PORT/v1" \
    --backend state --listen "127.0.0.1:$port" > "$WORK/$name.log" 2>&1 &
  SERVED=$!
  PIDS+=("$SERVED")
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/ok" >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "server $name did not start:" >&2; cat "$WORK/$name.log" >&2; exit 1
}
peak_rss_mb() { awk '/VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }
pg_counts() {
  psql "$DATABASE_URL" -tA -F' ' -c "select xact_commit + xact_rollback, tup_inserted + tup_updated + tup_deleted from pg_stat_database where datname = current_database()"
}
redis_commands() { redis-cli -u "$REDIS_URL" info stats | awk -F: '/^total_commands_processed/ {print $2+0}'; }

# report NAME RESULT.json [extra columns]
report() {
  "$PY" - "$1" "$2" "$RUNS" "$DELAY" "${@:3}" <<'PYEOF'
import json, sys
name, path, runs, delay = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
extra = sys.argv[5:]
result = json.load(open(path))
added = sorted((l - 6 * delay) / 6 * 1000 for l in result["latencies"])
pick = lambda q: added[min(len(added) - 1, int(q * len(added)))]
print(f"| {name} | {runs / result['wall']:.1f} | {pick(0.5):.1f} | {pick(0.99):.1f} | {result['failed']} | " + " | ".join(extra) + " |")
PYEOF
}

echo "| setup | runs/s | added ms/step p50 | p99 | failed | peak RSS MB per server | PG xacts/step | PG rows/step | Redis cmds/step |"
echo "|---|---|---|---|---|---|---|---|---|"

serve embedded 58101
EMBEDDED=$SERVED
"$PY" bench/server/load.py "$RUNS" http://127.0.0.1:58101 > "$WORK/embedded.json"
report "embedded (1 server, SQLite)" "$WORK/embedded.json" "$(peak_rss_mb "$EMBEDDED")" "-" "-" "-"
kill "$EMBEDDED"; wait "$EMBEDDED" 2>/dev/null || true

CLUSTER="bench-$$-$(date +%s)"
serve a 58102 DEEPAGENTS_DATABASE_URL="$DATABASE_URL" DEEPAGENTS_REDIS_URL="$REDIS_URL" DEEPAGENTS_CLUSTER="$CLUSTER"
A=$SERVED
serve b 58103 DEEPAGENTS_DATABASE_URL="$DATABASE_URL" DEEPAGENTS_REDIS_URL="$REDIS_URL" DEEPAGENTS_CLUSTER="$CLUSTER"
B=$SERVED
read -r XACTS0 ROWS0 < <(pg_counts)
CMDS0=$(redis_commands)
"$PY" bench/server/load.py "$RUNS" http://127.0.0.1:58102 http://127.0.0.1:58103 > "$WORK/cluster.json"
read -r XACTS1 ROWS1 < <(pg_counts)
CMDS1=$(redis_commands)
STEPS=$((RUNS * 6))
per_step() { awk -v d="$1" -v s="$STEPS" 'BEGIN {printf "%.1f", d / s}'; }
report "cluster (2 servers, PostgreSQL + Redis)" "$WORK/cluster.json" \
  "$(peak_rss_mb "$A") / $(peak_rss_mb "$B")" \
  "$(per_step $((XACTS1 - XACTS0)))" "$(per_step $((ROWS1 - ROWS0)))" "$(per_step $((CMDS1 - CMDS0)))"
echo
echo "$RUNS runs x 6 model calls of ${DELAY}s each; the floor is $(awk -v d="$DELAY" 'BEGIN {print 6 * d}')s per run."

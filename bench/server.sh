#!/usr/bin/env bash
# Load benchmark of `deepagents serve` (release build) beside the reference stack, in one
# sitting: at each load, RUNS concurrent runs, each a new thread with a five-step tool loop
# (write_file, read_file, edit_file, ls, read_file, then an answer: six model calls) against a
# mock model answering every call in DELAY seconds, all through the official langgraph-sdk.
#
# Setups, interleaved at every load and repeat, each started fresh:
#   embedded   one `deepagents serve` (SQLite, runs in the process) — the baseline
#   cluster    two `deepagents serve` sharing PostgreSQL and Redis, runs spread over both
#   reference  `langgraph dev` (langgraph-api, in-memory runtime, --n-jobs-per-worker 1000)
#              serving LangChain's deepagents on the same mock
#
#   bash bench/server.sh [--loads "1 10 50 200 1000"] [--repeats 3] [--delay SECONDS]
#                        [--setups "embedded cluster reference"] [--no-build]
#
# Needs PostgreSQL and Redis as scripts/test starts them (BENCH_DATABASE_URL, BENCH_REDIS_URL
# override), the langgraph-sdk venv scripts/test installs (target/test-deps/langgraph-venv),
# and for the reference a venv it makes once ($CARGO_TARGET_DIR/test-deps/server-reference-venv).
# Reports medians over the repeats of: throughput; the latency a run adds to its six model
# calls per step (p50/p99 of (latency - 6 x DELAY) / 6, thread creation and queueing
# included); the servers' CPU per run; peak RSS; in the cluster PostgreSQL transactions and
# rows written and Redis commands per step. A run that answers wrong or not within
# RUN_TIMEOUT (default 300 s) counts as failed. Nothing in CI depends on a number.
set -euo pipefail
cd "$(dirname "$0")/.."

LOADS="1 10 50 200 1000"
REPEATS=3
DELAY=0.2
SETUPS="embedded cluster reference"
BUILD=1
while [ $# -gt 0 ]; do
  case "$1" in
    --loads) LOADS="$2"; shift 2 ;;
    --repeats) REPEATS="$2"; shift 2 ;;
    --delay) DELAY="$2"; shift 2 ;;
    --setups) SETUPS="$2"; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
DATABASE_URL="${BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:55432/deepagents_bench}"
REDIS_URL="${BENCH_REDIS_URL:-redis://127.0.0.1:56379}"
TARGET="${CARGO_TARGET_DIR:-target}"
PY="${BENCH_PYTHON:-$TARGET/test-deps/langgraph-venv/bin/python}"
REF_VENV="${BENCH_REFERENCE_VENV:-$TARGET/test-deps/server-reference-venv}"
BIN="${BENCH_BIN:-$TARGET/release/deepagents}"
[ "$BUILD" = 1 ] && cargo build --release -q -p deepagents-cli
"$PY" -c 'import langgraph_sdk' || { echo "no langgraph-sdk at $PY; run scripts/test once" >&2; exit 1; }
case " $SETUPS " in *" cluster "*)
  psql "${DATABASE_URL%/*}/postgres" -tAc "select 1 from pg_database where datname = '${DATABASE_URL##*/}'" | grep -q 1 \
    || psql "${DATABASE_URL%/*}/postgres" -qc "create database ${DATABASE_URL##*/}" \
    || { echo "no PostgreSQL at $DATABASE_URL" >&2; exit 1; }
  redis-cli -u "$REDIS_URL" ping >/dev/null || { echo "no Redis at $REDIS_URL" >&2; exit 1; } ;;
esac
case " $SETUPS " in *" reference "*)
  if [ ! -x "$REF_VENV/bin/langgraph" ]; then
    python3 -m venv "$REF_VENV"
    "$REF_VENV/bin/pip" install -q "langgraph-cli[inmem]==0.4.40" "langgraph-api==0.16.7" \
      "langgraph-runtime-inmem==0.36.7" "deepagents==0.7.32" "langchain-openai==1.8.1"
  fi
  REF_VENV="$(cd "$REF_VENV" && pwd)" ;;
esac
ulimit -n 65536 2>/dev/null || true

WORK="$(mktemp -d)"
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
mkdir -p "$WORK/results"

MOCK_PORT=18100
"$PY" bench/server/mock_model.py "$MOCK_PORT" "$DELAY" > "$WORK/mock.log" 2>&1 &
MOCK=$!
PIDS+=("$MOCK")

# wait_up URL NAME: until URL answers.
wait_up() {
  for _ in $(seq 600); do
    curl -sf "$1" >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "server $2 did not start:" >&2; cat "$WORK/$2.log" >&2; exit 1
}
# serve NAME PORT [ENV=VALUE...]: a server of the mock model, its pid in $SERVED.
serve() {
  local name="$1" port="$2"; shift 2
  rm -rf "${WORK:?}/$name"; mkdir -p "$WORK/$name"
  # Room for every run's connection (the default, 768, keeps the rest in the backlog).
  printf '[server]\nmax_connections = 4096\n' > "$WORK/$name/config.toml"
  env -u DEEPAGENTS_MODEL -u DEEPAGENTS_CONFIG -u DEEPAGENTS_DATABASE_URL -u DEEPAGENTS_REDIS_URL \
    OPENAI_API_KEY=bench DEEPAGENTS_DATA_DIR="$WORK/$name" HOME="$WORK/$name" \
    DEEPAGENTS_CONFIG="$WORK/$name/config.toml" "$@" \
    "$BIN" serve --model openai_chat:mock --base-url "http://127.0.0.1:$MOCK_PORT/v1" \
    --backend state --listen "127.0.0.1:$port" > "$WORK/$name.log" 2>&1 &
  SERVED=$!
  PIDS+=("$SERVED")
  wait_up "http://127.0.0.1:$port/ok" "$name"
}
# serve_reference PORT: `langgraph dev` of the reference graph, its pid in $SERVED.
serve_reference() {
  # A fresh copy each time: langgraph dev keeps its state beside the graph.
  rm -rf "$WORK/reference-app"; mkdir "$WORK/reference-app"
  cp bench/server/reference/graph.py bench/server/reference/langgraph.json "$WORK/reference-app/"
  (cd "$WORK/reference-app" && exec env MOCK_MODEL_URL="http://127.0.0.1:$MOCK_PORT/v1" \
    LANGGRAPH_CLI_NO_ANALYTICS=1 LANGSMITH_TRACING=false LANGCHAIN_TRACING_V2=false \
    "$REF_VENV/bin/langgraph" dev --port "$1" --no-browser --no-reload \
    --n-jobs-per-worker 1000) > "$WORK/reference.log" 2>&1 &
  SERVED=$!
  PIDS+=("$SERVED")
  wait_up "http://127.0.0.1:$1/ok" reference
}
# cpu_ticks PID...: user + system clock ticks of these processes and their children so far.
cpu_ticks() {
  local total=0 pid
  for pid in "$@"; do
    for p in $pid $(pgrep -P "$pid" 2>/dev/null); do
      local ticks
      ticks=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null) || ticks=0
      total=$((total + ${ticks:-0}))
    done
  done
  echo "$total"
}
peak_rss_mb() {
  local out="" pid
  for pid in "$@"; do
    local kb=0 p
    for p in $pid $(pgrep -P "$pid" 2>/dev/null); do
      kb=$((kb + $(awk '/VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)))
    done
    out="${out:+$out / }$(awk -v k="$kb" 'BEGIN {printf "%.0f", k / 1024}')"
  done
  echo "$out"
}
pg_counts() {
  psql "$DATABASE_URL" -tA -F' ' -c "select xact_commit + xact_rollback, tup_inserted + tup_updated + tup_deleted from pg_stat_database where datname = current_database()"
}
redis_commands() { redis-cli -u "$REDIS_URL" info stats | awk -F: '/^total_commands_processed/ {print $2+0}'; }
# stop PID...: these servers and what they started (langgraph dev runs its server as a child),
# until they are gone.
stop() {
  local pid all=()
  for pid in "$@"; do all+=("$pid" $(pgrep -P "$pid" 2>/dev/null || true)); done
  kill "${all[@]}" 2>/dev/null || true
  for pid in "$@"; do wait "$pid" 2>/dev/null || true; done
  for _ in $(seq 100); do
    local alive=0
    for pid in "${all[@]}"; do [ -e "/proc/$pid" ] && alive=1; done
    [ "$alive" = 0 ] && return
    sleep 0.1
  done
  kill -9 "${all[@]}" 2>/dev/null || true
}

# measure SETUP LOAD REPEAT: one measurement, saved as results/SETUP-LOAD-REPEAT.json.
measure() {
  local setup="$1" load="$2" rep="$3" urls servers extra='{}'
  case "$setup" in
    embedded) serve embedded 18101; servers=("$SERVED"); urls="http://127.0.0.1:18101" ;;
    cluster)
      local cluster="bench-$$-$load-$rep"
      serve a 18102 DEEPAGENTS_DATABASE_URL="$DATABASE_URL" DEEPAGENTS_REDIS_URL="$REDIS_URL" DEEPAGENTS_CLUSTER="$cluster"
      local a=$SERVED
      serve b 18103 DEEPAGENTS_DATABASE_URL="$DATABASE_URL" DEEPAGENTS_REDIS_URL="$REDIS_URL" DEEPAGENTS_CLUSTER="$cluster"
      servers=("$a" "$SERVED"); urls="http://127.0.0.1:18102 http://127.0.0.1:18103"
      sleep 1.5 ;;
    reference) serve_reference 18104; servers=("$SERVED"); urls="http://127.0.0.1:18104" ;;
  esac
  local xacts0 rows0 cmds0 xacts1 rows1 cmds1
  [ "$setup" = cluster ] && { read -r xacts0 rows0 < <(pg_counts); cmds0=$(redis_commands); }
  local cpu0 mock0 cpu1 mock1
  cpu0=$(cpu_ticks "${servers[@]}"); mock0=$(cpu_ticks "$MOCK")
  # shellcheck disable=SC2086
  "$PY" bench/server/load.py "$load" $urls > "$WORK/load.json"
  cpu1=$(cpu_ticks "${servers[@]}"); mock1=$(cpu_ticks "$MOCK")
  if [ "$setup" = cluster ]; then
    sleep 1.5  # PostgreSQL publishes a backend's counts within a second
    read -r xacts1 rows1 < <(pg_counts); cmds1=$(redis_commands)
    extra=$(printf '{"xacts": %d, "rows": %d, "redis": %d}' $((xacts1 - xacts0)) $((rows1 - rows0)) $((cmds1 - cmds0)))
  fi
  "$PY" - "$WORK/load.json" "$WORK/results/$setup-$load-$rep.json" "$(getconf CLK_TCK)" \
    $((cpu1 - cpu0)) $((mock1 - mock0)) "$(peak_rss_mb "${servers[@]}")" "$extra" <<'PYEOF'
import json, sys
load, out, tck, cpu, mock, rss, extra = sys.argv[1:]
result = json.load(open(load))
result.update(cpu_s=int(cpu) / int(tck), mock_cpu_s=int(mock) / int(tck), rss=rss, **json.loads(extra))
json.dump(result, open(out, "w"))
PYEOF
  stop "${servers[@]}"
  echo "  $setup x $load (repeat $rep): $(cut -c1-60 "$WORK/load.json")..." >&2
}

for rep in $(seq "$REPEATS"); do
  for load in $LOADS; do
    for setup in $SETUPS; do
      measure "$setup" "$load" "$rep"
    done
  done
done

"$PY" bench/server/report.py "$WORK/results" "$DELAY" "$LOADS" "$SETUPS"

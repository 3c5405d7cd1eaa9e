#!/usr/bin/env bash
# Side-by-side benchmark of our harness (`deepagents run`, release build) against the Python
# deepagents harness, both driven by ONE aimock server as an OpenAI Chat Completions model.
#
#   bash bench/harness.sh [--reps R] [--sizes 10,50,200,1000] [--quick] [--checkpoint]
#                         [--context-window TOKENS] [--python-streaming] [--wait-idle S]
#                         [--no-build]
#
#   --reps R            timed runs of each harness per size (default 5)
#   --sizes LIST        the step counts N, comma-separated (default 10,50,200,1000)
#   --quick             --reps 1 --sizes 10,50
#   --checkpoint        also time ours with --thread bench-N (SQLite checkpoints in the data
#                       directory) and report store.db bytes per step
#   --context-window T  the context window both harnesses are told the model has (default
#                       1000000; 0 keeps each one's gpt-4o profile, 128k). The history of the
#                       N=1000 run grows past 85 % of 128k tokens, where either harness would
#                       summarize with an extra model call, which this workload does not script
#   --python-streaming  make the Python harness stream too (ChatOpenAI(streaming=True)); by
#                       default ours streams and langchain-openai does not
#   --wait-idle S       before each run, wait up to S seconds (default 900) for the machine
#                       to be under 10 % CPU busy; runs that still shared the CPU with other
#                       processes are flagged (warning, raw TSV column, note under the table)
#   --no-build          use target/release/deepagents as it is (fail when missing)
#
# Pinned: Python deepagents==0.7.32 and langchain-openai==1.7.4 (both resolve on PyPI), their
# dependencies pinned by bench/harness/requirements.lock (pip freeze; installed from it with
# --no-deps into target/bench-venv, which is reused while it matches the lock exactly), and
# aimock @copilotkit/aimock@1.43.0 in target/test-deps/aimock (where scripts/test puts it).
#
# The workload, identical for both (bench/harness/bench.py holds its definition): one user
# message, then N model turns each answering with exactly one tool call, cycling write_file,
# read_file, edit_file, ls, grep, glob over /f{i/6}.txt in the agent's in-memory filesystem
# (ours: --backend state; Python: the default StateBackend), then a final text answer. Both
# harnesses are used as they come: ours sends streaming Chat Completions requests (with
# stream_options.include_usage), langchain-openai's ChatOpenAI non-streaming ones (the journal
# check prints which; --python-streaming makes Python stream as well). Turn i's fixture only matches a request with i assistant messages whose last message
# is the expected result of tool call i-1, and guard fixtures answer HTTP 400 to a tool result
# with error text; after every run the journal must hold exactly N+1 requests answered 200 by
# the fixtures of turns 0..N in order, or the run is reported as failed and not timed.
#
# Each run is one whole process under /usr/bin/time, launched by `bench.py time`: CPU = user+sys
# of the process and its children from the rusage wait4 returns (microseconds; /usr/bin/time
# itself prints 10 ms steps), less what /usr/bin/time itself costs (`bench.py calibrate`, once
# per benchmark); peak RSS as /usr/bin/time measures it. (CPU = user+sys, children
# included; peak RSS in KB), harnesses interleaved (ours N=10, python N=10, ours N=50, ...),
# after one untimed warm-up run of each (at N=10, or the smallest size below it). Results: the
# table on stdout and target/bench-harness.md (raw runs in target/bench-harness.tsv).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

REPS=5
SIZES=10,50,200,1000
CHECKPOINT=0
CONTEXT_WINDOW=1000000
BUILD=1
PY_STREAMING=0
WAIT_IDLE=900
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) REPS="${2:?--reps needs a number}"; shift 2 ;;
    --reps=*) REPS="${1#*=}"; shift ;;
    --sizes) SIZES="${2:?--sizes needs a list like 10,50}"; shift 2 ;;
    --sizes=*) SIZES="${1#*=}"; shift ;;
    --quick) REPS=1; SIZES=10,50; shift ;;
    --checkpoint) CHECKPOINT=1; shift ;;
    --context-window) CONTEXT_WINDOW="${2:?--context-window needs a number}"; shift 2 ;;
    --context-window=*) CONTEXT_WINDOW="${1#*=}"; shift ;;
    --python-streaming) PY_STREAMING=1; shift ;;
    --wait-idle) WAIT_IDLE="${2:?--wait-idle needs seconds}"; shift 2 ;;
    --wait-idle=*) WAIT_IDLE="${1#*=}"; shift ;;
    --no-build) BUILD=0; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$REPS" =~ ^[1-9][0-9]*$ ]] || { echo "error: --reps must be a positive integer" >&2; exit 2; }
[[ "$SIZES" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] \
  || { echo "error: --sizes must be positive integers separated by commas" >&2; exit 2; }
[[ "$WAIT_IDLE" =~ ^[0-9]+$ ]] || { echo "error: --wait-idle must be a number of seconds" >&2; exit 2; }
[[ "$CONTEXT_WINDOW" =~ ^[0-9]+$ ]] || { echo "error: --context-window must be a number" >&2; exit 2; }
IFS=, read -r -a SIZE_LIST <<<"$SIZES"

log() { printf '[bench] %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

apt_install() {
  [ "$(id -u)" = 0 ] || die "missing Debian packages ($*) and not root; install them and re-run"
  log "installing Debian packages: $*"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# --- tools -------------------------------------------------------------------------------
if [ ! -x /usr/bin/time ]; then
  apt_install time
  [ -x /usr/bin/time ] || die "/usr/bin/time is still missing after installing 'time'"
fi
command -v python3 >/dev/null 2>&1 || die "python3 is not on PATH"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  apt_install nodejs npm
fi
node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&b>=15)?0:1)' \
  || die "aimock needs Node.js >= 20.15 on PATH (found: $(node --version))"

# --- Python anchor ---------------------------------------------------------------------------
VENV="$ROOT/target/bench-venv"
LOCK="$ROOT/bench/harness/requirements.lock"
PY="$VENV/bin/python"
PINS=(deepagents==0.7.32 langchain-openai==1.7.4)
venv_matches() {
  [ -x "$PY" ] || return 1
  if [ -f "$LOCK" ]; then
    diff -q <("$PY" -m pip freeze --disable-pip-version-check 2>/dev/null | sort) \
      <(grep -v '^#' "$LOCK" | sed '/^$/d' | sort) >/dev/null
  else
    for pin in "${PINS[@]}"; do
      [ "$("$PY" -m pip show "${pin%%==*}" 2>/dev/null | sed -n 's/^Version: //p')" = "${pin#*==}" ] \
        || return 1
    done
  fi
}
if ! venv_matches; then
  log "creating the Python venv $VENV"
  rm -rf "$VENV"
  if ! python3 -m venv "$VENV" 2>/dev/null; then
    rm -rf "$VENV"
    apt_install python3-venv
    python3 -m venv "$VENV"
  fi
  if [ -f "$LOCK" ]; then
    "$PY" -m pip install --quiet --disable-pip-version-check --no-deps -r "$LOCK"
  else
    "$PY" -m pip install --quiet --disable-pip-version-check "${PINS[@]}"
    {
      echo "# pip freeze of ${PINS[*]} (bench/harness.sh installs it with --no-deps)"
      "$PY" -m pip freeze --disable-pip-version-check
    } >"$LOCK"
    log "wrote $LOCK"
  fi
  venv_matches || die "the venv $VENV does not match $LOCK after installing it"
fi
for pin in "${PINS[@]}"; do
  [ "$("$PY" -m pip show "${pin%%==*}" 2>/dev/null | sed -n 's/^Version: //p')" = "${pin#*==}" ] \
    || die "the venv lacks $pin"
done

# --- aimock ------------------------------------------------------------------------------------
MOCK_DIR="$ROOT/target/test-deps/aimock"
AIMOCK_CLI="$MOCK_DIR/node_modules/@copilotkit/aimock/dist/cli.js"
if [ ! -f "$AIMOCK_CLI" ] \
  || ! grep -q '"version": "1.43.0"' "$MOCK_DIR/node_modules/@copilotkit/aimock/package.json"; then
  log "installing @copilotkit/aimock@1.43.0 into $MOCK_DIR"
  mkdir -p "$MOCK_DIR"
  npm install --prefix "$MOCK_DIR" --no-save --no-audit --no-fund --loglevel=error @copilotkit/aimock@1.43.0
fi

# --- our binary ------------------------------------------------------------------------------
BIN="$ROOT/target/release/deepagents"
if [ "$BUILD" = 1 ]; then
  log "building the release binary (cargo build --release -p deepagents-cli --locked)"
  cargo build --release -p deepagents-cli --locked
fi
[ -x "$BIN" ] || die "$BIN is missing (build it: cargo build --release -p deepagents-cli --locked)"

# CPU accounting from /proc (clock ticks): busy time of all cores, all time of all cores, and
# one process's own user+sys. Used to wait for a quiet machine and to flag runs that shared the
# CPU with something else (a build, a test run).
TICKS="$(getconf CLK_TCK 2>/dev/null || echo 100)"
NCPU="$(nproc 2>/dev/null || echo 1)"
busy_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9; exit}' /proc/stat; }
all_ticks() { awk '/^cpu /{s=0; for (i=2; i<=NF; i++) s+=$i; print s; exit}' /proc/stat; }
proc_ticks() { awk '{print $14+$15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# wait_idle: until the machine's CPU is below 10 % busy over 2 s, at most $WAIT_IDLE seconds.
wait_idle() {
  local waited=0 b0 t0 b1 t1
  while :; do
    b0="$(busy_ticks)" t0="$(all_ticks)"
    sleep 2
    b1="$(busy_ticks)" t1="$(all_ticks)"
    if [ $(((b1 - b0) * 100)) -le $(((t1 - t0) * 10)) ]; then return 0; fi
    if [ "$waited" -ge "$WAIT_IDLE" ]; then
      [ "$WAIT_IDLE" = 0 ] || log "the machine is still busy after ${WAIT_IDLE} s; running anyway"
      return 0
    fi
    [ "$waited" != 0 ] || log "waiting (up to ${WAIT_IDLE} s) for the machine to go idle: something else uses the CPU"
    sleep 3
    waited=$((waited + 5))
  done
}

START_LOAD="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
log "load average at start: $START_LOAD"

# --- the mock server, one for the whole benchmark -----------------------------------------------
WORK="$(mktemp -d "${TMPDIR:-/tmp}/bench-harness.XXXXXX")"
AIMOCK_PID=""
cleanup() {
  if [ -n "$AIMOCK_PID" ] && kill -0 "$AIMOCK_PID" 2>/dev/null; then
    kill "$AIMOCK_PID" 2>/dev/null || true
    wait "$AIMOCK_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo '{"fixtures": []}' >"$WORK/empty.json"
# Strict turnIndex: a fixture for turn i never answers a request at another depth. Journal
# unbounded (the default keeps 1000 entries; N=1000 makes 1001 requests).
AIMOCK_STRICT_TURN_INDEX=1 node "$AIMOCK_CLI" --host 127.0.0.1 --port 0 \
  --fixtures "$WORK/empty.json" --journal-max 0 --log-level info >"$WORK/aimock.log" 2>&1 &
AIMOCK_PID=$!
URL=""
for _ in $(seq 1 100); do
  URL="$(sed -n 's#.*listening on \(http://127\.0\.0\.1:[0-9][0-9]*\).*#\1#p' "$WORK/aimock.log" | head -n 1)"
  [ -n "$URL" ] && break
  kill -0 "$AIMOCK_PID" 2>/dev/null || { cat "$WORK/aimock.log" >&2; die "aimock exited at start"; }
  sleep 0.1
done
[ -n "$URL" ] || { cat "$WORK/aimock.log" >&2; die "aimock did not report its port within 10 s"; }
log "aimock $AIMOCK_PID on $URL"

BENCH=("$PY" "$ROOT/bench/harness/bench.py")
TASK="$("$PY" -c 'import sys; sys.path.insert(0, "bench/harness"); import bench; print(bench.TASK)')"
RESULTS="$ROOT/target/bench-harness.tsv"
LAUNCH_OVERHEAD="$("${BENCH[@]}" calibrate)"
log "/usr/bin/time itself costs $(awk -v o="$LAUNCH_OVERHEAD" 'BEGIN { printf "%.2f", o * 1000 }') ms of CPU per run; subtracted"
printf '# harness\tn\trep\tstatus\tcpu_s\trss_kb\tdb_bytes\tother_cpu_s\tdisturbed\n' >"$RESULTS"

# Environment of both harnesses: nothing of the caller's provider, tracing or agent settings.
CLEAN_ENV=(env -u OPENAI_BASE_URL -u OPENAI_API_BASE -u DEEPAGENTS_MODEL -u DEEPAGENTS_CONFIG
  -u DEEPAGENTS_DATABASE_URL -u LANGSMITH_TRACING -u LANGCHAIN_TRACING_V2 -u LANGSMITH_API_KEY
  -u LANGCHAIN_API_KEY OPENAI_API_KEY=test)

# run_one HARNESS N REP: one run under /usr/bin/time, checked against the journal; appends a
# row to $RESULTS unless REP is "warmup". HARNESS: ours, python or ours-thread.
run_one() {
  local harness="$1" n="$2" rep="$3"
  local dir="$WORK/run-$harness-$n-$rep"
  mkdir -p "$dir/home" "$dir/data" "$dir/cwd"
  "${BENCH[@]}" load --url "$URL" --n "$n"
  local cmd
  case "$harness" in
    ours | ours-thread)
      cmd=("$BIN" run --model openai_chat:gpt-4o --base-url "$URL/v1" --backend state
        --max-turns "$((n + 10))")
      if [ "$CONTEXT_WINDOW" != 0 ]; then cmd+=(--max-input-tokens "$CONTEXT_WINDOW"); fi
      if [ "$harness" = ours-thread ]; then cmd+=(--thread "bench-$n"); fi
      cmd+=("$TASK")
      ;;
    python)
      cmd=("$PY" "$ROOT/bench/harness/run_python.py" --n "$n" --base-url "$URL/v1"
        --context-window "$CONTEXT_WINDOW")
      if [ "$PY_STREAMING" = 1 ]; then cmd+=(--streaming); fi
      ;;
  esac
  local rc=0 b0 a0 w0 b1 a1 w1
  wait_idle
  b0="$(busy_ticks)" a0="$(proc_ticks "$AIMOCK_PID")" w0="$(date +%s%N)"
  (cd "$dir/cwd" && "${CLEAN_ENV[@]}" HOME="$dir/home" DEEPAGENTS_DATA_DIR="$dir/data" \
    "$PY" "$ROOT/bench/harness/bench.py" time -o "$dir/time" -- "${cmd[@]}" \
    >"$dir/stdout" 2>"$dir/stderr") || rc=$?
  b1="$(busy_ticks)" a1="$(proc_ticks "$AIMOCK_PID")" w1="$(date +%s%N)"
  local status=ok why=""
  if [ "$rc" != 0 ]; then
    status=failed
    why="exit $rc: $( (grep -v '^Command exited' "$dir/stderr" || true) | tail -n 3 | tr '\n' ' ')"
  elif ! grep -qF "Done: $n tool calls." "$dir/stdout"; then
    status=failed
    why="final answer missing from stdout: $(tail -c 300 "$dir/stdout" | tr '\n' ' ')"
  fi
  local check
  if check="$("${BENCH[@]}" check --url "$URL" --n "$n" 2>&1)"; then
    :
  else
    status=failed
    why="$why $check"
  fi
  local user sys rss cpu db=""
  user=0 sys=0 rss=0
  if [ -s "$dir/time" ]; then read -r user sys rss < <(tail -n 1 "$dir/time"); fi
  cpu="$(awk -v u="$user" -v s="$sys" -v o="$LAUNCH_OVERHEAD" \
    'BEGIN { c = u + s - o; printf "%.6f", (c < 0 ? 0 : c) }')"
  # CPU that neither the harness nor aimock used during the run; over 0.2 s plus 5 % of the
  # machine, the run shared the CPU with something else and its timing is disturbed.
  local other disturbed
  other="$(awk -v b="$((b1 - b0))" -v a="$((a1 - a0))" -v t="$TICKS" -v c="$cpu" \
    'BEGIN { o = (b - a) / t - c; printf "%.2f", (o < 0 ? 0 : o) }')"
  disturbed="$(awk -v o="$other" -v w="$((w1 - w0))" -v n="$NCPU" \
    'BEGIN { print (o > 0.2 + 0.05 * n * w / 1e9) ? 1 : 0 }')"
  if [ "$harness" = ours-thread ] && [ -f "$dir/data/store.db" ]; then
    db="$(stat -c %s "$dir/data/store.db")"
    # A WAL the process left behind holds checkpoints too.
    if [ -f "$dir/data/store.db-wal" ]; then db=$((db + $(stat -c %s "$dir/data/store.db-wal"))); fi
  fi
  if [ "$status" = ok ]; then
    log "$(printf '%-11s N=%-5s %-6s cpu %8.1f ms  rss %6.1f MB%s  (%s)' "$harness" "$n" "$rep" \
      "$(awk -v c="$cpu" 'BEGIN { print c * 1000 }')" "$(awk -v r="$rss" 'BEGIN { print r / 1024 }')" \
      "${db:+  db $db B}" "$check")"
    if [ "$disturbed" = 1 ]; then
      log "  warning: other processes used $other s of CPU during this run; its timing is disturbed"
    fi
  else
    log "$harness N=$n $rep FAILED: $why"
  fi
  if [ "$rep" != warmup ]; then
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$harness" "$n" "$rep" "$status" "$cpu" "$rss" "$db" \
      "$other" "$disturbed" >>"$RESULTS"
  fi
  rm -rf "$dir"
}

HARNESSES=(ours python)
[ "$CHECKPOINT" = 1 ] && HARNESSES+=(ours-thread)

# The warm-up loads binaries, libraries and Python's bytecode into the page cache; a small run
# does that as well as a large one.
WARM_N=10
for n in "${SIZE_LIST[@]}"; do if [ "$n" -lt "$WARM_N" ]; then WARM_N="$n"; fi; done
log "warm-up (untimed): ${HARNESSES[*]} at N=$WARM_N"
for h in "${HARNESSES[@]}"; do run_one "$h" "$WARM_N" warmup; done

for n in "${SIZE_LIST[@]}"; do
  for rep in $(seq 1 "$REPS"); do
    for h in "${HARNESSES[@]}"; do run_one "$h" "$n" "$rep"; done
  done
done

OUT="$ROOT/target/bench-harness.md"
HEADER="# Harness benchmark: deepagents-rs vs Python deepagents\\n\\n"
HEADER+="$(date -u +%Y-%m-%dT%H:%MZ), $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), "
WINDOW_TEXT="$CONTEXT_WINDOW tokens"; [ "$CONTEXT_WINDOW" = 0 ] && WINDOW_TEXT="from the gpt-4o profiles"
HEADER+="reps $REPS, sizes $SIZES, context window $WINDOW_TEXT; "
STREAM_TEXT="ours streaming, Python non-streaming"; [ "$PY_STREAMING" = 1 ] && STREAM_TEXT="both streaming"
HEADER+="$STREAM_TEXT; "
HEADER+="Python deepagents 0.7.32 + langchain-openai 1.7.4 ($("$PY" -V 2>&1)), aimock 1.43.0 (node $(node --version)), "
HEADER+="$(nproc) cores. Medians of user+sys CPU and peak RSS of the whole process "
HEADER+="(CPU from wait4 in microseconds, less the $(awk -v o="$LAUNCH_OVERHEAD" 'BEGIN { printf "%.2f", o * 1000 }') ms /usr/bin/time itself costs; peak RSS from /usr/bin/time); a failed run is not timed.\\n\\n"
HEADER+="Load average at start / end: $START_LOAD / $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?').\\n\\n"
echo
"${BENCH[@]}" table --results "$RESULTS" --out "$OUT" --header "$HEADER"
echo
log "wrote $OUT (raw runs: $RESULTS)"
if grep -q $'\tfailed\t' "$RESULTS"; then
  log "some runs failed (see above)"
  exit 1
fi

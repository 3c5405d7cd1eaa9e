#!/usr/bin/env bash
# The terminal UI (`deepagents` with no subcommand) on a long thread against a short one: what
# a streamed answer, an idle screen and a keystroke cost the TUI process when the thread holds
# 500+ earlier steps (~1 MB of conversation) rather than one exchange. A benchmark that reports
# ratios, not a test: nothing fails on a number.
#
#   bash bench/tui.sh [--release] [--no-build] [--reps R] [--steps N] [--tokens T]
#                     [--chunk-size C] [--latency MS] [--size WxH] [--idle S] [--probes N]
#                     [--no-keys] [--wait-idle S]
#
#   --release        build (cargo build --release -p deepagents-cli) and measure
#                    target/release/deepagents, for absolute numbers. By default the DEBUG
#                    build target/debug/deepagents is measured as it is (built with
#                    `cargo build -p deepagents-cli` only when missing): its ratios mean
#                    something, its absolute CPU times do not
#   --no-build       never build; fail when the binary is missing
#   --reps R         measured turns per thread (default 1; the table shows medians)
#   --steps N        earlier steps (tool calls) of the long thread (default 500)
#   --tokens T       length of the streamed answer, at 4 characters a token (default 50000)
#   --chunk-size C   characters per streamed chunk (default 40, ~10 tokens)
#   --latency MS     aimock's pause between chunks (default 2: 5,000 chunks over >= 10 s)
#   --size WxH       the terminal (tmux window) size (default 120x40)
#   --idle S         seconds of idle CPU measured after the answer (default 10)
#   --probes N       keystrokes timed while an answer streams (default 20)
#   --no-keys        skip the key-latency turns
#   --wait-idle S    before each measured turn, wait up to S seconds (default 120) for the
#                    machine to be under 10 % CPU busy (the note under the table says when not)
#
# Threads: in a temp data directory, a headless `deepagents run --backend state` against a
# scripted model makes thread `short` (one message, one text answer) and thread `long` (N model
# turns of one tool call each, write_file of a ~1.8 KB file then read_file of it, ~2 KB per
# step, then a text answer). Then, for each thread and each repetition, on a fresh copy of that
# data directory, the TUI is opened on it (`deepagents --thread ID --backend state`) in a
# detached tmux session of its own server (tmux -L) of the given size, with the model
# `openai_chat:bench` sent to aimock (@copilotkit/aimock@1.43.0 in target/test-deps/aimock,
# where scripts/test puts it), and bench/tui/bench.py types one message; aimock streams back a
# T-token markdown answer (paragraphs, lists, headings, `code`, **bold**) in C-character
# chunks MS ms apart. The window is told 2,000,000 tokens (--max-input-tokens) so the long
# thread is never summarized.
#
# Measured, as utime+stime of the TUI process (/proc/PID/stat, all its threads; 10 ms ticks):
#   open     from exec until the thread is drawn (its last answer on screen) plus 1 s
#   request  from Enter until aimock's debug log says the request matched its fixture
#   stream   from there until the answer's last words are on the screen (capture-pane polled
#            every 50 ms) -> CPU ms per 1,000 tokens: the headline, target long/short <= 2x
#   finish   from there until 1 s after the status line no longer says "working"
#   idle     the following S seconds, as % of one core (should be ~0)
# The request aimock received (its journal keeps the size of bodies over 64 KB) gives the
# conversation's size in KB of JSON. Key latency, in a separate turn on another fresh copy so
# its keystrokes do not weigh on the CPU figures: while the answer streams, one character is
# typed with `tmux send-keys` and timed until `capture-pane` shows it in the input box, then
# erased (each capture-pane is a process start, so this resolves to ~5-10 ms).
# Results: the table on stdout and in target/bench-tui.md (raw JSON lines in
# target/bench-tui.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

PROFILE=debug
BUILD=1
REPS=1
STEPS=500
TOKENS=50000
CHUNK=40
LATENCY=2
SIZE=120x40
IDLE=10
PROBES=20
KEYS=1
WAIT_IDLE=120
while [ $# -gt 0 ]; do
  case "$1" in
    --release) PROFILE=release; shift ;;
    --no-build) BUILD=0; shift ;;
    --reps) REPS="${2:?--reps needs a number}"; shift 2 ;;
    --steps) STEPS="${2:?--steps needs a number}"; shift 2 ;;
    --tokens) TOKENS="${2:?--tokens needs a number}"; shift 2 ;;
    --chunk-size) CHUNK="${2:?--chunk-size needs a number}"; shift 2 ;;
    --latency) LATENCY="${2:?--latency needs milliseconds}"; shift 2 ;;
    --size) SIZE="${2:?--size needs WxH}"; shift 2 ;;
    --idle) IDLE="${2:?--idle needs seconds}"; shift 2 ;;
    --probes) PROBES="${2:?--probes needs a number}"; shift 2 ;;
    --no-keys) KEYS=0; shift ;;
    --wait-idle) WAIT_IDLE="${2:?--wait-idle needs seconds}"; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in REPS STEPS TOKENS CHUNK IDLE PROBES; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "error: --${v,,} must be a positive integer" >&2; exit 2; }
done
[[ "$LATENCY" =~ ^[0-9]+$ ]] || { echo "error: --latency must be milliseconds" >&2; exit 2; }
[[ "$WAIT_IDLE" =~ ^[0-9]+$ ]] || { echo "error: --wait-idle must be seconds" >&2; exit 2; }
[[ "$SIZE" =~ ^([0-9]+)x([0-9]+)$ ]] || { echo "error: --size must be WxH, e.g. 120x40" >&2; exit 2; }
COLS="${BASH_REMATCH[1]}" ROWS="${BASH_REMATCH[2]}"

log() { echo "bench-tui: $*" >&2; }
die() { echo "bench-tui: error: $*" >&2; exit 1; }

command -v tmux >/dev/null 2>&1 || die "tmux is not on PATH (apt-get install tmux)"
command -v python3 >/dev/null 2>&1 || die "python3 is not on PATH"
command -v node >/dev/null 2>&1 || die "node is not on PATH (aimock needs Node.js >= 20.15)"
node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&b>=15)?0:1)' \
  || die "aimock needs Node.js >= 20.15 on PATH (found: $(node --version))"

# --- aimock, pinned ------------------------------------------------------------------------------
MOCK_DIR="$ROOT/target/test-deps/aimock"
AIMOCK_CLI="$MOCK_DIR/node_modules/@copilotkit/aimock/dist/cli.js"
if [ ! -f "$AIMOCK_CLI" ] \
  || ! grep -q '"version": "1.43.0"' "$MOCK_DIR/node_modules/@copilotkit/aimock/package.json"; then
  log "installing @copilotkit/aimock@1.43.0 into $MOCK_DIR"
  mkdir -p "$MOCK_DIR"
  npm install --prefix "$MOCK_DIR" --no-save --no-audit --no-fund --loglevel=error @copilotkit/aimock@1.43.0
fi

# --- our binary ------------------------------------------------------------------------------
BIN="$ROOT/target/$PROFILE/deepagents"
if [ "$PROFILE" = release ] && [ "$BUILD" = 1 ]; then
  log "building the release binary (cargo build --release -p deepagents-cli)"
  cargo build --release -p deepagents-cli
elif [ ! -x "$BIN" ] && [ "$BUILD" = 1 ]; then
  log "building the debug binary (cargo build -p deepagents-cli)"
  cargo build -p deepagents-cli
fi
[ -x "$BIN" ] || die "$BIN is missing"
BIN_TIME="$(date -u -r "$BIN" '+%Y-%m-%d %H:%M UTC')"
HZ="$(getconf CLK_TCK)"

# --- machine load ------------------------------------------------------------------------------
busy_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9; exit}' /proc/stat; }
all_ticks() { awk '/^cpu /{s=0; for (i=2; i<=NF; i++) s+=$i; print s; exit}' /proc/stat; }
BUSY_RUNS=0
# wait_idle: until the machine is under 10 % busy over 2 s, at most $WAIT_IDLE seconds.
wait_idle() {
  local waited=0 b0 t0 b1 t1
  while :; do
    b0="$(busy_ticks)" t0="$(all_ticks)"
    sleep 2
    b1="$(busy_ticks)" t1="$(all_ticks)"
    [ $(((b1 - b0) * 100)) -le $(((t1 - t0) * 10)) ] && return 0
    if [ "$waited" -ge "$WAIT_IDLE" ]; then
      log "the machine is still busy after ${WAIT_IDLE} s; measuring anyway"
      BUSY_RUNS=$((BUSY_RUNS + 1))
      return 0
    fi
    [ "$waited" != 0 ] || log "waiting (up to ${WAIT_IDLE} s) for the machine to go idle"
    sleep 3
    waited=$((waited + 5))
  done
}
START_LOAD="$(cut -d' ' -f1-3 /proc/loadavg)"

# --- work directory, tmux server, aimock ---------------------------------------------------------
WORK="$(mktemp -d "${TMPDIR:-/tmp}/bench-tui.XXXXXX")"
export BENCH_TMUX_SOCKET="bench-tui-$$"
AIMOCK_PID=""
cleanup() {
  tmux -L "$BENCH_TMUX_SOCKET" kill-server 2>/dev/null || true
  if [ -n "$AIMOCK_PID" ] && kill -0 "$AIMOCK_PID" 2>/dev/null; then
    kill "$AIMOCK_PID" 2>/dev/null || true
    wait "$AIMOCK_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
T() { tmux -L "$BENCH_TMUX_SOCKET" "$@"; }
BENCH=(python3 "$ROOT/bench/tui/bench.py")

"${BENCH[@]}" fixtures --chars $((TOKENS * 4)) --chunk-size "$CHUNK" --latency "$LATENCY" \
  >"$WORK/fixtures.json"
# Debug logging: one "Fixture matched" line per request, which marks when a request arrived.
node "$AIMOCK_CLI" --host 127.0.0.1 --port 0 --fixtures "$WORK/fixtures.json" \
  --journal-max 2 --log-level debug >"$WORK/aimock.log" 2>&1 &
AIMOCK_PID=$!
URL=""
for _ in $(seq 1 100); do
  URL="$(sed -n 's#.*listening on \(http://127\.0\.0\.1:[0-9][0-9]*\).*#\1#p' "$WORK/aimock.log" | head -n 1)"
  [ -n "$URL" ] && break
  kill -0 "$AIMOCK_PID" 2>/dev/null || { cat "$WORK/aimock.log" >&2; die "aimock exited at start"; }
  sleep 0.1
done
[ -n "$URL" ] || { cat "$WORK/aimock.log" >&2; die "aimock did not report its port within 10 s"; }
log "aimock $AIMOCK_PID on $URL; binary $BIN ($PROFILE build of $BIN_TIME)"

# --- the two threads ---------------------------------------------------------------------------
# da DATA_DIR ARGS...: the binary with only this benchmark's settings.
da() {
  local data="$1"; shift
  (cd "$data" && env -u DEEPAGENTS_MODEL -u DEEPAGENTS_CONFIG -u DEEPAGENTS_DATABASE_URL \
    -u DEEPAGENTS_REDIS_URL -u OPENAI_BASE_URL DEEPAGENTS_DATA_DIR="$data" HOME="$data" \
    "$BIN" "$@")
}
mkdir -p "$WORK/data"
"${BENCH[@]}" script --steps 0 --out "$WORK/short.json"
"${BENCH[@]}" script --steps "$STEPS" --out "$WORK/long.json"
da "$WORK/data" run -q --backend state --thread short --model "scripted:$WORK/short.json" \
  "Say hello" >/dev/null
log "making the long thread ($STEPS tool calls)"
da "$WORK/data" run -q --backend state --thread long --max-turns $((STEPS + 10)) \
  --max-input-tokens 2000000 --model "scripted:$WORK/long.json" "Fill the notes directory" >/dev/null
log "threads made; data directory $(du -sk "$WORK/data" | cut -f1) KB"

# open_tui CASE NAME: a fresh copy of the data directory, the TUI on thread CASE in tmux
# session NAME; sets PID (the TUI process) and OPEN_MS (its CPU until the thread is drawn,
# plus 1 s).
open_tui() {
  local case="$1" name="$2" data="$WORK/$2" last steps screen
  rm -rf "$data"
  cp -a "$WORK/data" "$data"
  steps=0
  [ "$case" = long ] && steps="$STEPS"
  last="Done after $steps tool calls."
  T new-session -d -s "$name" -x "$COLS" -y "$ROWS" \
    "cd '$data' && exec env -u DEEPAGENTS_MODEL -u DEEPAGENTS_CONFIG -u DEEPAGENTS_DATABASE_URL -u DEEPAGENTS_REDIS_URL -u OPENAI_BASE_URL DEEPAGENTS_DATA_DIR='$data' HOME='$data' OPENAI_API_KEY=bench '$BIN' --thread $case --backend state --model openai_chat:bench --base-url '$URL/v1' --max-input-tokens 2000000"
  T set-option -t "$name" remain-on-exit on >/dev/null
  PID="$(T display-message -p -t "$name" '#{pane_pid}')"
  for _ in $(seq 1 1200); do
    screen="$(T capture-pane -p -t "$name")"
    if [[ "$screen" == *"message · /help"* && "$screen" == *"$last"* ]]; then
      sleep 1
      [ "$(cat "/proc/$PID/comm" 2>/dev/null)" = deepagents ] \
        || die "the pane's process $PID is not deepagents"
      OPEN_MS="$(awk -v hz="$HZ" '{ s = substr($0, index($0, ")") + 2); split(s, f, " "); print (f[12] + f[13]) * 1000 / hz }' "/proc/$PID/stat")"
      return 0
    fi
    if [ "$(T display-message -p -t "$name" '#{pane_dead}')" = 1 ]; then
      echo "$screen" >&2
      die "the TUI exited on thread $case"
    fi
    sleep 0.1
  done
  T capture-pane -p -t "$name" >&2
  die "the TUI never showed thread $case (\"$last\")"
}

RESULTS="$ROOT/target/bench-tui.jsonl"
: >"$RESULTS"
for rep in $(seq 1 "$REPS"); do
  for case in short long; do
    wait_idle
    name="$case-$rep"
    log "$case thread, turn $rep: opening the TUI, streaming ~$TOKENS tokens"
    open_tui "$case" "$name"
    turn="$("${BENCH[@]}" turn --session "$name" --pid "$PID" --aimock-log "$WORK/aimock.log" \
      --message "bench-tui-stream: write the long answer")"
    request="$("${BENCH[@]}" request --url "$URL")"
    idle="$("${BENCH[@]}" idle --pid "$PID" --seconds "$IDLE")"
    T kill-session -t "$name"
    python3 -c 'import json, sys; r = {"case": sys.argv[1], "rep": int(sys.argv[2]), "open_cpu_ms": float(sys.argv[3])}
for a in sys.argv[4:]: r.update(json.loads(a))
print(json.dumps(r))' "$case" "$rep" "$OPEN_MS" "$turn" "$request" "$idle" >>"$RESULTS"
    tail -n 1 "$RESULTS" >&2
    if [ "$KEYS" = 1 ]; then
      wait_idle
      log "$case thread, turn $rep: key latency while streaming"
      open_tui "$case" "$name-keys"
      keys="$("${BENCH[@]}" keys --session "$name-keys" --aimock-log "$WORK/aimock.log" \
        --message "bench-tui-keys: write the long answer" --probes "$PROBES")"
      T kill-session -t "$name-keys"
      python3 -c 'import json, sys; r = {"case": sys.argv[1], "rep": int(sys.argv[2])}; r.update(json.loads(sys.argv[3])); print(json.dumps(r))' \
        "$case" "$rep" "$keys" >>"$RESULTS"
      tail -n 1 "$RESULTS" >&2
    fi
  done
done

END_LOAD="$(cut -d' ' -f1-3 /proc/loadavg)"
{
  echo "## TUI: long thread vs short thread"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD 2>/dev/null || echo '?'); binary: $BIN, a **$PROFILE build** of $BIN_TIME$([ "$PROFILE" = debug ] && echo ' (absolute CPU times of a debug build mean little; compare the ratios, or run with --release)'); $(nproc) cores; load average $START_LOAD at start, $END_LOAD at the end."
  echo "Long thread: $STEPS earlier tool-call steps; answer: ~$TOKENS tokens ($((TOKENS * 4)) characters) in $CHUNK-character chunks ${LATENCY} ms apart (aimock 1.43.0, node $(node --version)); terminal ${COLS}x${ROWS} (tmux $(tmux -V | cut -d' ' -f2)); medians of $REPS turn(s) per thread."
  echo
  "${BENCH[@]}" report --results "$RESULTS" --tokens "$TOKENS" --idle "$IDLE"
  echo
  echo "Target: streaming CPU per 1,000 tokens on the long thread at most 2x the short thread's; idle CPU ~0."
  [ "$BUSY_RUNS" = 0 ] || echo "Note: $BUSY_RUNS measured turn(s) started while the machine was over 10 % busy with other work."
} | tee "$ROOT/target/bench-tui.md"

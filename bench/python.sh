#!/usr/bin/env bash
# The Python API's overhead per step against the reference package, side by side on one mock:
# the same N-step tool loop (a Python tool, a mock OpenAI model answering at once) through
# deepagents_rs — with the model as a spec string, as a ChatOpenAI object (read into the native
# client), as a chat model called through Python, and with a pass-through Python middleware —
# and through LangChain's deepagents, with and without that middleware. The last column is
# the reference's time per step over this row's (the middleware row against the reference's
# middleware row).
#
#   RS_PYTHON=…/bin/python REF_PYTHON=…/bin/python bash bench/python.sh [STEPS] [RUNS]
#
# RS_PYTHON: a virtualenv with deepagents_rs built optimized and langchain-openai installed
#   (cd python && maturin develop --profile profiling);
# REF_PYTHON: one with the reference (pip install deepagents==0.7.32 langchain-openai==1.8.1).
set -euo pipefail
cd "$(dirname "$0")/python"
STEPS="${1:-50}"
RUNS="${2:-5}"
PORT=58731
python3 mock_openai.py "$PORT" "$STEPS" &
MOCK=$!
trap 'kill $MOCK 2>/dev/null' EXIT
sleep 0.5
export OPENAI_BASE_URL="http://127.0.0.1:$PORT/v1" OPENAI_API_KEY=x
row() { "$1" loop.py "$2" "$STEPS" "$RUNS"; }
declare -A per_step start rss
for impl in rs rs-object rs-python rs-middleware reference reference-middleware; do
  case "$impl" in rs*) py="$RS_PYTHON" ;; *) py="$REF_PYTHON" ;; esac
  read -r _ per_step[$impl] start[$impl] rss[$impl] < <(row "$py" "$impl")
done
echo "steps per run: $STEPS + answer, runs: $RUNS (median)"
printf '%-34s %12s %20s %14s %12s\n' "" "ms per step" "import + build (ms)" "peak RSS (MB)" "ref / this"
for impl in rs rs-object rs-python rs-middleware reference reference-middleware; do
  case "$impl" in
    rs) label="deepagents_rs, spec string" ;;
    rs-object) label="deepagents_rs, ChatOpenAI object" ;;
    rs-python) label="deepagents_rs, model via Python" ;;
    rs-middleware) label="deepagents_rs + Python middleware" ;;
    reference) label="deepagents 0.7.32" ;;
    reference-middleware) label="deepagents 0.7.32 + middleware" ;;
  esac
  base="${per_step[reference]}"
  [ "$impl" = rs-middleware ] && base="${per_step[reference-middleware]}"
  ratio=$(awk -v a="${per_step[$impl]}" -v b="$base" 'BEGIN { printf "%.1fx", b / a }')
  printf '%-34s %12s %20s %14s %12s\n' "$label" "${per_step[$impl]}" "${start[$impl]}" "${rss[$impl]}" "$ratio"
done

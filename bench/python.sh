#!/usr/bin/env bash
# The Python API's overhead per step against the reference package, side by side on one mock:
# the same N-step tool loop (a Python tool, a mock OpenAI model answering at once) through
# deepagents_rs and through LangChain's deepagents. Reported as a ratio.
#
#   RS_PYTHON=…/bin/python REF_PYTHON=…/bin/python bash bench/python.sh [STEPS] [RUNS]
#
# RS_PYTHON: a virtualenv with deepagents_rs built optimized
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
read -r _ rs rs_start rs_rss < <("$RS_PYTHON" loop.py rs "$STEPS" "$RUNS")
read -r _ ref ref_start ref_rss < <("$REF_PYTHON" loop.py reference "$STEPS" "$RUNS")
echo "steps per run: $STEPS + answer, runs: $RUNS (median)"
printf '%-22s %14s %22s %14s\n' "" "ms per step" "import + build (ms)" "peak RSS (MB)"
printf '%-22s %14s %22s %14s\n' "deepagents_rs" "$rs" "$rs_start" "$rs_rss"
printf '%-22s %14s %22s %14s\n' "deepagents (0.7.32)" "$ref" "$ref_start" "$ref_rss"
awk -v a="$rs" -v b="$ref" -v c="$rs_start" -v d="$ref_start" -v e="$rs_rss" -v f="$ref_rss" \
  'BEGIN { printf "reference / deepagents_rs: %.1fx per step, %.1fx start-up, %.1fx memory\n", b / a, d / c, f / e }'

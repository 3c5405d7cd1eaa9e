#!/usr/bin/env bash
# Compares the filesystem backend's grep and glob with ripgrep on the same 100,000-file tree.
#
#   bench/search.sh [TREE_DIR]     (default /tmp/deepagents-search-bench)
#
# Installs ripgrep from Debian when missing, generates the tree once (deterministic content;
# reused when present), then runs the `search` bench of deepagents-backends, which times each
# query with our backend and with `rg` in the same process, alternating runs, and prints medians
# and ratios.
set -euo pipefail

TREE="${1:-/tmp/deepagents-search-bench}"
FILES=100000
cd "$(dirname "$0")/.."

if ! command -v rg >/dev/null 2>&1; then
    echo "installing ripgrep..." >&2
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq ripgrep >/dev/null
fi
rg --version | head -1

if [ ! -f "$TREE/.complete-$FILES" ]; then
    echo "generating $FILES files under $TREE..." >&2
    rm -rf "$TREE"
    python3 - "$TREE" "$FILES" <<'PY'
import os, random, sys
root, count = sys.argv[1], int(sys.argv[2])
rng = random.Random(42)  # deterministic content
words = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi "
         "rho sigma tau upsilon phi chi psi omega fn let mut struct impl return match self "
         "import def class async await pub use crate mod trait where").split()
exts = [".rs", ".py", ".md", ".txt", ".js", ".json"]
for i in range(count):
    top, mid = i // 1000, (i // 100) % 10
    d = os.path.join(root, f"pkg{top:03d}", f"mod{mid}")
    if i % 100 == 0:
        os.makedirs(d, exist_ok=True)
    lines = []
    for _ in range(rng.randint(5, 60)):
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 14))))
    if i % 997 == 0:  # ~100 files hold the rare needle
        lines.insert(rng.randrange(len(lines)), "let needle_marker = compute(42);")
    with open(os.path.join(d, f"file{i:06d}{exts[i % len(exts)]}"), "w") as f:
        f.write("\n".join(lines) + "\n")
PY
    touch "$TREE/.complete-$FILES"
fi
echo "tree: $TREE ($(find "$TREE" -type f | wc -l) files, $(du -sh "$TREE" | cut -f1))"

cargo bench -q -p deepagents-backends --bench search -- "$TREE"

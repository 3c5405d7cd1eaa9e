"""Runs the migration programs against the scripted OpenAI mock and prints what passed.

    python run.py [--python PY] [--rewrite] [--timeout S] [--log-dir DIR] [PROGRAM ...]

Each program (default: every ``p*.py`` beside this file) runs as a subprocess of ``PY``
(default: this interpreter) in a fresh temporary directory, with ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY`` pointing at a mock that plays the program's ``MOCK_SCRIPT``. With
``--rewrite`` it runs a copy whose ``from deepagents…``/``import deepagents…`` statements name
``deepagents_rs`` instead, and nothing else is changed. A program passes when it exits 0 and
prints a line starting with ``OK``. Exits 1 when any program failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from mock_openai import MockOpenAI, load_script  # noqa: E402

_IMPORT = re.compile(r"^(\s*)(from|import)(\s+)deepagents(?=[\s.,]|$)", re.MULTILINE)


def rewrite(source: str) -> str:
    """The program with its ``deepagents`` imports naming ``deepagents_rs``."""
    return _IMPORT.sub(r"\1\2\3deepagents_rs", source)


def programs(names: list[str]) -> list[Path]:
    if not names:
        return sorted(HERE.glob("p[0-9][0-9]_*.py"))
    out = []
    for name in names:
        path = Path(name)
        if not path.exists():
            matches = sorted(HERE.glob(f"{name}*.py")) or sorted(HERE.glob(f"{name}"))
            if len(matches) != 1:
                sys.exit(f"no single program matches {name!r}")
            path = matches[0]
        out.append(path.resolve())
    return out


def run_one(program: Path, python: str, rewrite_imports: bool, timeout: float, log_dir: Path | None) -> tuple[bool, str, float]:
    """Runs one program; returns whether it passed, a one-line reason, and the seconds taken."""
    mock = MockOpenAI(load_script(program))
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix=f"migration-{program.stem}-") as work:
            source = program.read_text(encoding="utf-8")
            copy = Path(work) / program.name
            copy.write_text(rewrite(source) if rewrite_imports else source, encoding="utf-8")
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LANGSMITH_", "LANGCHAIN_"))}
            env.update(OPENAI_BASE_URL=mock.url, OPENAI_API_KEY="sk-mock-key", PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
            try:
                done = subprocess.run([python, copy.name], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
                stdout, stderr, code = done.stdout, done.stderr, done.returncode
            except subprocess.TimeoutExpired as error:
                stdout = error.stdout.decode() if isinstance(error.stdout, bytes) else error.stdout or ""
                stderr = error.stderr.decode() if isinstance(error.stderr, bytes) else error.stderr or ""
                code = None
    finally:
        mock.close()
    seconds = time.monotonic() - started
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / f"{program.stem}.stdout").write_text(stdout)
        (log_dir / f"{program.stem}.stderr").write_text(stderr)
        (log_dir / f"{program.stem}.requests.json").write_text(json.dumps(mock.requests, indent=1))
    ok_line = any(line.startswith("OK") for line in stdout.splitlines())
    if code is None:
        return False, f"timed out after {timeout:g} s", seconds
    if code == 0 and ok_line:
        return True, next(line for line in stdout.splitlines() if line.startswith("OK")), seconds
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b|^AssertionError", line)]
    reason = (errors[-1] if errors else lines[-1] if lines else f"exit {code}, no OK line").strip()
    return False, f"exit {code}: {reason}", seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="the interpreter to run the programs with")
    parser.add_argument("--rewrite", action="store_true", help="run copies importing deepagents_rs instead of deepagents")
    parser.add_argument("--timeout", type=float, default=180, help="seconds each program may take")
    parser.add_argument("--log-dir", type=Path, help="write each program's output and the requests its mock saw here")
    parser.add_argument("programs", nargs="*", help="program files or name prefixes (p01, p05_…); default all")
    args = parser.parse_args()
    if os.sep in args.python:
        args.python = os.path.abspath(args.python)  # the programs run in a temporary directory
    results = []
    for program in programs(args.programs):
        ok, reason, seconds = run_one(program, args.python, args.rewrite, args.timeout, args.log_dir)
        results.append((program.stem, ok, reason, seconds))
        print(f"{program.stem:<28} {'ok' if ok else 'FAILED':<7} {seconds:5.1f}s  {reason}", flush=True)
    failed = [name for name, ok, _, _ in results if not ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

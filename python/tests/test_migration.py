"""The migration suite: reference deepagents programs (python/migration/p*.py) run on this
package with only ``deepagents`` renamed ``deepagents_rs`` in their imports, each against the
scripted OpenAI mock, one test per program. With DEEPAGENTS_TEST_REFERENCE_PYTHON (the
reference-venv that scripts/test makes, holding LangChain's deepagents) the same programs run
unchanged on the reference too, which shows they are valid reference programs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MIGRATION = Path(__file__).resolve().parent.parent / "migration"
PROGRAMS = sorted(p.name for p in MIGRATION.glob("p[0-9][0-9]_*.py"))


def run(python: str, program: str, rewrite: bool) -> None:
    command = [sys.executable, str(MIGRATION / "run.py"), "--python", python, "--timeout", "240", program]
    if rewrite:
        command.insert(2, "--rewrite")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{program} failed:\n{done.stdout}{done.stderr}"


def test_the_suite_has_its_ten_programs() -> None:
    assert len(PROGRAMS) == 10, PROGRAMS


@pytest.mark.parametrize("program", PROGRAMS)
def test_a_reference_program_runs_on_deepagents_rs(program: str) -> None:
    run(sys.executable, str(MIGRATION / program), rewrite=True)


@pytest.mark.parametrize("program", PROGRAMS)
def test_the_program_runs_on_the_reference(program: str) -> None:
    reference = os.environ.get("DEEPAGENTS_TEST_REFERENCE_PYTHON")
    if not reference:
        if os.environ.get("CI") == "true":
            pytest.fail("DEEPAGENTS_TEST_REFERENCE_PYTHON is not set: scripts/test makes the reference-venv and exports it")
        pytest.skip("set DEEPAGENTS_TEST_REFERENCE_PYTHON to a Python with deepagents and langchain-openai installed")
    run(reference, str(MIGRATION / program), rewrite=False)

"""The CLI installed without the ``tools`` extra (``pip install .``): a command that needs
one of the extra's libraries says which, and how to install it, in one line, exit 2; never
a traceback. Each run blocks the library in a fresh interpreter, as a venv without it is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "examples" / "scenarios" / "sim_hangup_then_finalize.yaml"
AGENT = ROOT / "examples" / "testing" / "my_agent.py"
# None in sys.modules: an import of that name fails as an absent library's does
WITHOUT = (
    "import sys; sys.modules[sys.argv[1]] = None; "
    "from agent_runtime.tools.cli import main; sys.exit(main(sys.argv[2:]))"
)


@pytest.mark.parametrize(
    ("library", "shown", "argv"),
    [
        ("hypothesis", "hypothesis", ["fuzz", f"{AGENT}:server", "--examples", "1"]),
        ("yaml", "PyYAML", ["simulate", str(SCENARIO)]),
    ],
    ids=["fuzz-hypothesis", "simulate-yaml"],
)
def test_a_command_without_its_extra_names_the_extra_in_one_line(
    library: str, shown: str, argv: list[str], tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT, library, *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
        timeout=120,
    )
    assert (done.returncode, done.stderr) == (
        2,
        f"agent-runtime {argv[0]}: needs {shown}; install the project's tools extra "
        "(from a clone: pip install '.[tools]')\n",
    )

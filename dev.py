#!/usr/bin/env python3
"""The project's two front-door commands, with nothing but Python needed:

    python3 dev.py simulate [ARGS...]   # agent-runtime simulate over the bundled scenarios
    python3 dev.py test [PYTEST ARGS]   # the whole test suite
    python3 dev.py lint                 # ruff, mypy --strict, diagrams --check

Each creates .venv and installs the project with its dev extra when needed (again whenever
pyproject.toml changes).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".installed"


def _python() -> str:
    return str(BIN / "python")


def ensure_env() -> None:
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == want:
        return
    if not (BIN / "python").exists():
        print("creating .venv ...", file=sys.stderr)
        venv.create(VENV, with_pip=True)
    print("installing the project and its dev tools into .venv ...", file=sys.stderr)
    subprocess.check_call([_python(), "-m", "pip", "install", "-q", "--upgrade", "pip"])
    subprocess.check_call([_python(), "-m", "pip", "install", "-q", "-e", f"{ROOT}[dev]"])
    STAMP.write_text(want)


def run(*cmd: str) -> int:
    return subprocess.call(list(cmd), cwd=ROOT)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    what, rest = argv[0], argv[1:]
    ensure_env()
    if what == "simulate":
        return run(str(BIN / "agent-runtime"), "simulate", *rest)
    if what == "test":
        return run(_python(), "-m", "pytest", *rest)
    if what == "lint":
        codes = [
            run(str(BIN / "ruff"), "check", "."),
            run(str(BIN / "ruff"), "format", "--check", "."),
            run(str(BIN / "mypy")),
            run(str(BIN / "agent-runtime"), "diagrams", "--check"),
        ]
        return max(codes)
    if what == "run":  # any command from the venv: python3 dev.py run agent-runtime --help
        return run(str(BIN / rest[0]), *rest[1:])
    print(f"unknown command {what!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

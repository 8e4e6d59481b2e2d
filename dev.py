#!/usr/bin/env python3
"""The project's front-door commands, with nothing but Python needed:

    python3 dev.py simulate [ARGS...]        # agent-runtime simulate over the bundled scenarios
    python3 dev.py test [PYTEST ARGS]        # the test suite's default tier (minutes)
    python3 dev.py test --exhaustive [ARGS]  # the exhaustive tier alone (the long explorations)
    python3 dev.py test --all [ARGS]         # both tiers, as CI runs them
    python3 dev.py lint                      # ruff, mypy --strict, diagrams --check
    python3 dev.py explore [ARGS]            # explore the real job, seeded (--help)
    python3 dev.py mutation [ARGS]           # the behaviour-only mutation score (hours)
    python3 dev.py mutation --system         # ... of the system between the machines
    python3 dev.py golden                    # rewrite tests/tables/*.json after a table change
    python3 dev.py run COMMAND [ARGS...]     # a command of the venv: run agent-runtime --help
    python3 dev.py pythons                   # the supported Python versions, one a line
    python3 dev.py --python 3.13 COMMAND     # any command on that interpreter, in .venv-3.13
    python3 dev.py --python 3.13 find        # its path, or exit 2 when the machine has none

Each creates its venv (.venv for the interpreter running dev.py) and installs the project
with its dev extra when needed (again whenever pyproject.toml changes). `test` with no
test named runs on as many pytest-xdist workers as there are cores. `explore`, `mutation`
and `golden` check the project's own machines: they run from verification/, which the
wheel leaves out.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
if sys.version_info < (3, 11):  # noqa: UP036  (tomllib; the oldest Python supported)
    sys.exit(f"dev.py needs Python 3.11 or newer, not {sys.version.split()[0]}")

import tomllib  # noqa: E402  (after the version check, which names what is missing)

EXHAUSTIVE = "exhaustive"  # the marker of the tier `test` leaves out (pyproject's addopts)
# the project's own verification (verification/, not in the wheel): dev.py's command -> the
# module run from the project's root, where `python -m` finds the folder
VERIFICATION = {
    "explore": "verification.explore",
    "mutation": "verification.mutation",
    "golden": "verification.golden",
}
# the commands that need the venv (`pythons` and `--help` do not)
COMMANDS = ("simulate", "test", "lint", "run", *VERIFICATION)


def supported() -> list[str]:
    """The Python versions pyproject.toml declares with classifiers, oldest first."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = (
        re.fullmatch(r"Programming Language :: Python :: (3\.\d+)", c)
        for c in project["classifiers"]
    )
    return sorted({m[1] for m in found if m}, key=lambda v: int(v.split(".")[1]))


def _version_of(python: str) -> str | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def find_python(version: str) -> str | None:
    """An interpreter of ``version`` (X.Y) on this machine: on PATH, or installed by pyenv
    (whose shims answer only for the versions selected, hence each candidate is asked)."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        return sys.executable
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    pyenv = sorted(
        glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")),
        key=lambda p: [int(x) for x in re.findall(r"\d+", Path(p).parents[1].name)],
        reverse=True,  # the newest patch release first
    )
    for candidate in [shutil.which(f"python{version}"), *pyenv]:
        if candidate and _version_of(candidate) == version:
            return candidate
    return None


class Env:
    def __init__(self, python: str, path: Path) -> None:
        self.base = python
        self.path = path
        self.bin = path / ("Scripts" if os.name == "nt" else "bin")
        self.python = str(self.bin / "python")

    def ensure(self) -> None:
        stamp = self.path / ".installed"
        want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
        if stamp.exists() and stamp.read_text() == want:
            return
        if not Path(self.python).exists():
            print(f"creating {self.path.name} ...", file=sys.stderr)
            if self.base == sys.executable:
                venv.create(self.path, with_pip=True)
            else:
                subprocess.check_call([self.base, "-m", "venv", str(self.path)])
        print(
            f"installing the project and its dev tools into {self.path.name} ...", file=sys.stderr
        )
        subprocess.check_call([self.python, "-m", "pip", "install", "-q", "--upgrade", "pip"])
        subprocess.check_call([self.python, "-m", "pip", "install", "-q", "-e", f"{ROOT}[dev]"])
        stamp.write_text(want)


def run(*cmd: str) -> int:
    return subprocess.call(list(cmd), cwd=ROOT)


def pytest_args(rest: list[str]) -> list[str]:
    """The tier asked for as a marker expression; xdist workers when no test is named."""
    tier: list[str] = []
    if "--exhaustive" in rest:
        tier = ["-m", EXHAUSTIVE]
    elif "--all" in rest:
        tier = ["-m", f"{EXHAUSTIVE} or not {EXHAUSTIVE}"]
    rest = [a for a in rest if a not in ("--exhaustive", "--all")]
    # a test named (a path, a node id): start at once, without workers to spawn
    named = any(not a.startswith("-") and (ROOT / a.split("::")[0]).exists() for a in rest)
    chosen = any(a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist" for a in rest)
    workers = [] if named or chosen else ["-n", str(os.cpu_count() or 1)]
    return [*workers, *tier, *rest]


def main(argv: list[str]) -> int:
    env = Env(sys.executable, ROOT / ".venv")
    if argv[:1] == ["--python"] and len(argv) >= 2:
        version, argv = argv[1], argv[2:]
        python = find_python(version)
        if python is None:
            print(f"Python {version} was not found on this machine (PATH, pyenv)", file=sys.stderr)
            return 2
        if python != sys.executable:  # the interpreter running dev.py keeps .venv
            env = Env(python, ROOT / f".venv-{version}")
        if argv[:1] == ["find"]:  # whether the machine has it, for .ci/run
            print(python)
            return 0
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    what, rest = argv[0], argv[1:]
    if what == "pythons":
        print("\n".join(supported()))
        return 0
    # refused before the venv is made: a typo costs no install
    if what not in COMMANDS:
        print(f"unknown command {what!r} (python3 dev.py --help lists them)", file=sys.stderr)
        return 2
    if what == "lint" and rest:
        # lint takes no arguments: --help says what it runs, anything else is refused
        if rest in (["-h"], ["--help"]):
            print("python3 dev.py lint: ruff check, ruff format --check, mypy --strict and")
            print("agent-runtime diagrams --check, over the whole project (no arguments)")
            return 0
        print(f"dev.py lint takes no arguments (got {' '.join(rest)!r})", file=sys.stderr)
        return 2
    if what == "run" and not rest:
        print(
            "dev.py run: name the command to run, e.g. python3 dev.py run agent-runtime --help",
            file=sys.stderr,
        )
        return 2
    env.ensure()
    if what == "simulate":
        return run(str(env.bin / "agent-runtime"), "simulate", *rest)
    if what == "test":
        return run(env.python, "-m", "pytest", *pytest_args(rest))
    if what in VERIFICATION:
        return run(env.python, "-m", VERIFICATION[what], *rest)
    if what == "lint":
        codes = [
            run(str(env.bin / "ruff"), "check", "."),
            run(str(env.bin / "ruff"), "format", "--check", "."),
            run(str(env.bin / "mypy")),
            run(str(env.bin / "agent-runtime"), "diagrams", "--check"),
        ]
        return max(codes)
    # run: any command from the venv (python3 dev.py run agent-runtime --help)
    tool = shutil.which(rest[0], path=str(env.bin))
    if tool is None:
        print(f"dev.py run: no command {rest[0]!r} in {env.bin}", file=sys.stderr)
        return 2
    try:
        return run(tool, *rest[1:])
    except OSError as e:  # there, but not something the system can run
        print(f"dev.py run: {tool}: cannot run it ({e.strerror or e})", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

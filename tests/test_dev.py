"""dev.py, the front door: the tiers it asks pytest for, the Pythons it reads from
pyproject.toml (which .ci/run tests), and how it finds one."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _dev() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dev", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_supported_pythons_are_the_classifiers_from_the_lower_bound_on() -> None:
    dev = _dev()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    versions = dev.supported()
    assert versions == ["3.11", "3.12", "3.13"]
    # requires-python starts where the tested versions start, with no cap of its own
    assert project["requires-python"] == f">={versions[0]}"
    # and this interpreter is one of them (CI's python3 runs the exhaustive tier)
    assert f"{sys.version_info[0]}.{sys.version_info[1]}" in versions


def test_the_tiers_are_marker_expressions_and_workers_only_for_a_whole_run() -> None:
    dev = _dev()
    assert dev.pytest_args([]) == ["-n", str(os.cpu_count() or 1)]
    assert dev.pytest_args(["--exhaustive"])[-2:] == ["-m", "exhaustive"]
    assert dev.pytest_args(["--all"])[-2:] == ["-m", "exhaustive or not exhaustive"]
    # a test named: one process, started at once; workers chosen by hand: left alone
    assert dev.pytest_args(["tests/test_dev.py", "-q"]) == ["tests/test_dev.py", "-q"]
    assert dev.pytest_args(["tests/test_dev.py::test_x"]) == ["tests/test_dev.py::test_x"]
    assert dev.pytest_args(["-n", "0"]) == ["-n", "0"]
    assert dev.pytest_args(["-k", "explore"])[0] == "-n"


def test_a_plain_run_leaves_the_exhaustive_tier_out() -> None:
    opts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    addopts = opts["ini_options"]["addopts"]
    assert re.search(r"-m 'not exhaustive'", addopts)
    assert any(m.startswith("exhaustive:") for m in opts["ini_options"]["markers"])


def test_this_interpreter_is_found_and_an_absent_one_is_not() -> None:
    dev = _dev()
    assert dev.find_python(f"{sys.version_info[0]}.{sys.version_info[1]}") == sys.executable
    assert dev.find_python("3.99") is None


@pytest.fixture
def dev_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, list[str]]:
    """dev.py with its project at ``tmp_path`` and ``Env.ensure`` recorded, not run: no venv
    is created or installed."""
    dev = _dev()
    monkeypatch.setattr(dev, "ROOT", tmp_path)
    ensured: list[str] = []
    monkeypatch.setattr(dev.Env, "ensure", lambda self: ensured.append(self.path.name))
    return dev, ensured


def test_help_lists_run(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/guide/cli.md sends users to `python3 dev.py run agent-runtime`; the help
    did not name `run`."""
    assert _dev().main(["--help"]) == 0
    assert re.search(
        r"^ +python3 dev\.py run COMMAND \[ARGS\.\.\.\] +# ", capsys.readouterr().out, re.M
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run"], "dev.py run: name the command to run, e.g. python3 dev.py run agent-runtime"),
        (["frobnicate"], "unknown command 'frobnicate'"),
        (["lint", "--fix"], "dev.py lint takes no arguments (got '--fix')"),
    ],
    ids=["run-without-a-command", "unknown-command", "lint-with-an-argument"],
)
def test_a_missing_or_unknown_command_is_refused_before_the_venv_is_made(
    dev_in: tuple[ModuleType, list[str]],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    """`python3 dev.py run` was an IndexError traceback (after making the venv)."""
    dev, ensured = dev_in
    assert dev.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(message)  # one line, no usage text after it
    assert ensured == []


def test_lint_help_says_what_it_runs_and_runs_nothing(
    dev_in: tuple[ModuleType, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """`python3 dev.py lint --help` used to run the whole lint."""
    dev, ensured = dev_in
    assert dev.main(["lint", "--help"]) == 0
    out = capsys.readouterr().out
    assert "ruff" in out and "mypy --strict" in out and "diagrams --check" in out
    assert ensured == []


def test_run_of_a_command_the_venv_lacks_is_one_line(
    dev_in: tuple[ModuleType, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python3 dev.py run nosuchtool` was a FileNotFoundError traceback."""
    dev, ensured = dev_in
    assert dev.main(["run", "nosuchtool", "--help"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"dev.py run: no command 'nosuchtool' in {tmp_path / '.venv' / 'bin'}"
    ]
    assert ensured == [".venv"]


def test_run_runs_a_command_of_the_venv_with_its_arguments_and_exit_code(
    dev_in: tuple[ModuleType, list[str]], tmp_path: Path
) -> None:
    dev, _ = dev_in
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    tool = bin_dir / "tool"
    tool.write_text('#!/bin/sh\necho "$@" > args.txt\nexit 3\n')
    tool.chmod(0o755)
    assert dev.main(["run", "tool", "a", "b c"]) == 3
    assert (tmp_path / "args.txt").read_text() == "a b c\n"  # run in the project's root


@pytest.mark.parametrize(
    ("command", "module"),
    [
        ("explore", "verification.explore"),
        ("mutation", "verification.mutation"),
    ],
)
def test_the_project_s_own_checks_run_from_verification_in_the_venv(
    dev_in: tuple[ModuleType, list[str]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    command: str,
    module: str,
) -> None:
    """`explore` and `mutation` left the wheel's CLI: dev.py runs their
    module with the venv's Python from the project's root (where verification/ is), with
    the arguments as given; the help lists them."""
    dev, ensured = dev_in
    ran: list[tuple[str, ...]] = []
    monkeypatch.setattr(dev, "run", lambda *cmd: ran.append(cmd) or 0)
    assert dev.main([command, "--json", "--depth", "2"]) == 0
    python = str(tmp_path / ".venv" / "bin" / "python")
    assert ran == [(python, "-m", module, "--json", "--depth", "2")]
    assert ensured == [".venv"]
    assert (ROOT / Path(*module.split(".")) / "__main__.py").is_file()
    assert re.search(rf"^ +python3 dev\.py {command} \[ARGS\] +# ", dev.__doc__, re.M)

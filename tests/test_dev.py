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

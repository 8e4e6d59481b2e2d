"""``python3 dev.py explore`` (``verification.explore.command``): the real job explored
from the command line, its report, its JSON form and its exit status."""

from __future__ import annotations

import json

import pytest

from verification.explore.command import main


def test_explore_prints_what_it_covered_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--depth", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("real job [example], all inputs, bfs depth 1: ")
    assert "states no run went through:" in out
    assert out.rstrip().endswith("every invariant holds")


def test_explore_json_has_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", "plain", "--seed", "3", "--walks", "2", "--steps", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["violations"] == []
    assert data["config"] == "plain" and data["mode"] == "2 walks of 4 inputs from seed 3"
    assert data["states"] > 1 and data["depth"] == 4


@pytest.mark.parametrize("flag", ["--depth", "--walks", "--steps"])
def test_explore_refuses_a_negative_number(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([flag, "-1"]) == 2
    assert f"dev.py explore: {flag} must be >= 0" in capsys.readouterr().err


def test_explore_refuses_an_unknown_config(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--config", "everything"])
    assert exit_.value.code == 2
    assert "invalid choice: 'everything'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["explore", "conformance"])
def test_the_installed_cli_does_not_have_the_project_s_own_checks(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """They are the project's own: `python3 dev.py explore` runs from verification/, which
    the wheel leaves out (CHANGELOG)."""
    from agent_runtime.tools.cli import main as agent_runtime

    with pytest.raises(SystemExit) as exit_:
        agent_runtime([command])
    assert exit_.value.code == 2
    assert f"invalid choice: '{command}'" in capsys.readouterr().err

"""``python3 dev.py explore`` (``verification.explore.command``): the report, its JSON form
and its exit status."""

from __future__ import annotations

import json

import pytest

from verification.explore.command import main


def test_explore_prints_what_it_covered_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--depth", "2", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("explored ")
    assert "distinct states and" in out and "event sequences (up to depth 2" in out
    assert "[simulation, grace_period > 0, present: simulator] job inputs, depth 2:" in out
    assert out.rstrip().endswith("every invariant holds")


def test_explore_json_has_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--depth", "1", "--workers", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["violations"] == []
    assert data["states"] == sum(e["states"] for e in data["explorations"])
    assert {(e["inputs"], e["depth"]) for e in data["explorations"]} == {
        ("job", 1),
        ("avatar", 1),
    }


@pytest.mark.parametrize("flag", ["--depth", "--workers"])
def test_explore_refuses_a_negative_number(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([flag, "-1"]) == 2
    assert f"dev.py explore: {flag} must be >= " in capsys.readouterr().err


@pytest.mark.parametrize(
    ("configs", "shown"),
    [
        ("playout", "playout"),  # the playout machine composed
        ("lifecycle", "aclose"),  # the user's closes among the inputs
    ],
)
def test_explore_runs_the_configs_asked_for(
    configs: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--configs", configs, "--depth", "1", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "inputs, depth 1:" in line]
    assert lines and all(shown in line for line in lines), out
    assert out.rstrip().endswith("every invariant holds")


def test_explore_refuses_an_unknown_config_set(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--configs", "everything"])
    assert exit_.value.code == 2
    assert "invalid choice: 'everything'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["explore", "conformance"])
def test_the_installed_cli_no_longer_has_the_project_s_own_checks(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """They moved to `python3 dev.py explore|conformance` with verification/, which the
    wheel leaves out (CHANGELOG)."""
    from agent_runtime.tools.cli import main as agent_runtime

    with pytest.raises(SystemExit) as exit_:
        agent_runtime([command])
    assert exit_.value.code == 2
    assert f"invalid choice: '{command}'" in capsys.readouterr().err

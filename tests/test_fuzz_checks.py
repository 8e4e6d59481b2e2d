"""What cannot be a fuzz check is refused as the check's mistake, never run as one: a
class (calling it makes an instance, which passes whatever the agent did), an ``async``
function (called, never awaited: it passed too), a builtin that cannot take the outcome
(``time.time``: it failed every run, reported as the agent's bug), an object whose
``__call__`` takes the wrong arguments. ``agent-runtime fuzz --check``: one line, exit 2;
``fuzz()``/``replay()``: ``BadCheck`` (a ``TypeError``), nothing written.

Real: livekit's fake ``JobContext``, ``AgentSession``, ``AgentServer``, the runtime,
hypothesis. Faked, because they need a server: the room and the session transport.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_runtime.testing.fuzz import BadCheck, FuzzOptions, fuzz, replay
from agent_runtime.tools.cli import main
from tests.support import planted

ROOT = Path(__file__).resolve().parents[1]
SEED = 1


class VerdictClass:
    """A --check given as a class: its "call" makes an instance (always truthy)."""

    def __init__(self, outcome: Any) -> None:
        self.ok = outcome.job is None  # never False as a check: an instance is returned


async def async_check(outcome: Any) -> bool:
    """A --check written async: called, it returns a coroutine nobody awaits."""
    return False


class AsyncCall:
    """An object whose ``__call__`` is async (``inspect`` does not call it a coroutine
    function): found by its first call."""

    async def __call__(self, outcome: Any) -> bool:
        return False


class WrongArity:
    def __call__(self, outcome: Any, extra: Any) -> bool:
        return True


async_call = AsyncCall()
wrong_arity = WrongArity()


@pytest.mark.parametrize(
    ("check", "message"),
    [
        ("tests.test_fuzz_checks:VerdictClass", "VerdictClass is a class: calling it with"),
        ("builtins:bool", "bool is a class: calling it with the outcome makes an instance"),
        # a builtin: refused at its first call where its signature cannot be read (3.11:
        # "time.time() takes no arguments"), before any run where it can (3.13: "time()
        # cannot be called with the outcome"); either way one line naming it, exit 2
        ("time:time", "time()"),
        ("builtins:len", "check len cannot check the outcome: object of type 'FuzzOutcome'"),
        ("tests.test_fuzz_checks:async_check", "async_check is async: a check is called, "),
        ("tests.test_fuzz_checks:async_call", "returned coroutine: a check is called, never "),
        ("tests.test_fuzz_checks:wrong_arity", "WrongArity (outcome, extra) cannot be called"),
    ],
)
def test_the_cli_refuses_what_cannot_be_a_check_in_one_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    check: str,
    message: str,
) -> None:
    monkeypatch.chdir(ROOT)
    out_dir = tmp_path / "found"
    fuzzing = ["fuzz", "examples/agent.py:server", "--examples", "5", "--seed", str(SEED)]
    code = main([*fuzzing, "--out", str(out_dir), "--check", check])
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), out + err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"agent-runtime fuzz: --check {check!r}: "), err
    assert message in err, err
    assert not out_dir.exists()


@pytest.mark.parametrize(
    ("check", "message"),
    [
        (VerdictClass, r"VerdictClass is a class"),
        (time.time, r"time\(\)"),  # at its first call, or before any run (see above)
        (async_check, r"async_check is async"),
        (async_call, r"returned coroutine"),
        (wrong_arity, r"not WrongArity \(outcome, extra\)"),
    ],
)
def test_the_python_api_refuses_what_cannot_be_a_check(
    tmp_path: Path, check: Any, message: str
) -> None:
    server = planted.no_hook_server(False)
    with pytest.raises(BadCheck, match=message) as caught:
        fuzz(server, FuzzOptions(examples=5, seed=SEED), checks=[check], out=tmp_path)
    assert caught.value.check is check
    assert list(tmp_path.iterdir()) == []

    scenario = tmp_path / "plain.yaml"
    scenario.write_text(
        yaml.safe_dump(
            {
                "name": "the user comes and goes",
                "participants": [{"identity": "user"}],
                "steps": [{"at": 0, "event": "session.start"}, {"at": 30, "event": "end"}],
            }
        ),
        encoding="utf-8",
    )
    with pytest.raises(BadCheck, match=message):
        replay(server, scenario, checks=[check])

"""``agent-runtime fuzz`` and ``fuzz_entrypoint``: user-style agents with planted
order-dependent bugs (``tests/support/planted.py``) are found with the default settings, the
shrunk failure is written as a scenario that ``--replay`` fails on, and the same agents
written correctly fuzz clean.

Real: livekit's fake ``JobContext``, ``AgentSession``, ``AgentServer``, the runtime,
hypothesis. Faked, because they need a server: the room (``InMemoryRoom``) and the session
transport's byte stream.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import signal
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_runtime import PlayoutOptions
from agent_runtime.testing.fuzz import FuzzOptions, FuzzOutcome, fuzz, replay
from agent_runtime.testing.result import seconds_text
from agent_runtime.testing.scenario import load_scenario
from agent_runtime.tools.cli import main
from tests.support import lingering, planted

ROOT = Path(__file__).resolve().parents[1]
PLANTED = "tests/support/planted.py"
SEED = 1  # any seed finds them; one is fixed so a failure here is reproducible


def two_arguments(outcome: Any, extra: Any) -> bool:
    """A --check that cannot be called with the outcome alone."""
    return True


def misspelt(outcome: Any) -> bool:
    """A --check that reads what the outcome does not have, in every run."""
    return bool(outcome.jobb.lifecycle == "closed")


def misspelt_later(outcome: Any) -> bool:
    """A --check that reads what the outcome does not have only in a run with a request
    (not the plain run before the drawing)."""
    if any(step["event"] == "session_request" for step in outcome.steps):
        return outcome.request is not None
    return True


def _fuzz_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["fuzz", *args])
    out, err = capsys.readouterr()
    return code, out, err


# -- usage errors: one line, exit 2, before anything runs -------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--examples", "0"], "--examples: Input should be greater than or equal to 1"),
        (["--examples", "100001"], "--examples: Input should be less than or equal to 100000"),
        (["--examples", "ten"], "--examples: 'ten' is not a whole number"),
        (["--seed", "-1"], "--seed: Input should be greater than or equal to 0"),
        (["--steps", "101"], "--steps: Input should be less than or equal to 100"),
        (["--out", "pyproject.toml"], "--out pyproject.toml: not a directory\n"),
        (
            ["--out", "pyproject.toml/found"],
            "--out pyproject.toml/found: not a directory (pyproject.toml is a file)",
        ),
        (["--out", "/proc/found"], "--out /proc/found: cannot write there ("),
        (["--replay", "nope.yaml"], "nope.yaml: cannot read"),
        (["--check", "tests.support.planted:nope"], "has no 'nope'"),
        (["--check", "nocolon"], "give MODULE:NAME"),
        # a check is called with the outcome: one that cannot take it failed every run,
        # reported as a property the agent broke, after the drawing and the shrinking
        (
            ["--check", "tests.support.planted:short_hold_server"],
            "--check 'tests.support.planted:short_hold_server': function short_hold_server() "
            "cannot be called with the outcome (a function of one argument, the FuzzOutcome)",
        ),
        (["--check", "tests.test_fuzz:two_arguments"], "two_arguments(outcome, extra) cannot"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    args: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(ROOT)
    code, out, err = _fuzz_cli(capsys, "examples/agent.py:server", *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("where", ["the-directory", "a-parent"])
@pytest.mark.parametrize("to", ["gone", "found"], ids=["to-nothing", "to-itself"])
def test_an_out_link_to_nothing_is_the_line_export_gives_and_nothing_is_made(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    where: str,
    to: str,
) -> None:
    """``--out`` a link that leads nowhere was ``cannot write there (FileExistsError: File
    exists)``: it is refused as ``export --out`` refuses it. A link to itself was said to
    lead to a link ``which is not there``, itself."""
    monkeypatch.chdir(ROOT)
    link = tmp_path / "found"
    link.symlink_to(tmp_path / to)
    out = link if where == "the-directory" else link / "sub"
    code, _, err = _fuzz_cli(capsys, "examples/agent.py:server", "--out", str(out))
    assert main(["export", "xstate", "avatar", "--out", str(out)]) == 2
    export_err = capsys.readouterr().err
    why = "a link to " if to == "gone" else "Too many levels of symbolic links"
    assert code == 2 and why in err, err
    assert err.removeprefix("agent-runtime fuzz: --out ") == export_err.removeprefix(
        "agent-runtime export: "
    )
    assert [p.name for p in tmp_path.iterdir()] == ["found"]


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        ("nope.py:server", "nope.py: no such file"),
        # it is there, a link to itself: "no such file" sent the developer looking for a typo
        ("{tmp}/lp.py:server", "{tmp}/lp.py: Too many levels of symbolic links"),
        ("examples/:server", "examples/: a directory; name the agent's .py file in it"),
        # it is there: "no such file" sent the developer looking for a typo
        ("/dev/null:server", "/dev/null: a character device, not a regular file"),
        # a folder with no __init__.py imports, empty: "examples has no 'server'" said nothing
        ("examples:server", "examples: a folder that is not a package (no __init__.py)"),
        # an installed namespace package (protobuf's, which livekit needs) is a module
        ("google:server", "agent 'google:server': google has no 'server'\n"),
        ("examples/agent.py:INSTRUCTIONS", "not an AgentServer with an rtc_session entrypoint"),
        ("examples/agent.py:missing", "has no 'missing'"),
        ("server", "give MODULE:NAME"),
        # not "cannot import examples/agent.py:server" nor "has no 'ser ver'"
        ("examples/agent.py:server:extra", "give MODULE:NAME (a module or .py file, one colon"),
        ("examples/agent.py:ser ver", "give MODULE:NAME"),
        ("a" * 300 + ":x:y", "give MODULE:NAME"),  # a name too long for the system
    ],
)
def test_an_agent_that_cannot_be_fuzzed_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    agent: str,
    message: str,
) -> None:
    monkeypatch.chdir(ROOT)
    (tmp_path / "lp.py").symlink_to(tmp_path / "lp.py")
    agent, message = agent.replace("{tmp}", str(tmp_path)), message.replace("{tmp}", str(tmp_path))
    code, _, err = _fuzz_cli(capsys, agent)
    assert code == 2 and err.count("\n") == 1 and message in err, err


NOT_ENTRYPOINTS = """
from livekit.agents import AgentServer

def plain():
    pass

async def no_context():
    pass

async def two(ctx, more):
    pass

server = AgentServer()

@server.rtc_session()
def no_ctx_entry():
    pass
"""


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "plain",
            "not an AgentServer, nor an entrypoint function (a function taking "
            "the JobContext): plain() does not take the JobContext as its argument",
        ),
        ("no_context", "no_context() does not take the JobContext as its argument"),
        ("two", "two(ctx, more) does not take the JobContext as its argument"),
        (
            "server",
            "its rtc_session entrypoint is no entrypoint function (a function "
            "taking the JobContext): no_ctx_entry() does not take the JobContext",
        ),
    ],
)
def test_a_function_that_is_no_entrypoint_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, message: str
) -> None:
    """A sync function of no arguments was run, and its TypeError reported as a bug found in
    the agent (exit 1)."""
    agent = tmp_path / "not_entrypoints_agent.py"
    agent.write_text(NOT_ENTRYPOINTS)
    code, out, err = _fuzz_cli(capsys, f"{agent}:{name}", "--examples", "1")
    assert code == 2 and out == ""
    assert err.startswith(f"agent-runtime fuzz: agent '{agent}:{name}': "), err
    assert err.count("\n") == 1 and message in err, err


WRAPPED_ENTRYPOINTS = """
import functools

from livekit.agents import Agent, AgentServer, AgentSession, JobContext

from agent_runtime import AgentJob


def traced(fn):  # a sync decorator, as tracing helpers are: it returns fn's coroutine
    @functools.wraps(fn)
    def wrapper(ctx):
        return fn(ctx)

    return wrapper


async def main(ctx: JobContext) -> None:
    await AgentJob.from_job_context(ctx, session=AgentSession()).start(Agent(instructions="hi"))


server = AgentServer()
server.rtc_session()(traced(main))
lam = lambda ctx: main(ctx)  # noqa: E731
"""


@pytest.mark.parametrize("name", ["server", "lam"])
def test_an_entrypoint_livekit_awaits_through_a_plain_function_is_fuzzed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    """livekit awaits what the entrypoint returns: a sync decorator around the async one,
    or a lambda, is an entrypoint (the fuzzer refused them as no async function)."""
    agent = tmp_path / "wrapped_agent.py"
    agent.write_text(WRAPPED_ENTRYPOINTS)
    code, _, err = _fuzz_cli(capsys, f"{agent}:{name}", "--examples", "1")
    assert code == 0, err


def test_out_is_created_before_the_run_and_a_failed_write_still_prints_the_report(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(ROOT)
    out = tmp_path / "new" / "found"

    def unwritable(*_: Any) -> Path:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("agent_runtime.testing.fuzz.run.write_scenario", unwritable)
    code, stdout, _ = _fuzz_cli(
        capsys, f"{PLANTED}:BUGGY_LEAKY_TASK", "--seed", "7", "--out", str(out)
    )
    assert out.is_dir() and list(out.iterdir()) == []  # made and probed, before the run
    assert code == 1 and "seed 7: a property failed" in stdout
    assert "the shortest sequence found:" in stdout and "released: tasks still running" in stdout
    assert f"  not written: {out}: PermissionError: Permission denied" in stdout


REPLAY_STEPS = [{"at": 0, "event": "session.start"}, {"at": 3, "event": "end"}]


@pytest.mark.parametrize(
    ("doc", "options", "message"),
    [
        (
            {"steps": [*REPLAY_STEPS[:1], {"at": 1, "event": "avatar.close"}, REPLAY_STEPS[1]]},
            [],
            "steps the fuzzer does not take (t=1 avatar.close: agent-runtime simulate runs them)",
        ),
        (
            {"steps": [{"at": 1, "event": "session.close", "reason": "user_initiated"}]},
            [],
            "t=1 session.close: agent-runtime simulate runs them); no session.start step",
        ),
        ({"steps": REPLAY_STEPS[1:]}, [], "no session.start step (the entrypoint would never run)"),
        (
            {"config": {"grace_period": 3}, "steps": REPLAY_STEPS},
            [],
            "config grace_period (the entrypoint's own AgentJob options",
        ),
        ({"steps": REPLAY_STEPS}, ["--seed", "1"], "--seed: no meaning with --replay"),
        (
            {"steps": REPLAY_STEPS},
            ["--examples", "3", "--no-avatar", "--no-simulation"],
            "--examples, --no-avatar, --no-simulation: no meaning with --replay",
        ),
        (
            {"steps": [REPLAY_STEPS[0], {"at": 1.0e300, "event": "end"}]},
            [],
            "step 2 (end): field at: Input should be less than or equal to 604800",
        ),
    ],
    ids=[
        "avatar-close",
        "session-close",
        "no-start",
        "own-config",
        "seed",
        "drawing-options",
        "past-a-week",
    ],
)
def test_a_replay_the_fuzzer_cannot_perform_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    doc: dict[str, Any],
    options: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(ROOT)
    path = tmp_path / "by-hand.yaml"
    path.write_text(yaml.safe_dump({"name": "by hand", **doc}))
    code, out, err = _fuzz_cli(
        capsys, f"{PLANTED}:FIXED_LEAKY_TASK", "--replay", str(path), *options
    )
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_a_replay_says_which_steps_the_room_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(ROOT)
    path = tmp_path / "ghost.yaml"
    leave = {"at": 1, "event": "participant_disconnected", "identity": "ghost"}
    path.write_text(yaml.safe_dump({"name": "ghost", "steps": [REPLAY_STEPS[0], leave]}))
    code, out, _ = _fuzz_cli(capsys, f"{PLANTED}:FIXED_LEAKY_TASK", "--replay", str(path))
    assert code == 0 and "nothing found" in out
    assert "step refused (it changed nothing): t=1 participant_disconnected: " in out
    assert "'ghost' is not in the room" in out


def test_a_simulator_back_after_its_leaving_ended_the_job_is_owed_no_verdict(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The simulator leaves (livekit ends a simulation then, with no hold: the job closes at
    once), comes back and asks for the verdict, which the job that left cannot answer. The
    fuzzer took that for "finalize_simulation got no reply" (a random seed of a CLI test
    found it): the hold is owed only when the simulator was there as the end began."""
    monkeypatch.chdir(ROOT)
    sim = {"identity": "simulator", "attributes": {"lk.simulator": "true"}}
    steps = [
        {"at": 0, "event": "session.start"},
        {"at": 0, "event": "participant_disconnected", "identity": "simulator"},
        {"at": 0, "event": "participant_connected", **sim},
        {"at": 0, "event": "session_request", "caller": "simulator",
         "request": "finalize_simulation", "payload": {"provisional_success": True}},
        {"at": 0, "event": "end"},
    ]  # fmt: skip
    path = tmp_path / "back.yaml"
    doc = {"name": "back", "config": {"simulation": True}, "participants": [sim], "steps": steps}
    path.write_text(yaml.safe_dump(doc))
    code, out, _ = _fuzz_cli(capsys, f"{PLANTED}:FIXED_LEAKY_TASK", "--replay", str(path))
    assert code == 0 and "nothing found" in out, out
    assert "t=0 session_request: RuntimeError: session transport is closed" in out


# -- planted bugs ------------------------------------------------------------------------------


def test_a_failure_is_printed_with_its_seed_written_and_replayed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(ROOT)
    code, out, _ = _fuzz_cli(
        capsys, f"{PLANTED}:BUGGY_LEAKY_TASK", "--seed", "7", "--out", str(tmp_path)
    )
    assert code == 1, out
    assert "seed 7: a property failed" in out and "example(s) run" in out
    assert "released: tasks still running after the job ended: " in out
    # the agent loaded from its file, a module of the package tests/support
    written = tmp_path / "fuzz-support.planted.entrypoint-7.yaml"
    assert f"written to {written}" in out
    assert [s.event for s in load_scenario(written).steps] == ["session.start", "end"]
    code, out, _ = _fuzz_cli(capsys, f"{PLANTED}:BUGGY_LEAKY_TASK", "--replay", str(written))
    assert code == 1 and "released: tasks still running" in out
    code, out, _ = _fuzz_cli(capsys, f"{PLANTED}:FIXED_LEAKY_TASK", "--replay", str(written))
    assert code == 0 and "nothing found" in out


TWO_AGENTS = """
import asyncio

from livekit.agents import Agent, AgentServer, AgentSession, JobContext

from agent_runtime import AgentJob, on_session_end

server = AgentServer(session_end_timeout=315)


@server.rtc_session(on_session_end=on_session_end)
async def NAME(ctx: JobContext) -> None:
    job = AgentJob.from_job_context(ctx, session=AgentSession())

    async def heartbeat() -> None:
        await asyncio.sleep(3600)

    asyncio.create_task(heartbeat())  # never stopped: the fuzzer finds it at once
    await job.start(Agent(instructions="NAME"))
"""


def test_two_agents_fuzzed_with_one_seed_into_one_folder_keep_both_failures(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Both were written to ``found/fuzz-7.yaml``: the second agent's failure silently
    replaced the first's. Each file is named by its agent, and says which it is."""
    found = tmp_path / "found"
    written = {}
    for name in ("sales", "support"):
        (tmp_path / f"{name}.py").write_text(TWO_AGENTS.replace("NAME", name))
        code, out, _ = _fuzz_cli(
            capsys, f"{tmp_path / name}.py:server", "--seed", "7", "--out", str(found)
        )
        assert code == 1, out
        written[name] = found / f"fuzz-{name}.{name}-7.yaml"
        assert f"written to {written[name]} (replay: --replay {written[name]})" in out
    assert sorted(found.glob("*.yaml")) == [written["sales"], written["support"]]
    for name, path in written.items():
        description = load_scenario(path).description
        assert f"found by agent-runtime fuzz of {name}.{name} (seed 7)" in description
        assert f"{name}.<locals>.heartbeat" in description


async def _entry_with_options(ctx: Any, options: dict[str, Any]) -> None:
    """An entrypoint a server is given bound to its options, ``functools.partial``."""


def test_an_entrypoint_given_as_a_partial_names_the_file_by_its_function() -> None:
    """Every agent given as a ``functools.partial`` was ``fuzz-functools.partial-SEED.yaml``
    (its file and description named functools, not the agent)."""
    import functools

    from agent_runtime.testing.entrypoint import agent_label

    bound = functools.partial(_entry_with_options, options={"lang": "fr"})
    assert agent_label(bound) == f"{__name__}._entry_with_options"
    assert agent_label(functools.partial(bound)) == f"{__name__}._entry_with_options"


def test_a_file_already_at_the_fuzzers_name_is_never_replaced(tmp_path: Path) -> None:
    """Two agents of one name (the planted ones are all ``planted.entrypoint``), or a
    file of the user's at that name: the new failure goes beside it, the report says so;
    the same failure found again is the same file, not a copy."""
    first = tmp_path / f"fuzz-tests.support.planted.entrypoint-{SEED}.yaml"
    first.write_text("# the user's notes\n")
    report = fuzz(planted.leaky_task_server(True), FuzzOptions(seed=SEED), out=tmp_path)
    beside = tmp_path / f"fuzz-tests.support.planted.entrypoint-{SEED}-2.yaml"
    assert first.read_text() == "# the user's notes\n"
    assert report.written == str(beside) and report.kept == str(first)
    assert f"  {first} was there already, another file: left as it was" in (
        report.summary().splitlines()
    )
    again = fuzz(planted.leaky_task_server(True), FuzzOptions(seed=SEED), out=tmp_path)
    assert again.written == str(beside) and again.kept == str(first)
    assert sorted(tmp_path.iterdir()) == sorted([first, beside])


@pytest.mark.exhaustive
def test_on_session_end_that_expects_the_simulator_is_found_shrunk_written_and_replayed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(ROOT)
    code, out, _ = _fuzz_cli(
        capsys, f"{PLANTED}:BUGGY_SIMULATOR_LOOKUP", "--seed", str(SEED), "--out", str(tmp_path)
    )
    assert code == 1, out
    assert f"seed {SEED}: a property failed" in out
    assert "user code: the agent's on_session_end raised IndexError" in out
    assert "planted.py" in out  # the agent's own traceback
    written = sorted(tmp_path.glob("*.yaml"))
    assert len(written) == 1 and f"written to {written[0]}" in out
    scenario = load_scenario(written[0])
    events = [(s.event, getattr(s, "identity", None)) for s in scenario.steps]
    # shrunk to what matters: the simulator leaves before the session ends
    assert ("participant_disconnected", "simulator") in events and len(events) <= 4
    # the agent given by its file: named by the file's module, in its package
    assert "fuzz of support.planted.entrypoint (seed 1)" in scenario.description

    code, out, _ = _fuzz_cli(
        capsys, f"{PLANTED}:BUGGY_SIMULATOR_LOOKUP", "--replay", str(written[0])
    )
    assert code == 1 and "on_session_end raised IndexError" in out
    code, out, _ = _fuzz_cli(
        capsys, f"{PLANTED}:FIXED_SIMULATOR_LOOKUP", "--replay", str(written[0])
    )
    assert code == 0 and "nothing found" in out


@pytest.mark.exhaustive
@pytest.mark.parametrize(
    ("make", "found"),
    [
        (planted.simulator_lookup_server, "on_session_end raised IndexError"),
        (
            planted.rejoin_greeting_server,
            "event handler raised RuntimeError: AgentSession isn't running",
        ),
        (planted.avatar_mute_server, "audible: t="),
        (planted.leaky_task_server, "released: tasks still running after the job ended: "),
        (planted.no_hook_server, "verdict: the simulator's finalize_simulation (RQ_1) got no"),
        (planted.hung_callback_server, "<locals>.flush_metrics had not returned"),
    ],
    ids=[
        "simulator-lookup",
        "rejoin-greeting",
        "avatar-mute",
        "leaky-task",
        "no-hook",
        "hung-callback",
    ],
)
def test_each_planted_bug_is_found_with_the_defaults_and_the_fixed_agent_fuzzes_clean(
    tmp_path: Path, make: Any, found: str
) -> None:
    report = fuzz(make(True), FuzzOptions(seed=SEED), out=tmp_path)
    assert not report.ok and found in report.problems[0]
    assert report.written is not None
    assert not replay(make(True), Path(report.written)).ok
    assert replay(make(False), Path(report.written)).ok
    assert fuzz(make(False), FuzzOptions(seed=SEED)).ok


def test_an_entrypoint_that_waits_for_its_participant_fuzzes_clean(tmp_path: Path) -> None:
    """``await ctx.wait_for_participant()`` before the job is built: runs where the user
    joins later build and start the job then; runs where the room goes first end the wait
    as livekit does. Neither is the agent's fault (both were flagged: "EntrypointStalled",
    then the wait's own error)."""
    late_user = {
        "name": "the user joins a second after the job starts",
        "config": {"simulation": False},
        "steps": [
            {"at": 0, "event": "session.start"},
            {"at": 1, "event": "participant_connected", "identity": "user"},
            {"at": 2, "event": "end"},
        ],
    }
    path = tmp_path / "late_user.yaml"
    path.write_text(yaml.safe_dump(late_user), encoding="utf-8")
    outcome: list[FuzzOutcome] = []
    report = replay(
        planted.waits_for_participant_server(),
        path,
        checks=[lambda o: outcome.append(o) or True],
    )
    assert report.ok, report.problems
    assert outcome and outcome[0].job is not None  # built once the user came
    linked = [t for t in outcome[0].transitions if t["machine"] == "participant"]
    assert [t["dest"] for t in linked][:1] == ["linked"]
    # 25 runs draw both (either fault, planted back, is found in 10); 200 found no more
    no_sim = FuzzOptions(seed=3, examples=25, simulation=False)
    report = fuzz(planted.waits_for_participant_server(), no_sim)
    assert report.ok, report.problems
    # what the entrypoint raises once its wait is over is its own (not the room's end)
    report = replay(planted.waits_for_participant_server(buggy=True), path)
    assert report.problems[:1] == ["user code: the agent's entrypoint raised KeyError: 'language'"]


# a simulation run with the user and the simulator in the room from the start
_WITH_SIMULATOR: dict[str, Any] = {
    "config": {"simulation": True},
    "participants": [
        {"identity": "user"},
        {"identity": "simulator", "attributes": {"lk.simulator": "true"}},
    ],
}


def _finalize(at: float, caller: str) -> dict[str, Any]:
    return {
        "at": at,
        "event": "session_request",
        "caller": caller,
        "request": "finalize_simulation",
        "payload": {"provisional_success": True},
    }


@pytest.mark.parametrize("stranger_first", [False, True])
def test_a_server_without_on_session_end_is_found_to_drop_the_verdict(
    tmp_path: Path, stranger_first: bool
) -> None:
    """The agent hangs up, then the simulator asks for its verdict: the job of a server
    given ``on_session_end`` holds and answers; one without it has left the room, and the
    request goes unanswered (it was passed as "changed nothing")."""
    hang_up_then_ask = {
        "name": "the agent hangs up, then the simulator asks for the verdict",
        **_WITH_SIMULATOR,
        "steps": [
            {"at": 0, "event": "session.start"},
            # a stranger's finalize, refused, is not the simulator's verdict
            *([_finalize(0.5, "stranger")] if stranger_first else []),
            {"at": 1, "event": "ctx.shutdown"},
            _finalize(5, "simulator"),
            {"at": 400, "event": "end"},
        ],
    }
    path = tmp_path / "hang_up_then_ask.yaml"
    path.write_text(yaml.safe_dump(hang_up_then_ask), encoding="utf-8")
    report = replay(planted.no_hook_server(True), path)
    rq = "RQ_2" if stranger_first else "RQ_1"
    # the cause is named, with what to do: a newcomer has no traceback to go on here
    assert report.problems == [
        f"verdict: the simulator's finalize_simulation ({rq}) got no reply: the job never "
        "held for it, as agent_runtime's on_session_end did not run and livekit's shutdown "
        "disconnected the room at once (give the server's rtc_session "
        "on_session_end=on_session_end, or await on_session_end(ctx) in your own)"
    ]
    assert replay(planted.no_hook_server(False), path).ok
    # a hook of the agent's own that does not await the runtime's loses it the same way
    own = replay(planted.no_hook_server(True, own_hook=True), path)
    assert own.problems == report.problems


def test_a_verdict_held_up_by_the_agents_own_on_simulation_end_is_not_blamed_on_the_hook(
    tmp_path: Path,
) -> None:
    """The simulator asks while the job serves and the agent's ``on_simulation_end`` never
    returns: the report blamed a missing ``on_session_end`` (the server had it) and a room
    livekit disconnected (it was still connected), sending the newcomer to the wrong fix."""
    ask_while_serving = {
        "name": "the simulator asks for the verdict while the agent serves",
        **_WITH_SIMULATOR,
        "steps": [
            {"at": 0, "event": "session.start"},
            _finalize(1, "simulator"),
            {"at": 2, "event": "end"},
        ],
    }
    path = tmp_path / "ask_while_serving.yaml"
    path.write_text(yaml.safe_dump(ask_while_serving), encoding="utf-8")
    report = replay(planted.hung_verdict_server(), path)
    assert len(report.problems) == 1, report.problems
    assert report.problems[0].startswith(
        "verdict: the simulator's finalize_simulation (RQ_1) got no reply: the agent's "
        "on_simulation_end had not returned at t="
    ), report.problems
    # a job never started gets no word on the hook either: it is named as the cause
    unstarted = replay(lingering.UNSTARTED, path)
    assert unstarted.problems == [
        "started: the entrypoint's AgentJob was never started (job.start)",
        "verdict: the simulator's finalize_simulation (RQ_1) got no reply",
    ]


def test_an_on_reprompt_that_raises_is_found_as_the_agents_code(tmp_path: Path) -> None:
    """The watchdog re-prompts the silent user after the agent spoke, and the agent's
    ``on_reprompt`` raises: it passed ("nothing found"), the failure a WARNING without its
    traceback, while a raising ``on_simulation_end`` was found."""
    silent_after_a_reply = {
        "name": "the user is silent after the agent's reply",
        "participants": [{"identity": "user"}],
        "steps": [
            {"at": 0, "event": "session.start"},
            {"at": 0, "event": "agent.say", "duration": 0.5},
            {"at": 5, "event": "end"},
        ],
    }
    path = tmp_path / "silent_after_a_reply.yaml"
    path.write_text(yaml.safe_dump(silent_after_a_reply), encoding="utf-8")
    report = replay(planted.failing_reprompt_server(), path)
    where = r"user code: the agent's code in failing_reprompt_server\.<locals>\.reprompt "
    # each re-prompt the watchdog made (two by default), each raised
    assert len(report.problems) == 2, report.problems
    for attempt, problem in enumerate(report.problems, 1):
        assert re.fullmatch(where + rf"\(planted\.py:\d+\) raised KeyError: {attempt}", problem)
    # the run's log says when, as its steps do (it read t=3.49999999999955)
    first = 0.5 + PlayoutOptions().safety_window + 2  # the reply, the window, the silence
    assert [line.split(" ", 1)[0] for line in report.logs] == [
        f"t={seconds_text(first)}",
        f"t={seconds_text(first + PlayoutOptions().safety_window + 2)}",
    ]


def test_no_verdict_is_owed_past_the_jobs_own_hold(tmp_path: Path) -> None:
    """The user drops: after its 10 s grace the job holds 30 s for the verdict (11 to 41)
    and ends the hold itself; a later ``ctx.shutdown()`` does not start a new window, so
    a finalize at 45 is owed nothing (it was flagged)."""
    scenario = {
        "name": "the job's own hold ends before the hang-up's window would",
        **_WITH_SIMULATOR,
        "steps": [
            {"at": 0, "event": "session.start"},
            {
                "at": 1,
                "event": "participant_disconnected",
                "identity": "user",
                "reason": "UNKNOWN_REASON",
            },
            {"at": 30, "event": "ctx.shutdown"},
            _finalize(45, "simulator"),
            {"at": 46, "event": "end"},
        ],
    }
    path = tmp_path / "short_hold.yaml"
    path.write_text(yaml.safe_dump(scenario), encoding="utf-8")
    report = replay(planted.short_hold_server(), path)
    assert report.ok, report.problems


def test_a_check_that_is_not_callable_is_refused_before_any_run(tmp_path: Path) -> None:
    server = planted.waits_for_participant_server()
    with pytest.raises(TypeError, match="a check must be callable as check\\(outcome\\)"):
        fuzz(server, FuzzOptions(seed=SEED, examples=5), checks=["notcallable"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="a check must be callable"):
        replay(server, tmp_path / "never-read.yaml", checks=[3])  # type: ignore[list-item]
    # one that cannot take the outcome failed every run, reported as the agent's bug (the
    # CLI refused it; fuzz_entrypoint and fuzz() ran it)
    with pytest.raises(TypeError, match=r"not function two_arguments\(outcome, extra\)$"):
        fuzz(server, FuzzOptions(seed=SEED, examples=5), checks=[two_arguments])
    with pytest.raises(TypeError, match=r"not function two_arguments\(outcome, extra\)$"):
        replay(server, tmp_path / "never-read.yaml", checks=[two_arguments])


def test_fuzz_takes_out_as_a_str_and_refuses_arguments_of_the_wrong_kind_before_any_run(
    tmp_path: Path,
) -> None:
    """``out="found"`` (a str, as a newcomer writes it) ended a whole run that had found
    its failure in ``AttributeError: 'str' object has no attribute 'mkdir'``, the report
    lost; options given as a dict or a single check not in a list were attribute and
    iteration errors from inside the fuzzer."""
    out = tmp_path / "found"
    report = fuzz(planted.leaky_task_server(True), FuzzOptions(seed=SEED), out=str(out))
    assert not report.ok and report.written == str(
        out / f"fuzz-tests.support.planted.entrypoint-{SEED}.yaml"
    )
    assert replay(planted.leaky_task_server(True), report.written).problems == report.problems

    server = planted.waits_for_participant_server()
    refused = [
        (lambda: fuzz(server, {"examples": 5}), "options must be a FuzzOptions"),  # type: ignore[arg-type]
        (lambda: fuzz(server, out=3), "out must be a path (a str or a Path), not int"),  # type: ignore[arg-type]
        (
            lambda: fuzz(server, checks=two_arguments),  # type: ignore[arg-type]
            "checks must be a list of functions (checks=[my_check]), not function two_arguments",
        ),
        (lambda: fuzz(server, progress=1), "progress must be callable"),  # type: ignore[arg-type]
        (lambda: replay(server, None), "path must be a path (a str or a Path), not NoneType"),  # type: ignore[arg-type]
    ]
    for call, message in refused:
        with pytest.raises(TypeError) as info:
            call()
        assert message in str(info.value)


def test_fuzz_refuses_an_out_that_is_a_file_before_any_run(tmp_path: Path) -> None:
    """``out`` naming a file: every example ran, then the failure found was not written
    ("not written: ... FileExistsError"); it is refused before the first run now, the
    file as it was."""
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    ran: list[str] = []
    with pytest.raises(ValueError, match="exists and is not a directory"):
        fuzz(
            planted.leaky_task_server(True),
            FuzzOptions(seed=SEED),
            out=taken,
            progress=ran.append,
        )
    assert ran == [] and taken.read_text() == "mine"


def test_a_failure_livekit_caught_in_the_agents_code_names_the_function_and_line(
    tmp_path: Path,
) -> None:
    """A tool, ``on_exit`` or a node livekit called and caught the failure of was reported
    as "the agent's code raised ValueError: ...": which code, the traceback alone said."""
    path = tmp_path / "start_end.yaml"
    path.write_text(yaml.safe_dump({"name": "start, end", "steps": REPLAY_STEPS}))
    report = replay(planted.on_exit_server(), path)
    line = inspect.getsourcelines(planted.SummaryAgent.on_exit)[1] + 1
    assert report.problems == [
        f"user code: the agent's code in SummaryAgent.on_exit (planted.py:{line}) raised "
        "ValueError: could not save the summary"
    ]


def test_an_entrypoints_traceback_starts_at_the_agents_frame_not_the_kits(
    tmp_path: Path,
) -> None:
    """It began with the harness's and the runner's frames (``harness.py ... _start``,
    ``entrypoint.py ... __call__``), the kit looking like what failed."""
    path = tmp_path / "start_end.yaml"
    path.write_text(yaml.safe_dump({"name": "start, end", "steps": REPLAY_STEPS}))
    report = replay(planted.raises_before_its_job_server(), path)
    assert report.problems == ["user code: the agent's entrypoint raised KeyError: 'voice'"]
    (detail,) = report.details
    frames = [line for line in detail.splitlines() if line.startswith('  File "')]
    assert len(frames) == 1 and "planted.py" in frames[0] and "in entrypoint" in frames[0]
    # a check of the user's that raises: its own frame first too (properties.py came first)
    checked = replay(planted.simulator_lookup_server(False), path, checks=[_no_job_end])
    assert checked.problems == ["check _no_job_end: AssertionError: the job ended"]
    (detail,) = checked.details
    frames = [line for line in detail.splitlines() if line.startswith('  File "')]
    assert len(frames) == 1 and "test_fuzz.py" in frames[0] and "_no_job_end" in frames[0]


def _no_job_end(outcome: FuzzOutcome) -> None:
    if outcome.shutdown_reason is not None:
        raise AssertionError("the job ended")


def test_a_text_only_agent_is_not_found_inaudible() -> None:
    """``RoomOptions(audio_output=False)``, as a chat agent starts its session: every run
    failed at once with "audible: t=0: the agent's audio goes nowhere"."""
    report = fuzz(planted.text_only_server(), FuzzOptions(seed=SEED, examples=40))
    assert report.ok, report.problems


def test_an_on_exit_that_never_returns_is_named_and_each_run_takes_no_real_seconds(
    tmp_path: Path,
) -> None:
    """The session's close waits on the agent's ``on_exit`` until livekit's 60 s bound.
    It was reported as livekit's own tasks and listeners left running ("released: ...
    VADStream._metrics_monitor_task, ..."), the agent's code unnamed, and each run waited
    the harness's 10 real seconds for the close at every step."""
    path = tmp_path / "shutdown.yaml"
    steps = [REPLAY_STEPS[0], {"at": 1, "event": "ctx.shutdown"}, {"at": 100, "event": "end"}]
    path.write_text(yaml.safe_dump({"name": "shut down", "steps": steps}))
    began = time.monotonic()
    report = replay(planted.hung_on_exit_server(), path)
    assert time.monotonic() - began < 5.0
    line = inspect.getsourcelines(planted.ForeverExit.on_exit)[1] + 1
    assert report.problems == [
        f"user code: the agent's session close waited on ForeverExit.on_exit (planted.py:{line}), "
        "which had not returned at livekit's bound on the session's close (60s): deployed, "
        'livekit logs "AgentSession.aclose() timed out" and the job ends that much later'
    ]


def test_a_task_the_agent_leaves_running_is_found_though_its_on_exit_hangs(
    tmp_path: Path,
) -> None:
    """A close the agent's ``on_exit`` held leaves livekit's session half closed, its tasks
    not counted; the agent's own task left running was not counted either."""
    path = tmp_path / "shutdown.yaml"
    steps = [REPLAY_STEPS[0], {"at": 1, "event": "ctx.shutdown"}, {"at": 100, "event": "end"}]
    path.write_text(yaml.safe_dump({"name": "shut down", "steps": steps}))
    report = replay(planted.hung_on_exit_server(leak=True), path)
    assert len(report.problems) == 2, report.problems
    assert report.problems[0].startswith(
        "user code: the agent's session close waited on ForeverExit.on_exit (planted.py:"
    )
    assert "heartbeat" not in report.problems[0]
    assert report.problems[1].startswith(
        "released: tasks still running after the job ended: "
        "hung_on_exit_server.<locals>.entrypoint.<locals>.heartbeat (agent code) ("
    )


def test_a_task_the_agent_leaves_running_is_found_and_shrunk_to_the_start(tmp_path: Path) -> None:
    report = fuzz(planted.leaky_task_server(True), FuzzOptions(seed=SEED), out=tmp_path)
    assert report.problems == [
        "released: tasks still running after the job ended: "
        "leaky_task_server.<locals>.entrypoint.<locals>.heartbeat (agent code) (livekit's job "
        "process cancels them only as it exits, so deployed they run on after the call: "
        "cancel the agent's own at the job's end, in a shutdown callback say)"
    ]
    assert report.scenario is not None
    assert [s["event"] for s in report.scenario["steps"]] == ["session.start", "end"]


def test_a_shutdown_callback_that_never_returns_is_named_as_the_agents(tmp_path: Path) -> None:
    # it was reported as the kit's own frames (JobProcess._run, _as_coroutine) still running
    # and the kit's room listener left
    report = fuzz(planted.hung_callback_server(True), FuzzOptions(seed=SEED), out=tmp_path)
    assert report.problems == [
        "user code: the agent's shutdown callback "
        "hung_callback_server.<locals>.entrypoint.<locals>.flush_metrics had not returned "
        "when livekit's worker kills the job's process (the server's "
        "shutdown_process_timeout, 10s): one that never returns, or takes longer, is cut there"
    ]
    assert report.scenario is not None
    assert [s["event"] for s in report.scenario["steps"]] == ["session.start", "end"]
    assert report.written is not None
    assert replay(planted.hung_callback_server(False), Path(report.written)).ok


def test_the_rejoin_bug_needs_its_steps_in_order() -> None:
    """The participant comes back while the session is over: found. The same steps with the
    return before the hang-up: nothing."""
    steps = [
        {"at": 0, "event": "session.start"},
        {
            "at": 0,
            "event": "participant_disconnected",
            "identity": "user",
            "reason": "SIGNAL_CLOSE",
        },
        {"at": 1, "event": "ctx.shutdown"},
        {"at": 2, "event": "participant_connected", "identity": "user"},
    ]
    reordered = [steps[0], steps[1], {**steps[3], "at": 1}, {**steps[2], "at": 2}]
    for sequence, fails in ((steps, True), (reordered, False)):
        doc = {
            "name": "rejoin",
            "config": {"simulation": True},
            "participants": [
                {"identity": "simulator", "attributes": {"lk.simulator": "true"}},
                {"identity": "user"},
            ],
            "steps": sequence,
        }
        path = Path(__import__("tempfile").mkdtemp()) / "rejoin.yaml"
        path.write_text(yaml.safe_dump(doc))
        assert replay(planted.rejoin_greeting_server(True), path).ok is not fails
        assert replay(planted.rejoin_greeting_server(False), path).ok


# -- the user's own properties -----------------------------------------------------------------


def verdict_reaches_simulator(outcome: FuzzOutcome) -> None:
    """A user property: every finalize the simulator sent got a reply (the kit checks that
    too; here as the user would write it)."""
    for request in outcome.requests:
        if request.caller == "simulator" and request.while_open:
            assert request.replies, f"{request.request_id} got no reply"


async def _no_context() -> None:
    """An entrypoint that takes no JobContext."""


@pytest.mark.parametrize(
    ("agent", "error", "message"),
    [
        (
            _no_context,
            TypeError,
            "the entrypoint must be a function taking the JobContext: _no_context() -> 'None' "
            "does not take the JobContext as its argument",
        ),
        (None, TypeError, "give an AgentServer or an entrypoint function, not NoneType"),
        ("agent.py:server", TypeError, "give an AgentServer or an entrypoint function, not str"),
    ],
)
def test_the_fixture_refuses_what_is_no_agent_before_any_run(
    fuzz_entrypoint: Any, tmp_path: Path, agent: Any, error: type[Exception], message: str
) -> None:
    # as the CLI does (exit 2, one line); the fixture fuzzed them, each run failing as "the
    # agent's entrypoint raised TypeError", and wrote a scenario file of it
    with pytest.raises(error) as e:
        fuzz_entrypoint(agent, examples=5, seed=SEED, out=tmp_path)
    assert str(e.value) == message
    with pytest.raises(error):
        replay(agent, tmp_path / "never-read.yaml")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"examples": 0}, "fuzz_entrypoint(examples=...): Input should be greater than or "),
        ({"seed": 1.5}, "fuzz_entrypoint(seed=...): Input should be a valid integer"),
        ({"sedd": 1}, "fuzz_entrypoint(sedd=...): Extra inputs are not permitted"),
    ],
)
def test_the_fixture_refuses_a_bad_option_in_one_line(
    fuzz_entrypoint: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as e:
        fuzz_entrypoint(planted.waits_for_participant_server(), **options)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_ctrl_c_landing_in_a_garbage_collectors_callback_still_stops_the_fuzz() -> None:
    """Python's own handler raised ``KeyboardInterrupt`` where the signal landed: in a
    weakref callback it was printed and dropped, and the fuzz went on (a trial's Ctrl-C:
    ten more minutes, 1.1 GB, killed by its pid). The fuzz takes it at its next step."""
    runs: list[int] = []

    def ctrl_c_in_a_finalizer(outcome: FuzzOutcome) -> bool:
        runs.append(1)
        if len(runs) == 1:
            held = FuzzOptions()  # any object the collector may take
            weakref.finalize(held, signal.raise_signal, signal.SIGINT)
            del held
        return True

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        fuzz(
            planted.waits_for_participant_server(),
            FuzzOptions(seed=SEED, examples=20),
            checks=[ctrl_c_in_a_finalizer],
        )
    assert runs == [1]  # no run after it
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back


def never_more_than_one_minute(outcome: FuzzOutcome) -> bool:
    """A property this agent breaks: some runs take longer than a minute."""
    return outcome.clock.now() <= 60


def test_the_fuzz_fixture_takes_user_properties_and_fails_the_test(
    fuzz_entrypoint: Any,
) -> None:
    report = fuzz_entrypoint(
        planted.simulator_lookup_server(False), verdict_reaches_simulator, examples=20, seed=SEED
    )
    assert report.ok and report.examples >= 20
    with pytest.raises(
        pytest.fail.Exception, match="check never_more_than_one_minute: returned False"
    ):
        fuzz_entrypoint(
            planted.simulator_lookup_server(False),
            never_more_than_one_minute,
            examples=50,
            seed=SEED,
        )


def test_a_found_failures_traceback_is_the_agents_alone(tmp_path: Path) -> None:
    """Run on the caller's thread, every failure was told "during handling" of the
    fuzzer's own RuntimeError ("no running event loop"), which came first."""
    # seed 3 finds it as every seed does, and shrinks it in seconds (SEED's shrink took a
    # minute): the traceback's shape is what this test reads
    report = fuzz(planted.simulator_lookup_server(True), FuzzOptions(seed=3), out=tmp_path)
    (detail,) = [d for d in report.details if "IndexError" in d]
    assert "During handling of the above exception" not in detail
    assert "no running event loop" not in detail


async def test_the_fuzz_fixture_runs_from_an_async_test_too(fuzz_entrypoint: Any) -> None:
    report = fuzz_entrypoint(planted.simulator_lookup_server(False), examples=5, seed=SEED)
    assert report.ok


def test_the_cli_takes_checks_and_says_what_it_ran(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    code, out, err = _fuzz_cli(
        capsys,
        f"{PLANTED}:FIXED_SIMULATOR_LOOKUP",
        "--examples",
        "10",
        "--seed",
        "3",
        "--check",
        "tests.test_fuzz:verdict_reaches_simulator",
    )
    assert code == 0, out + err
    assert "example(s) run" in out and "distinct path(s)" in out and "seed 3" in out


def test_with_nothing_found_the_examples_run_are_the_examples_asked(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--examples 50 --seed 3` said "55 example(s) run": the 5 runs hypothesis cut short
    (an overrun) and drew again were counted, and checked."""
    monkeypatch.chdir(ROOT)
    code, out, _ = _fuzz_cli(capsys, "examples/agent.py:server", "--examples", "50", "--seed", "3")
    assert code == 0 and out.startswith("50 example(s) run, ")
    assert out.rstrip().endswith("seed 3: nothing found")


def test_progress_says_when_the_runs_are_shrinking_past_the_examples_asked() -> None:
    # once a run failed, hypothesis shrinks it, and --examples does not bound those runs:
    # the progress line said "27 runs (of 3 to draw)"
    lines: list[str] = []
    options = FuzzOptions(seed=SEED, examples=3, progress_every=1e-9)  # a line per run
    report = fuzz(planted.leaky_task_server(True), options, progress=lines.append)
    assert report.examples > 3 and not report.ok
    runs = lines[1:]  # after the seed's line
    assert runs and all(line.startswith("fuzz: found a problem, shrinking it: ") for line in runs)
    assert runs[-1].startswith(f"fuzz: found a problem, shrinking it: {report.examples} runs")


@pytest.mark.virtual_time
async def test_a_run_cut_short_during_a_held_close_is_closed_without_waiting_for_the_hold() -> None:
    # hypothesis cuts a run short (an overrun) wherever it is: here a graceful aclose()
    # holding for the simulator's verdict, on a clock only the run moves. Closing the run
    # waited for that aclose() first, so the fuzzer hung for good while it shrank a failure
    from livekit.agents.types import ATTRIBUTE_SIMULATOR

    from agent_runtime.testing import scenario as sc
    from agent_runtime.testing.fuzz.harness import SIMULATOR, Harness
    from tests.support import lingering

    h = Harness(lingering.waits_forever_server(), sc.Config(simulation=True))
    await h.open(
        (
            sc.Participant(identity="user"),
            sc.Participant(identity=SIMULATOR, attributes={ATTRIBUTE_SIMULATOR: "true"}),
        )
    )
    await h.step(sc.SessionStart(at=0, event="session.start"))
    await h.step(sc.JobAclose(at=1, event="job.aclose"))
    assert h.job is not None and h.job.states["job"] == "awaiting_finalize"
    await asyncio.wait_for(h.close(), 60)  # the loop's seconds: virtual, so a hang fails
    assert h.job.lifecycle == "closed" and all(c.done() for c in h.closes)


def test_a_fuzz_run_leaves_no_native_thread_behind() -> None:
    """Each example's job context was kept for the life of the process once its job closed
    (a WeakKeyDictionary whose value held its key), and with it the room's native audio
    source: four livekit threads per example, so a long run slowed down as it went (300
    examples left 1,200 threads). Counted after a collection, as the process sees them."""
    import gc
    import os

    def threads() -> int:
        return len(os.listdir("/proc/self/task"))

    gc.collect()
    before = threads()
    report = fuzz(planted.simulator_lookup_server(False), FuzzOptions(seed=SEED, examples=20))
    assert report.ok and report.examples >= 20
    gc.collect()
    assert threads() - before < 20, f"{threads() - before} threads more after 20 examples"


HOOKED_AGENT = """
from livekit.agents import Agent, AgentServer, AgentSession, JobContext

from agent_runtime import AgentJob, on_session_end

server = AgentServer(session_end_timeout=315)


@server.rtc_session(on_session_end=on_session_end)
async def entrypoint(ctx: JobContext) -> None:
    await AgentJob.from_job_context(ctx, session=AgentSession()).start(Agent(instructions="hi"))
"""


@pytest.mark.parametrize("name", ["server", "entrypoint"])
def test_an_entrypoint_named_by_its_function_runs_with_its_servers_hooks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    """``agent-runtime fuzz my_agent.py:entrypoint`` (the CLI takes the entrypoint
    function) ran it without the server's ``on_session_end``: the agent, whose server has
    it, was reported to drop the simulator's verdict and told to add what it has."""
    agent = tmp_path / "hooked_agent.py"
    agent.write_text(HOOKED_AGENT, encoding="utf-8")
    scenario = {
        "name": "the agent hangs up, then the simulator asks for the verdict",
        **_WITH_SIMULATOR,
        "steps": [
            {"at": 0, "event": "session.start"},
            {"at": 1, "event": "ctx.shutdown"},
            _finalize(5, "simulator"),
            {"at": 400, "event": "end"},
        ],
    }
    path = tmp_path / "hang_up_then_ask.yaml"
    path.write_text(yaml.safe_dump(scenario), encoding="utf-8")
    code, out, err = _fuzz_cli(capsys, f"{agent}:{name}", "--replay", str(path))
    assert code == 0, out + err


def test_an_entrypoint_found_beside_a_global_that_refuses_attribute_reads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Finding the server of ``my_agent.py:entrypoint`` reads the module's globals; one
    that raises on any attribute read (a web framework's proxy used outside its request)
    made the command end in that error's traceback. It is no server: the entrypoint's own
    is found beside it and the run goes on."""
    touchy = "class _Proxy:\n    def __getattr__(self, name):\n"
    touchy += '        raise RuntimeError("working outside of an application context")\n\n'
    touchy += "current_app = _Proxy()\n"
    agent = tmp_path / "proxied_agent.py"
    agent.write_text(HOOKED_AGENT + "\n" + touchy, encoding="utf-8")
    scenario = {
        "name": "the agent hangs up, then the simulator asks for the verdict",
        **_WITH_SIMULATOR,
        "steps": [
            {"at": 0, "event": "session.start"},
            {"at": 1, "event": "ctx.shutdown"},
            _finalize(5, "simulator"),
            {"at": 400, "event": "end"},
        ],
    }
    path = tmp_path / "hang_up_then_ask.yaml"
    path.write_text(yaml.safe_dump(scenario), encoding="utf-8")
    code, out, err = _fuzz_cli(capsys, f"{agent}:entrypoint", "--replay", str(path))
    assert code == 0, out + err


COUNTED_AGENT = HOOKED_AGENT.replace(
    "from agent_runtime import AgentJob, on_session_end\n",
    "from agent_runtime import AgentJob, on_session_end as runtime_hook\n\n"
    "ENDS = []\n\n\nasync def on_session_end(ctx):\n"
    "    ENDS.append(ctx.job.id)\n    await runtime_hook(ctx)\n",
)


def test_the_python_api_runs_an_entrypoint_function_with_its_servers_hooks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fuzz(entrypoint)`` and ``replay(entrypoint, ...)`` (the Python API given the
    function an ``AgentServer`` registered, as ``agent-runtime fuzz my_agent.py:entrypoint``
    is) ran it with no server hooks: the agent's ``on_session_end`` never ran and the
    simulator's verdict was reported dropped. They find the server as the CLI does."""
    (tmp_path / "counted_agent.py").write_text(COUNTED_AGENT, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    import counted_agent  # type: ignore[import-not-found]

    try:
        _replay_and_fuzz_counted(counted_agent, tmp_path)
    finally:
        sys.modules.pop("counted_agent", None)


def _replay_and_fuzz_counted(counted_agent: Any, tmp_path: Path) -> None:
    scenario = {
        "name": "the agent hangs up, then the simulator asks for the verdict",
        **_WITH_SIMULATOR,
        "steps": [
            {"at": 0, "event": "session.start"},
            {"at": 1, "event": "ctx.shutdown"},
            _finalize(5, "simulator"),
            {"at": 400, "event": "end"},
        ],
    }
    path = tmp_path / "hang_up_then_ask.yaml"
    path.write_text(yaml.safe_dump(scenario), encoding="utf-8")
    report = replay(counted_agent.entrypoint, path)
    assert report.ok, report.summary()
    assert counted_agent.ENDS == ["fuzz-job"]

    report = fuzz(counted_agent.entrypoint, FuzzOptions(examples=5, seed=SEED))
    assert report.ok, report.summary()
    assert len(counted_agent.ENDS) > 1  # the preflight's run and the drawn ones


@pytest.mark.parametrize(
    ("check", "message"),
    [
        (
            "misspelt",
            "check misspelt reads outcome.jobb, which a FuzzOutcome does not have (did you "
            "mean job?); it has steps, job, ctx, room, clock, requests, shutdown_reason, ",
        ),
        ("misspelt_later", "reads outcome.request, which a FuzzOutcome does not have (did you"),
    ],
)
def test_a_check_that_reads_what_the_outcome_has_not_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    check: str,
    message: str,
) -> None:
    """``--check`` of a function reading ``outcome.jobb`` (a misspelt name) failed every
    run as a property the agent broke: exit 1, the "shortest sequence" shrunk and written
    to ``--out``, the traceback of the user's check. It is the check's mistake: one line,
    exit 2, the ``--out`` directory the command made removed again."""
    monkeypatch.chdir(ROOT)
    out_dir = tmp_path / "found" / "here"
    code, out, err = _fuzz_cli(
        capsys,
        "examples/agent.py:server",
        "--examples",
        "50",
        "--seed",
        str(SEED),
        "--out",
        str(out_dir),
        "--check",
        f"tests.test_fuzz:{check}",
    )
    assert (code, out) == (2, ""), out + err
    last = err.splitlines()[-1]
    assert last.startswith(f"agent-runtime fuzz: --check 'tests.test_fuzz:{check}': "), err
    assert message in last, err
    assert "Traceback" not in err
    assert not (tmp_path / "found").exists()


def test_the_python_api_refuses_a_check_that_reads_what_the_outcome_has_not(
    tmp_path: Path,
) -> None:
    """``fuzz(server, checks=[misspelt])`` reported the agent as failing; it raises
    ``BadCheck`` (a ``TypeError``) and writes nothing."""
    from agent_runtime.testing.fuzz import BadCheck

    with pytest.raises(BadCheck, match=r"reads outcome\.jobb, .*did you mean job\?") as caught:
        fuzz(
            planted.no_hook_server(False),
            FuzzOptions(examples=5, seed=SEED),
            checks=[misspelt],
            out=tmp_path,
        )
    assert isinstance(caught.value, TypeError) and caught.value.check is misspelt
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("agent", "check"),
    [
        ("examples/agent.py:missing", "tests.test_fuzz:misspelt"),
        ("examples/agent.py:server", "tests.support.planted:nope"),
    ],
)
def test_a_usage_error_leaves_no_out_directory_behind(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    agent: str,
    check: str,
) -> None:
    """``--out found/`` was made (and probed) first: a bad agent or ``--check`` found
    after it was exit 2 and one line, and left the directory made behind. A usage error
    changes nothing; a directory that was there already stays."""
    monkeypatch.chdir(ROOT)
    there = tmp_path / "there"
    there.mkdir()
    code, _, err = _fuzz_cli(
        capsys, agent, "--out", str(there / "new" / "deeper"), "--check", check
    )
    assert code == 2 and err.count("\n") == 1, err
    assert list(there.iterdir()) == []


def _hung_verdict_server() -> Any:
    """The README's agent, whose ``on_simulation_end`` never returns."""
    from livekit.agents import Agent, AgentServer, AgentSession, JobContext

    from agent_runtime import AgentJob, on_session_end

    server = AgentServer(session_end_timeout=315)

    async def never(_: Any) -> None:
        await asyncio.Event().wait()

    @server.rtc_session(on_session_end=on_session_end, on_simulation_end=never)
    async def entrypoint(ctx: JobContext) -> None:
        await AgentJob.from_job_context(ctx, session=AgentSession()).start(Agent(instructions="hi"))

    return server


@pytest.mark.parametrize("asks", [False, True])
def test_a_passing_run_keeps_the_jobs_verdict_warning_to_itself_unless_asked_to_print(
    caplog: pytest.LogCaptureFixture, tmp_path: Path, asks: bool
) -> None:
    # the job's warning that its hold ended without the verdict: the run's simulator never
    # asks (the hold runs out), or asks and the agent's on_simulation_end never returns.
    # A passing run prints neither (the fuzzer's properties judged the run); logs=True
    # prints both, as they come
    steps: list[dict[str, Any]] = [
        {"at": 0, "event": "session.start"},
        {"at": 1, "event": "ctx.shutdown"},
    ]
    if asks:
        steps.append(_finalize(5, "simulator"))
    scenario = {
        "name": "the agent hangs up",
        **_WITH_SIMULATOR,
        "steps": [*steps, {"at": 400, "event": "end"}],
    }
    path = tmp_path / "hang_up.yaml"
    path.write_text(yaml.safe_dump(scenario), encoding="utf-8")
    caplog.set_level(logging.WARNING, logger="agent_runtime")
    lost = "without the simulator's verdict"
    report = replay(_hung_verdict_server(), path)
    assert report.ok, report.summary()
    assert lost not in caplog.text
    report = replay(_hung_verdict_server(), path, logs=True)
    assert report.ok, report.summary()
    why = [
        r.getMessage().split("verdict: ", 1)[1] for r in caplog.records if lost in r.getMessage()
    ]
    assert len(why) == 1, caplog.text
    assert ("on_simulation_end had not returned" in why[0]) == asks, why


def test_an_entrypoint_two_servers_registered_with_the_same_hooks_runs_with_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One entrypoint registered on two ``AgentServer``s of its module (a dev and a prod
    server, say), both given the same ``on_session_end``: ``replay(entrypoint, ...)`` ran it
    with no hooks at all, the verdict was reported dropped and the user told to give the
    server the ``on_session_end`` both have. Whichever server runs it, its hooks are those."""
    two_servers = COUNTED_AGENT + (
        "\n\nother = AgentServer(session_end_timeout=315)\n"
        "other.rtc_session(on_session_end=on_session_end)(entrypoint)\n"
    )
    (tmp_path / "twice_served_agent.py").write_text(two_servers, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    import twice_served_agent  # type: ignore[import-not-found]

    try:
        assert twice_served_agent.other is not twice_served_agent.server
        scenario = {
            "name": "the agent hangs up, then the simulator asks for the verdict",
            **_WITH_SIMULATOR,
            "steps": [
                {"at": 0, "event": "session.start"},
                {"at": 1, "event": "ctx.shutdown"},
                _finalize(5, "simulator"),
                {"at": 400, "event": "end"},
            ],
        }
        path = tmp_path / "hang_up_then_ask.yaml"
        path.write_text(yaml.safe_dump(scenario), encoding="utf-8")
        report = replay(twice_served_agent.entrypoint, path)
        assert report.ok, report.summary()
        assert twice_served_agent.ENDS == ["fuzz-job"]
    finally:
        sys.modules.pop("twice_served_agent", None)


def test_an_entrypoint_servers_registered_with_different_hooks_is_refused_naming_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One entrypoint registered on two ``AgentServer``s of its module with different
    ``on_session_end`` hooks: it ran with none, and the user was told to give the server the
    hook both servers have. Which server's hooks apply is the user's to say: the Python API
    refuses it with a ``TypeError`` naming the servers, the CLI in one line (exit 2), before
    any run, and a server given explicitly still runs."""
    two_servers = COUNTED_AGENT + (
        "\n\nasync def other_end(ctx):\n    pass\n\n"
        "other = AgentServer(session_end_timeout=315)\n"
        "other.rtc_session(on_session_end=other_end)(entrypoint)\n"
    )
    (tmp_path / "differently_served_agent.py").write_text(two_servers, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    import differently_served_agent as mod  # type: ignore[import-not-found]

    try:
        with pytest.raises(TypeError, match=r"different hooks or timeouts \(server, other\)"):
            fuzz(mod.entrypoint, FuzzOptions(examples=1, seed=1))
        assert mod.ENDS == []  # nothing ran
        code, _, err = _fuzz_cli(capsys, "differently_served_agent:entrypoint", "--examples", "1")
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "(server, other): pass the server to run it with" in err, err
        assert fuzz(mod.server, FuzzOptions(examples=2, seed=1)).ok
    finally:
        sys.modules.pop("differently_served_agent", None)

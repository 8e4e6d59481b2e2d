"""Fuzzing an agent's entrypoint: hypothesis runs the state machine (``machine.py``) for a
number of examples from a seed, shrinks what fails, and the failure becomes a scenario file
that ``replay`` runs again against the same entrypoint."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Flaky
from hypothesis.stateful import get_state_machine_test
from livekit.agents.types import ATTRIBUTE_SIMULATOR
from pydantic import BaseModel, ConfigDict, Field

from agent_runtime.parts import described, takes
from agent_runtime.testing import scenario as sc
from agent_runtime.testing.clock import run as on_virtual_time
from agent_runtime.testing.entrypoint import agent_label, check_agent, served
from agent_runtime.testing.fuzz.harness import (
    AVATAR,
    CONFIG,
    SIMULATOR,
    TAKES,
    Declined,
    Failed,
    Harness,
)
from agent_runtime.testing.fuzz.machine import (
    CheckStopped,
    FuzzFailure,
    Stats,
    finish,
    make_machine,
    scenario_of,
)
from agent_runtime.testing.fuzz.progress import Progress, print_progress
from agent_runtime.testing.fuzz.properties import BadCheck, Check, Problem, not_a_check
from agent_runtime.testing.fuzz.report import FuzzReport, fill_report, write_scenario
from agent_runtime.testing.result import seconds_text
from agent_runtime.testing.sdk_logs import quiet_sdk_logs
from agent_runtime.testing.user_code import PLUGIN_THREAD, PrewarmFailed

# the report and the progress lines have modules of their own; their names stay here too,
# where users import them
__all__ = [
    "MAX_EXAMPLES",
    "MAX_SEED",
    "FuzzOptions",
    "FuzzReport",
    "NotReplayable",
    "PluginOffMainThread",
    "check_replayable",
    "config_of",
    "fuzz",
    "print_progress",
    "replay",
    "write_scenario",
]

MAX_EXAMPLES = 100_000
MAX_SEED = 2**32 - 1


class NotReplayable(ValueError):
    """A scenario file the fuzzer cannot replay against an entrypoint (the one line says
    which steps or settings, and why)."""


class PluginOffMainThread(RuntimeError):
    """The entrypoint registered a livekit plugin (imported one) where the fuzzer had to run
    it off the main thread: livekit refuses that, as it would under its own thread executor.
    The message says what to do."""


class FuzzOptions(BaseModel):
    """How to fuzz: how many runs, from which seed, the configuration deployed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    examples: int = Field(default=1000, ge=1, le=MAX_EXAMPLES, strict=True)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED, strict=True)
    steps: int = Field(default=25, ge=1, le=100, strict=True)  # per run, at most
    avatar: bool = Field(default=True, strict=True)  # the scripted avatar stands in for the plugin
    simulation: bool = Field(default=True, strict=True)  # a simulation dispatch, its simulator
    progress_every: float = Field(default=5.0, gt=0, le=3600, strict=True)  # real seconds
    # every run's log to your logging as it comes, rather than the failing run's in the report
    logs: bool = Field(default=False, strict=True)


def config_of(options: FuzzOptions) -> sc.Config:
    return sc.Config(
        avatar_identity=AVATAR if options.avatar else None, simulation=options.simulation
    )


def fuzz(
    server: Any,
    options: FuzzOptions | None = None,
    *,
    checks: Sequence[Check] = (),
    out: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> FuzzReport:
    """Fuzz ``server``'s entrypoint; returns what was found (the failure shrunk, written to
    ``out``, a directory, as a scenario file when given: ``fuzz-AGENT-SEED.yaml``, never
    over another file, see ``write_scenario``). ``options`` by default
    ``FuzzOptions()``. Each run has an event loop of its own, on the
    caller's thread, as livekit's job process runs the entrypoint on its main thread (a
    plugin imported there registers); when the caller's thread runs a loop already (an
    async test), on a thread of the fuzzer's, that loop left alone. ``progress`` gets a line
    with the seed first, then one every ``progress_every`` seconds. Before any drawing: a
    ``TypeError`` for an argument of the wrong kind, ``NoAgentJob`` if the entrypoint builds
    no ``AgentJob``, ``PluginOffMainThread`` if it imports a plugin and had to run off the
    main thread. ``BadCheck`` (a ``TypeError``) for a check that cannot check an outcome:
    a class, an ``async`` function or one that cannot take the outcome, before any run; one
    that reads what a ``FuzzOutcome`` does not have (``outcome.jobb``), or a builtin that
    cannot be called with it, found by that plain run or by the first drawn run that
    reaches it, which stops the drawing (nothing reported, nothing written).

    ``server``: an ``AgentServer`` with an ``rtc_session`` entrypoint, or the entrypoint
    function; a function that an ``AgentServer`` of its module registered runs with that
    server's ``on_session_end`` and ``on_simulation_end`` (as a worker runs it, and as
    ``agent-runtime fuzz MODULE:entrypoint`` does), a function no server registered with
    none."""
    server = served(server)
    check_agent(server)
    if options is None:
        options = FuzzOptions()
    elif not isinstance(options, FuzzOptions):
        raise TypeError(
            "options must be a FuzzOptions (FuzzOptions(examples=..., seed=...)), "
            f"not {type(options).__name__}"
        )
    _check_checks(checks)
    out_dir = _path_of("out", out) if out is not None else None
    if out_dir is not None and out_dir.exists() and not out_dir.is_dir():
        # found only after every example ran, the failure's file was lost
        raise ValueError(f"out {str(out_dir)!r} exists and is not a directory")
    if progress is not None and not callable(progress):
        raise TypeError(
            f"progress must be callable with a line (print_progress, say), not {progress!r}"
        )
    return _in_thread(lambda: _fuzz(server, options, list(checks), out_dir, progress))  # type: ignore[no-any-return]


def _check_checks(checks: Sequence[Check]) -> None:
    if callable(checks) or isinstance(checks, (str, bytes)) or not isinstance(checks, Iterable):
        what = described(checks) if callable(checks) else repr(checks)
        raise TypeError(f"checks must be a list of functions (checks=[my_check]), not {what}")
    for check in checks:
        if not callable(check):
            raise TypeError(f"a check must be callable as check(outcome), not {check!r}")
        if (why := not_a_check(check)) is not None:
            raise BadCheck(check, why)
        if not takes(check, 1):
            raise BadCheck(
                check, f"a check must be callable as check(outcome), not {described(check)}"
            )


def _path_of(name: str, value: Any) -> Path:
    if isinstance(value, (str, os.PathLike)):
        return Path(value)
    raise TypeError(f"{name} must be a path (a str or a Path), not {type(value).__name__}")


def _fuzz(
    server: Any,
    options: FuzzOptions,
    checks: list[Check],
    out: Path | None,
    progress: Callable[[str], None] | None,
) -> FuzzReport:
    seed = options.seed if options.seed is not None else random.randrange(MAX_SEED)
    config = config_of(options)
    began = time.monotonic()
    has_avatar, prewarm = _preflight(server, config, checks)
    if not has_avatar:
        # the entrypoint gives its job no avatar: nothing the avatar's provider does can
        # reach this agent, so no run draws it (and a failure is written without one)
        config = config.model_copy(update={"avatar_identity": None})
    tell = Progress(progress, options.progress_every, options.examples)
    tell(f"fuzz: seed {seed} (the same draws again: --seed {seed})")  # first: see Ctrl-C
    stats = Stats(on_example=tell.on_example)
    if prewarm is not None:
        # the server's prewarm fails before any step: every run would fail alike, and
        # shrinking would run it (a hung one for its whole bound) some twenty times more
        stats.examples = 1  # the preflight's run
        return _report(server, seed, began, stats, prewarm, False, out)
    machine = make_machine(server, config, list(checks), stats, keep_logs=not options.logs)
    with _collector_paused():  # hypothesis parses the machine's source here
        test = get_state_machine_test(
            machine,
            settings=settings(
                max_examples=options.examples,
                stateful_step_count=options.steps,
                deadline=None,
                database=None,
                derandomize=False,
                report_multiple_bugs=False,
                print_blob=False,
                verbosity=Verbosity.quiet,
                suppress_health_check=list(HealthCheck),
                phases=(Phase.generate, Phase.shrink),
            ),
        )
    failure: FuzzFailure | None = None
    flaky = False
    with quiet_sdk_logs(logging.ERROR), stats.interrupts.installed():
        try:
            try:
                hypothesis_seed(seed)(test)()
            except Flaky as e:
                # the run failed, and passed when hypothesis ran it again: the agent's failure
                # is in the group; the agent depends on more than the run (state kept between
                # jobs, the wall clock, the network)
                failure = _inner(e, FuzzFailure)
                stopped = _inner(e, CheckStopped)
                if stopped is not None:
                    raise stopped from None
                if failure is None:
                    raise
                flaky = True
        except FuzzFailure as e:
            failure = e
        except CheckStopped as e:  # the check's mistake, not the agent's: no report of it
            raise e.error from None
        # one that came after the last step (its run left unchecked): no report of it
        stats.interrupts.check()
    return _report(server, seed, began, stats, failure, flaky, out)


def _report(
    server: Any,
    seed: int,
    began: float,
    stats: Stats,
    failure: FuzzFailure | None,
    flaky: bool,
    out: Path | None,
) -> FuzzReport:
    report = FuzzReport(
        seed=seed,
        examples=stats.examples,
        paths=len(stats.paths),
        seconds=time.monotonic() - began,
    )
    if failure is not None:
        label = agent_label(server)
        fill_report(report, failure.problems, failure.scenario, seed, label)
        report.flaky = flaky
        report.logs = failure.logs
        if out is not None:
            try:
                written, kept = write_scenario(report.scenario or {}, out, f"fuzz-{label}-{seed}")
                report.written = str(written)
                report.kept = None if kept is None else str(kept)
            except OSError as e:  # the report stands without its file
                report.write_error = f"{out}: {type(e).__name__}: {e.strerror or e}"
    return report


def _preflight(
    server: Any, config: sc.Config, checks: list[Check]
) -> tuple[bool, FuzzFailure | None]:
    """One plain run (the entrypoint started, the job let end) before any drawing:
    ``NoAgentJob`` when the entrypoint builds no ``AgentJob``, ``PluginOffMainThread`` when
    it imports a plugin off the main thread, ``BadCheck`` when a check reads what the
    outcome does not have or cannot be called with it: usage errors rather than
    properties; what else the run shows is left to the drawing, but a prewarm that failed
    (before any step: no draw can change that). Returns whether the entrypoint gave its
    job an avatar (the run's scripted avatar stood in for it), and that failure."""
    participants: list[dict[str, Any]] = [{"identity": "user"}]
    if config.simulation:
        participants.append({"identity": SIMULATOR, "attributes": {ATTRIBUTE_SIMULATOR: "true"}})
    steps = [{"at": 0, "event": "session.start"}, {"at": 0, "event": "end"}]
    scenario = sc.parse_scenario({"name": "preflight", **scenario_of(config, participants, steps)})
    ran: list[Harness] = []
    # the user's checks too: one that reads what the outcome does not have is refused here
    problems = on_virtual_time(_replay(server, scenario, checks, probe=ran))
    for problem in problems:
        if PLUGIN_THREAD in problem.message:
            raise PluginOffMainThread(problem.message)
    job = ran[0].job if ran else None
    has_avatar = job is not None and job.avatar is not None
    entry = ran[0].entry if ran else None
    if isinstance(entry, Failed) and isinstance(entry.error, PrewarmFailed):
        failed = FuzzFailure(problems, scenario_of(config, participants, steps), ran[0].log_lines())
        return has_avatar, failed
    return has_avatar, None


def check_replayable(scenario: sc.Scenario, source: str) -> None:
    """``NotReplayable`` naming what of ``scenario`` a replay against an entrypoint cannot
    do: steps the fuzzer does not take, settings that are the entrypoint's own, no
    ``session.start`` (the entrypoint would never run) or more than one."""
    why: list[str] = []
    foreign = [s for s in scenario.steps if not isinstance(s, TAKES)]
    if foreign:
        names = ", ".join(f"t={seconds_text(s.at)} {s.event}" for s in foreign)
        why.append(f"steps the fuzzer does not take ({names}: agent-runtime simulate runs them)")
    starts = sum(isinstance(s, sc.SessionStart) for s in scenario.steps)
    if starts != 1:
        why.append(
            "no session.start step (the entrypoint would never run)"
            if not starts
            else f"{starts} session.start steps (the entrypoint runs once)"
        )
    own = sorted(set(scenario.config.model_fields_set) - set(CONFIG))
    if own:
        why.append(
            f"config {', '.join(own)} (the entrypoint's own AgentJob options; a replay takes "
            f"only {', '.join(CONFIG)})"
        )
    if scenario.expect is not None:
        why.append("an expect block (a replay checks the fuzzer's properties)")
    if why:
        raise NotReplayable(f"{source}: cannot replay it against the agent: {'; '.join(why)}")


def replay(
    server: Any,
    path: str | os.PathLike[str],
    *,
    checks: Sequence[Check] = (),
    logs: bool = False,
) -> FuzzReport:
    """Run a scenario file (one ``fuzz`` wrote, or one written by hand) against
    ``server``'s entrypoint and check the same properties. ``ScenarioError`` if invalid,
    ``NotReplayable`` if it has what a replay cannot do (``check_replayable``),
    ``NoAgentJob`` if the entrypoint builds no ``AgentJob``, ``BadCheck`` if a check cannot
    check an outcome (as for ``fuzz``); ``logs`` as ``FuzzOptions.logs``. ``server`` as for
    ``fuzz``: a function an ``AgentServer`` of its module registered runs with that server's
    hooks."""
    server = served(server)
    check_agent(server)
    _check_checks(checks)
    scenario = sc.load_scenario(_path_of("path", path))
    check_replayable(scenario, str(path))
    began = time.monotonic()
    refused: list[str] = []
    kept: list[str] = []
    problems = _in_thread(
        lambda: on_virtual_time(
            _replay(server, scenario, list(checks), refused, logs=kept, keep_logs=not logs)
        )
    )
    report = FuzzReport(
        seed=None, examples=1, paths=1, seconds=time.monotonic() - began, skipped=refused
    )
    if problems:
        fill_report(report, problems, None, None)
        report.logs = kept
    return report


async def _replay(
    server: Any,
    scenario: sc.Scenario,
    checks: list[Check],
    refused: list[str] | None = None,
    *,
    probe: list[Harness] | None = None,
    logs: list[str] | None = None,
    keep_logs: bool = True,
) -> list[Problem]:
    """The scenario's run; its log kept (``keep_logs``, else printed), its lines added
    to ``logs``."""
    from agent_runtime.testing.fuzz import properties as props

    with quiet_sdk_logs(logging.ERROR):
        h = Harness(server, scenario.config, keep_logs=keep_logs)
        if probe is not None:
            probe.append(h)
        steps = [s.model_dump() for s in scenario.steps]
        try:
            await h.open(scenario.participants)
            for step in scenario.steps:
                if isinstance(step, sc.End):
                    await h.advance_to(step.at)
                    break
                await h.step(step)
                if isinstance(h.entry, Declined) and _with_a_user(scenario):
                    # as the preflight's room: an agent that builds no job with a user
                    # there builds none anywhere (a usage error, not a property); a room
                    # with none is one it may decline
                    await h.close()
                    raise h.entry.error
                problems = [p for check in props.DURING for p in check(h)]
                if problems:
                    await h.close()
                    return problems
            return await finish(h, checks, steps)
        finally:
            h.release_log()  # a run cut short (a step raised) leaves no filter behind
            if refused is not None:
                refused += h.refused
            if logs is not None:
                logs += h.log_lines()


def _with_a_user(scenario: sc.Scenario) -> bool:
    """Someone other than the simulator is in the room as the run begins."""
    return any(ATTRIBUTE_SIMULATOR not in p.attributes for p in scenario.participants)


_E = TypeVar("_E", bound=BaseException)


def _inner(error: BaseException, kind: type[_E]) -> _E | None:
    """The first ``kind`` inside ``error``: itself, in its group, or what it came from."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, kind):
            return e
        todo += [*getattr(e, "exceptions", ()), *(c for c in (e.__cause__, e.__context__) if c)]
    return None


@contextmanager
def _collector_paused() -> Iterator[None]:
    """No garbage collection inside: on CPython 3.11 a parse nested in another (a finalizer
    that imports a module under pytest's assertion rewrite, run by a collection in the middle
    of the outer parse) fails the outer one with "AST constructor recursion depth mismatch"
    (gh-106905, never fixed in 3.11)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _in_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` where no event loop runs: this thread, or a fresh one when this one runs a
    loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        running = False
    else:
        running = True
    if not running:  # outside the except: what fn raises is not "during" the lookup
        return fn()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    # a daemon: a run cut short (Ctrl-C in the caller's join) does not keep the process
    t = threading.Thread(target=target, name="agent-runtime-fuzz", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")

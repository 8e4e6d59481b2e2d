"""Fuzzing an agent's entrypoint: hypothesis runs the state machine (``machine.py``) for a
number of examples from a seed, shrinks what fails, and the failure becomes a scenario file
that ``replay`` runs again against the same entrypoint."""

from __future__ import annotations

import gc
import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Flaky
from hypothesis.stateful import get_state_machine_test
from livekit.agents.types import ATTRIBUTE_SIMULATOR
from pydantic import BaseModel, ConfigDict, Field

from agent_runtime.testing import scenario as sc
from agent_runtime.testing.clock import run as on_virtual_time
from agent_runtime.testing.entrypoint import agent_label, check_agent, served
from agent_runtime.testing.fuzz.harness import AVATAR, SIMULATOR, Failed, Harness
from agent_runtime.testing.fuzz.machine import (
    CheckStopped,
    FuzzFailure,
    Stats,
    make_machine,
    scenario_of,
)
from agent_runtime.testing.fuzz.progress import Progress, print_progress
from agent_runtime.testing.fuzz.properties import Check, check_checks
from agent_runtime.testing.fuzz.replay import (
    NotReplayable,
    check_replayable,
    in_thread,
    path_of,
    replay,
    run_scenario,
)
from agent_runtime.testing.fuzz.report import FuzzReport, fill_report, write_scenario
from agent_runtime.testing.sdk_logs import quiet_sdk_logs
from agent_runtime.testing.user_code import PLUGIN_THREAD, PrewarmFailed

# the report, the progress lines and the replay have modules of their own; their names stay
# here too, where users import them
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
    check_checks(checks)
    out_dir = path_of("out", out) if out is not None else None
    if out_dir is not None and out_dir.exists() and not out_dir.is_dir():
        # found only after every example ran, the failure's file was lost
        raise ValueError(f"out {str(out_dir)!r} exists and is not a directory")
    if progress is not None and not callable(progress):
        raise TypeError(
            f"progress must be callable with a line (print_progress, say), not {progress!r}"
        )
    return in_thread(lambda: _fuzz(server, options, list(checks), out_dir, progress))  # type: ignore[no-any-return]


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
    problems = on_virtual_time(run_scenario(server, scenario, checks, probe=ran))
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

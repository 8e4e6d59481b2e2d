"""The pytest plugin of the testing kit (entry point ``pytest11``, extra ``testing``).

Scenario files are collected as tests: every ``*.scenario.yaml``, and every ``*.yaml`` in
the directories named by the ini option ``agent_runtime_scenarios``. Each runs through
``AgentJob`` on the in-memory room and a virtual clock (``run_scenario``); an ``expect``
that does not hold fails the test with expected vs got per fact and the transitions that
led there. An invalid file is a collection error of one line. ``--trace-dir DIR`` keeps each
run's JSONL trace for ``agent-runtime replay``/``timeline``.

The fixtures for tests that drive an agent's own entrypoint (``virtual_clock``,
``agent_room``, ``simulator``, ``scripted_avatar``, ``run_entrypoint``, ``fuzz_entrypoint``)
are registered
from ``fixtures.py``.

Loading this plugin imports only pytest: the kit (and livekit-agents) is imported when a
scenario runs or a fixture is used, so it costs nothing in test runs that use neither.
"""

from __future__ import annotations

import asyncio
import inspect
import tempfile
import warnings
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from pprint import pformat
from typing import TYPE_CHECKING, Any

import pytest

from agent_runtime.sdk.native_exit import release_at_exit
from agent_runtime.testing.fixtures import (  # noqa: F401 - registered as this plugin's fixtures
    agent_room,
    agent_session_transports,
    fuzz_entrypoint,
    run_entrypoint,
    scripted_avatar,
    simulator,
    virtual_clock,
)

if TYPE_CHECKING:
    from _pytest._code.code import ExceptionInfo, TerminalRepr

    from agent_runtime.testing.expect import Mismatch
    from agent_runtime.testing.scenario import Scenario

SUFFIX = ".scenario.yaml"
INI_DIRS = "agent_runtime_scenarios"
EXTRA = "install the project's testing extra (from a clone: pip install '.[testing]')"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("agent_runtime", "agent-runtime scenario files")
    group.addoption(
        "--trace-dir",
        metavar="DIR",
        default=None,
        help="keep each scenario's JSONL trace in DIR (one file per scenario, at its path "
        "relative to the rootdir), for agent-runtime replay and timeline",
    )
    parser.addini(
        INI_DIRS,
        type="paths",
        default=[],
        help="directories whose *.yaml files are all scenario files (besides *.scenario.yaml "
        "anywhere); collected with testpaths",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "scenario: a scenario file run through AgentJob (agent-runtime's plugin)"
    )
    config.addinivalue_line(
        "markers",
        "virtual_time: the test runs on a VirtualTimeLoop (the SDK's own timers virtual too; "
        "pytest-asyncio 1.4 or later)",
    )
    dirs: list[Path] = config.getini(INI_DIRS)
    for d in dirs:
        if not d.is_dir():
            raise pytest.UsageError(f"{INI_DIRS}: {d} is not a directory")
    trace_dir = config.getoption("trace_dir")
    if trace_dir:
        # one usage error up front, not every scenario failing with the same line
        why = _unwritable_dir(Path(trace_dir))
        if why is not None:
            raise pytest.UsageError(f"--trace-dir: {why}")
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        # run with no arguments: the configured directories are collected as testpaths are
        given = [Path(a).resolve() for a in config.args]
        for d in dirs:
            if not any(d.resolve().is_relative_to(g) for g in given):
                config.args.append(str(d))


def _unwritable_dir(d: Path) -> str | None:
    """Why traces cannot be kept in ``d`` (made if missing, a file made there and removed
    at once: permissions say nothing of /proc or a read-only mount); None when they can."""
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"cannot create {d}: {e.strerror or e}"
    try:
        with tempfile.NamedTemporaryFile(dir=d, prefix=".trace-dir-probe-"):
            pass
    except OSError as e:
        return f"cannot write in {d}: {e.strerror or e}"
    return None


def pytest_unconfigure(config: pytest.Config) -> None:
    # the RoomIO a job starts uses livekit's native runtime: disposed at exit so that its
    # last log record cannot abort a run that passed (an in-process run leaves it usable)
    release_at_exit()


@pytest.hookimpl(wrapper=True, optionalhook=True)
def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Generator[None, Mapping[str, Callable[[], asyncio.AbstractEventLoop]] | None, Any]:
    """An async test marked ``virtual_time`` runs on a ``VirtualTimeLoop``: livekit's own
    timers (a speech's interruption bound, a sink's clear bound) are then virtual like the
    ``virtual_clock`` fixture's, and move with it. Any other test keeps what another
    plugin or conftest answers, else the loop pytest-asyncio makes by default (one factory,
    so test ids stay as they are)."""
    others = yield
    if item.get_closest_marker("virtual_time") is None:
        return others if others is not None else {"asyncio": asyncio.new_event_loop}
    from agent_runtime.testing.clock import VirtualTimeLoop

    return {"virtual_time": VirtualTimeLoop}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A ``virtual_time`` mark that could not take effect is a usage error (no
    pytest-asyncio that takes it) or that test's failure (a sync test), never a test that
    silently runs on real time."""
    marked = [i for i in items if i.get_closest_marker("virtual_time") is not None]
    if not marked:
        return
    if not hasattr(config.hook, "pytest_asyncio_loop_factories"):
        raise pytest.UsageError(
            f"{marked[0].nodeid}: virtual_time needs pytest-asyncio 1.4 or later ({EXTRA})"
        )
    for item in marked:
        function = getattr(item, "obj", None)
        # a module's or class's mark covers its sync tests too, and means nothing to them;
        # on the test itself it is a mistake
        own = any(m.name == "virtual_time" for m in getattr(item, "own_markers", ()))
        if own and not inspect.iscoroutinefunction(function):
            # that test fails, not the whole run (it stopped a run that deselected it)
            item.stash[_MISMARKED] = (
                f"{item.nodeid}: virtual_time marks an async test (a test of its own runs "
                "a coroutine on virtual time with agent_runtime.testing.clock.run)"
            )


_MISMARKED = pytest.StashKey[str]()


def pytest_runtest_setup(item: pytest.Item) -> None:
    if (why := item.stash.get(_MISMARKED, None)) is not None:
        pytest.fail(why, pytrace=False)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> ScenarioFile | None:
    config = parent.config
    if (
        file_path.name.endswith(SUFFIX)
        or (
            file_path.suffix == ".yaml"
            and any(file_path.is_relative_to(d) for d in config.getini(INI_DIRS))
        )
        or (file_path.suffix in (".yaml", ".yml") and _named(file_path, config))
    ):
        file: ScenarioFile = ScenarioFile.from_parent(parent, path=file_path)
        return file
    return None


def _named(file_path: Path, config: pytest.Config) -> bool:
    """Whether the file was named on pytest's command line (``pytest incident.yaml``): it is
    meant as a test, where left alone pytest would say it found nothing to run."""
    here = config.invocation_params.dir
    found = file_path.resolve()  # both sides resolved: /tmp is a link on macOS
    return any((here / arg.split("::")[0]).resolve() == found for arg in config.args)


class ScenarioFile(pytest.File):
    """A scenario file: one test, named after the scenario."""

    def collect(self) -> Iterator[ScenarioItem]:
        source = _relative(self.path, self.config.rootpath)
        try:
            from agent_runtime.testing.scenario import ScenarioError, load_scenario
        except ModuleNotFoundError as e:  # PyYAML: the testing extra brings it
            raise self.CollectError(f"{source}: scenario files need {e.name}: {EXTRA}") from None
        try:
            scenario = load_scenario(self.path, source=source)
        except ScenarioError as e:
            raise self.CollectError(f"invalid scenario: {e}") from None
        item: ScenarioItem = ScenarioItem.from_parent(self, name=scenario.name, scenario=scenario)
        item.add_marker("scenario")
        yield item


class ScenarioFailed(AssertionError):
    """The scenario ran and its ``expect`` block did not hold."""

    def __init__(self, mismatches: list[Mismatch], result: dict[str, Any]) -> None:
        super().__init__(mismatches[0].line() if mismatches else "")
        self.mismatches = mismatches
        self.result = result


class ScenarioRunError(Exception):
    """The scenario could not run (its trace cannot be written): one line, no traceback."""


class ScenarioItem(pytest.Item):
    def __init__(self, *, scenario: Scenario, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scenario = scenario
        self.trace_path: Path | None = None

    def runtest(self) -> None:
        from agent_runtime.testing.clock import run as on_virtual_time
        from agent_runtime.testing.expect import mismatches
        from agent_runtime.testing.runner import run_scenario

        self.trace_path = self._trace_path()
        try:
            result = on_virtual_time(run_scenario(self.scenario, trace_path=self.trace_path))
        except OSError as e:
            if self.trace_path is None or str(e.filename) != str(self.trace_path):
                raise
            raise ScenarioRunError(
                f"{self.trace_path}: cannot write the trace: {e.strerror or e}"
            ) from None
        if result.get("trace_error"):
            warnings.warn(
                pytest.PytestWarning(
                    f"{self.trace_path}: the trace could not be written "
                    f"({result['trace_error']}); it stops before the failed record"
                ),
                stacklevel=1,
            )
        failed = mismatches(self.scenario.expect, result)
        if failed:
            raise ScenarioFailed(failed, result)

    def _trace_path(self) -> Path | None:
        where = self.config.getoption("trace_dir")
        if not where:
            return None
        rel = _relative(self.path, self.config.rootpath)
        if Path(rel).is_absolute():  # outside the rootdir: by its name alone
            rel = self.path.name
        name = rel[: -len(SUFFIX)] if rel.endswith(SUFFIX) else rel.rsplit(".", 1)[0]
        path = Path(where) / f"{name}.jsonl"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ScenarioRunError(
                f"--trace-dir: cannot create {path.parent}: {e.strerror or e}"
            ) from None
        return path

    def repr_failure(
        self, excinfo: ExceptionInfo[BaseException], style: Any = None
    ) -> str | TerminalRepr:
        if isinstance(excinfo.value, ScenarioFailed):
            return failure_report(self, excinfo.value)
        if isinstance(excinfo.value, ScenarioRunError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"scenario: {self.name}"


# -- the failure report --------------------------------------------------------------------
def failure_report(item: ScenarioItem, failure: ScenarioFailed) -> str:
    """Expected vs got for each expectation that did not hold, then the transitions that
    led there with their virtual times, the final states and where the trace is."""
    result = failure.result
    n = len(failure.mismatches)
    what = ", ".join(m.what for m in failure.mismatches)
    lines = [f"{n} expectation{'s' if n > 1 else ''} did not hold: {what}", ""]
    for m in failure.mismatches:
        lines.append(f"  {m.what}")
        if m.known:
            lines.append(f"    no such fact; known facts: {', '.join(m.known)}")
            continue
        lines += _labelled("expected", m.expected) + _labelled("got", m.got)
        diffs = list(_differences(m.expected, m.got, ""))
        if diffs and isinstance(m.expected, dict | list):
            lines.append("    where they differ:")
            lines += [f"      {path}: expected {w!r}, got {g!r}" for path, w, g in diffs]
    transitions = result.get("transitions", [])
    lines += ["", f"transitions that led there ({len(transitions)}, virtual seconds):"]
    width = max((len(t["machine"]) for t in transitions), default=0)
    moves = [f"{t['source']} -> {t['dest']}" for t in transitions]
    wide = max((len(m) for m in moves), default=0)
    for t, move in zip(transitions, moves, strict=True):
        lines.append(f"  {t['t']:>9.3f}  {t['machine']:<{width}}  {move:<{wide}}  on {t['event']}")
    finals = result.get("final_states", {})
    lines += ["", "final states: " + ", ".join(f"{m}={s}" for m, s in sorted(finals.items()))]
    errors = result.get("facts", {}).get("step_errors") or []
    if errors:
        lines.append("steps the runtime refused:")
        lines += [f"  {e}" for e in errors]
    if item.trace_path is not None:
        lines.append(f"trace: {item.trace_path}  (agent-runtime replay / timeline)")
    return "\n".join(lines)


def _labelled(label: str, value: Any) -> list[str]:
    text = pformat(value, width=88, sort_dicts=True).splitlines()
    head = f"    {label + ':':<9} "
    return [head + text[0], *(" " * len(head) + rest for rest in text[1:])]


def _differences(want: Any, got: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    """The leaves where ``got`` does not meet ``want``, by path (keys the file does not
    name are not compared, as the check itself does)."""
    from agent_runtime.testing.expect import matches

    if isinstance(want, dict) and isinstance(got, dict):
        for k, w in want.items():
            sub = f"{path}.{k}" if path else str(k)
            if k not in got:
                yield sub, w, "<missing>"
            else:
                yield from _differences(w, got[k], sub)
    elif isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            yield f"{path or 'list'} length", len(want), len(got)
        for i, (w, g) in enumerate(zip(want, got, strict=False)):
            yield from _differences(w, g, f"{path}[{i}]")
    elif not matches(want, got):
        yield path or "value", want, got


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)

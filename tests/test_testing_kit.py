"""The testing kit as a user gets it: the sample project in ``examples/testing`` (its own
``pyproject.toml``, an agent with its own ``rtc_session`` entrypoint built on ``AgentJob``,
a test file using the kit's fixtures, scenario files) copied into a temporary directory and
run by pytest through ``pytester``, as the user's CI would run it.

Real: pytest, pytest-asyncio, the plugin, livekit's ``JobContext`` and ``RemoteSession``,
``AgentSession``, the runtime. Faked, because they need a server: the room (the kit's
``InMemoryRoom``), the session transport's byte stream, the avatar provider.

The plugin is given with ``-p`` here because the shared development environment may have
the package installed without its entry point; with it, ``-p`` finds the plugin already
registered under the same name and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

# imported here, not first in an in-process run: pytester restores sys.modules after each
# run, and PyYAML's C loader does not survive being imported a second time
import agent_runtime.testing.entrypoint
import agent_runtime.testing.runner
import agent_runtime.testing.scenario  # noqa: F401
from agent_runtime.tools.replay import replay_file

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "examples" / "testing"
# the guide page that shows the sample project (it was the README before the docs site)
README = ROOT / "docs" / "guide" / "testing.md"
PLUGIN = "agent_runtime.testing.pytest_plugin"


def sample_project(pytester: pytest.Pytester) -> Path:
    for path in SAMPLE.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            target = pytester.path / path.relative_to(SAMPLE)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    return pytester.path


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_inprocess("-p", PLUGIN, "-p", "no:cacheprovider", *args)


def readme_block(marker: str) -> str:
    """The fenced block right after ``<!-- marker -->`` in the testing guide."""
    text = README.read_text(encoding="utf-8")
    m = re.search(rf"<!-- {re.escape(marker)} -->\n```[a-z]*\n(.*?)\n```", text, re.S)
    assert m is not None, f"no block after <!-- {marker} --> in {README.relative_to(ROOT)}"
    return m.group(1)


def test_the_sample_project_passes_its_tests_and_scenarios_and_keeps_their_traces(
    pytester: pytest.Pytester,
) -> None:
    sample_project(pytester)
    result = run(pytester, "-v", "--trace-dir", "traces")
    result.assert_outcomes(passed=7)
    result.stdout.fnmatch_lines_random(
        [
            "*hangup_verdict.scenario.yaml::the agent hangs up, the simulator still gets "
            "the verdict PASSED*",
            "*scenarios/user_drops_past_grace.yaml::the user drops and does not come back "
            "within the grace period PASSED*",
            "*test_my_agent.py::test_the_simulator_gets_the_verdict_after_the_agent_hangs_up "
            "PASSED*",
            "*test_my_agent.py::test_an_avatar_that_never_joins_leaves_the_agent_audible PASSED*",
        ]
    )
    # one trace per scenario, at its own path, and each replays through the machines
    traces = sorted(p.relative_to(pytester.path) for p in (pytester.path / "traces").rglob("*"))
    assert [str(p) for p in traces if p.suffix] == [
        "traces/hangup_verdict.jsonl",
        "traces/scenarios/user_drops_past_grace.jsonl",
    ]
    for p in traces:
        if p.suffix:
            assert replay_file(pytester.path / p).ok


def test_the_fixtures_work_in_strict_mode(pytester: pytest.Pytester) -> None:
    sample_project(pytester)
    result = run(
        pytester, "-o", "asyncio_mode=strict", "-k", "leaves or simulator", "test_my_agent.py"
    )
    result.assert_outcomes(passed=3)  # every fixture: room, clock, simulator, avatar, runner


def test_a_failing_scenario_shows_expected_vs_got_and_the_transitions_as_in_the_readme(
    pytester: pytest.Pytester,
) -> None:
    """The README's failing scenario, run: its output is the README's, line for line."""
    sample_project(pytester)
    failing = pytester.path / "scenarios" / "user_drops_for_good.yaml"
    failing.write_text(readme_block("failing scenario: scenarios/user_drops_for_good.yaml"))
    broken = pytester.path / "broken.scenario.yaml"
    broken.write_text("name: broken\nsteps:\n  - {at: 0, event: session.start}\n  - {at: -1}\n")
    result = run(
        pytester,
        "--continue-on-collection-errors",
        "--trace-dir",
        "traces",
        "scenarios/user_drops_for_good.yaml",
        "broken.scenario.yaml",
    )
    result.assert_outcomes(failed=1, errors=1)
    out = result.stdout.lines
    # an invalid file: one line naming it and the problem, no traceback
    head = next(i for i, line in enumerate(out) if "ERROR collecting broken.scenario.yaml" in line)
    assert out[head + 1] == ("invalid scenario: broken.scenario.yaml: step 2: missing 'event'")
    assert out[head + 2].startswith("___") or out[head + 2].startswith("===")
    assert not any("Traceback" in line for line in out)
    # the failure report, exactly as the README shows it
    shown = readme_block("its output").splitlines()
    start = out.index(shown[0])
    assert out[start : start + len(shown)] == shown
    assert (pytester.path / "traces" / "scenarios" / "user_drops_for_good.jsonl").is_file()


def test_the_readme_shows_the_sample_projects_own_files() -> None:
    for rel in (
        "examples/testing/test_my_agent.py",
        "examples/testing/scenarios/user_drops_past_grace.yaml",
    ):
        assert readme_block(f"file: {rel}") == (ROOT / rel).read_text(encoding="utf-8").rstrip(
            "\n"
        ), f"the README's copy of {rel} is stale"


def test_the_plugin_is_declared_as_a_pytest11_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    # named after its module, so `-p agent_runtime.testing.pytest_plugin` never loads it twice
    assert project["entry-points"]["pytest11"] == {PLUGIN: PLUGIN}
    assert "pytest-asyncio" in " ".join(project["optional-dependencies"]["testing"])


def test_loading_the_plugin_imports_neither_livekit_agents_nor_yaml() -> None:
    """Installed, the plugin loads in every pytest run of the environment: it imports
    nothing of the kit beyond its fixtures' declarations until a scenario or a fixture is
    used (``agent_runtime`` itself brings ``livekit.rtc``, not ``livekit.agents``)."""
    code = (
        f"import sys, {PLUGIN}\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('livekit.agents', 'yaml', "
        "'agent_runtime.testing.')) and m not in ('agent_runtime.testing.pytest_plugin', "
        "'agent_runtime.testing.fixtures'))\n"
        "print(','.join(bad))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == ""


def test_a_missing_scenario_directory_and_an_unwritable_trace_dir_are_one_line(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
        'agent_runtime_scenarios = ["nope"]\n'
    )
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"ERROR: agent_runtime_scenarios: {pytester.path}/nope is not a directory"]
    )

    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
    )
    (pytester.path / "leave.scenario.yaml").write_text(
        (SAMPLE / "scenarios" / "user_drops_past_grace.yaml").read_text()
    )
    (pytester.path / "file").write_text("not a directory")
    # one usage error before anything runs (each scenario failed with this line)
    result = run(pytester, "--trace-dir", "file/traces")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert (
        result.stderr.lines[0] == "ERROR: --trace-dir: cannot create file/traces: Not a directory"
    )
    assert not any("Traceback" in line for line in result.outlines + result.errlines)
    assert not any("scenario:" in line for line in result.outlines)  # nothing ran


@pytest.mark.parametrize("name", ["incident.yaml", "incident.yml"])
def test_a_plain_yaml_named_on_the_command_line_runs_as_a_scenario(
    pytester: pytest.Pytester, name: str
) -> None:
    """``pytest incident.yaml`` (a scenario ``record`` wrote under a name of the user's
    choosing) ran nothing: pytest said it found no collectors for the file."""
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
    )
    (pytester.path / name).write_text(
        (SAMPLE / "scenarios" / "user_drops_past_grace.yaml").read_text()
    )
    (pytester.path / "notes.yaml").write_text("not: a scenario\n")  # not named: left alone
    result = run(pytester, name)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*1 passed*"])
    assert run(pytester).ret == pytest.ExitCode.NO_TESTS_COLLECTED
    # named through a link (macOS's /tmp is one): the same file
    (pytester.path / "link").symlink_to(pytester.path, target_is_directory=True)
    run(pytester, f"link/{name}").assert_outcomes(passed=1)


def test_a_yml_in_a_scenario_directory_is_left_alone(pytester: pytest.Pytester) -> None:
    """The directories collect ``.yaml``: a ``docker-compose.yml`` beside the scenarios
    stopped the whole run with a collection error."""
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
        'agent_runtime_scenarios = ["scenarios"]\n'
    )
    scenarios = pytester.mkdir("scenarios")
    (scenarios / "leave.yaml").write_text(
        (SAMPLE / "scenarios" / "user_drops_past_grace.yaml").read_text()
    )
    (scenarios / "docker-compose.yml").write_text("services: {}\n")
    run(pytester).assert_outcomes(passed=1)


def test_virtual_time_is_the_marked_tests_and_a_users_own_loop_factory_keeps_the_rest(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        """
        import asyncio

        class UsersLoop(asyncio.SelectorEventLoop):
            pass

        def pytest_asyncio_loop_factories(config, item):
            return {"users": UsersLoop}
        """
    )
    pytester.makepyfile(
        """
        import asyncio

        import pytest

        from agent_runtime.testing.clock import UPTIME, VirtualTimeLoop

        async def test_unmarked_keeps_the_users_loop():
            assert type(asyncio.get_running_loop()).__name__ == "UsersLoop"

        @pytest.mark.virtual_time
        async def test_marked_runs_on_virtual_time(virtual_clock):
            loop = asyncio.get_running_loop()
            assert isinstance(loop, VirtualTimeLoop)
            await asyncio.sleep(3600)  # livekit's own bounds pass like this one
            assert loop.time() == UPTIME + 3600.0
        """
    )
    result = run(
        pytester, "-o", "asyncio_mode=auto", "-o", "asyncio_default_fixture_loop_scope=function"
    )
    result.assert_outcomes(passed=2)


def test_virtual_time_on_a_sync_test_fails_that_test_and_only_when_it_runs(
    pytester: pytest.Pytester,
) -> None:
    # it was a usage error that stopped the whole run, even one that deselected that test
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.virtual_time
        def test_sync():
            pass

        def test_other():
            pass
        """
    )
    options = ("-o", "asyncio_mode=auto", "-o", "asyncio_default_fixture_loop_scope=function")
    result = run(pytester, *options)
    result.assert_outcomes(passed=1, errors=1)  # at its setup, as a missing fixture is
    result.stdout.fnmatch_lines(["*test_sync: virtual_time marks an async test*"])
    result = run(pytester, *options, "-k", "other")
    result.assert_outcomes(passed=1, deselected=1)


def _job_side() -> contextvars.Context:
    """A context of the job's, as the kit runs the entrypoint in: a task started there is
    the job's (the test's own task ends as the test says)."""
    from agent_runtime.testing.user_code import JOB_SIDE

    context = contextvars.copy_context()
    context.run(JOB_SIDE.set, True)
    return context


async def test_an_agent_failure_livekit_logged_is_not_reported_again_when_its_task_goes() -> None:
    """livekit logs the agent's failure inside its task (``log_exceptions``), re-raises it,
    and never retrieves the task (``on_enter``'s): collected later, the task reported it a
    second time, which CPython 3.11 turns into an INTERNALERROR hiding the failure when the
    report's log falls inside pytest formatting one."""
    import gc

    from livekit.agents.utils import log_exceptions

    from agent_runtime.testing.user_code import UserFailures

    loop = asyncio.get_running_loop()
    reports: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reports.append(context["message"]))
    failures = UserFailures()
    failures.install()
    try:

        @log_exceptions(logger=logging.getLogger("livekit.agents"))
        async def on_enter() -> None:
            raise RuntimeError("the agent's own bug")

        task = loop.create_task(on_enter(), context=_job_side())
        await asyncio.wait([task])
        (failure,) = failures.take()
        assert str(failure.error) == "the agent's own bug"
        failures.uninstall()
        del task, failure
        gc.collect()
        assert reports == []
    finally:
        failures.uninstall()
        loop.set_exception_handler(previous)


async def test_another_error_the_task_ended_with_is_the_tests_failure_too() -> None:
    """The task that logged one error of the agent's ended with another: that one is not
    taken as retrieved with the first, it is reported (a failure of the agent's too)."""
    from livekit.agents.utils import log_exceptions

    from agent_runtime.testing.user_code import UserFailures

    @log_exceptions(logger=logging.getLogger("livekit.agents"))
    async def on_enter() -> None:
        raise RuntimeError("the first bug")

    async def step() -> None:
        try:
            await on_enter()
        except RuntimeError:
            raise KeyError("the second bug") from None

    failures = UserFailures()
    failures.install()
    try:
        task = asyncio.get_running_loop().create_task(step(), context=_job_side())
        await asyncio.wait([task])
        await asyncio.sleep(0)  # the done callbacks
        assert [str(f.error) for f in failures.take()] == ["the first bug", "'the second bug'"]
    finally:
        failures.uninstall()


@pytest.mark.parametrize("owner", ["done callback", "awaiting task"])
async def test_another_error_the_tasks_owner_took_is_not_reported(owner: str) -> None:
    """The task that logged the agent's error ended with another, which its owner took: a
    done callback added as the task was made (the runtime's scheduler takes its tasks'
    ends so), or a task that began awaiting it after the log. asyncio reports nothing
    then; the kit reported it as never retrieved (an avatar start that failed after the
    agent's bug was the agent's second failure, or an ERROR log line without the kit's)."""
    from livekit.agents.utils import log_exceptions

    from agent_runtime.testing.user_code import UserFailures

    @log_exceptions(logger=logging.getLogger("livekit.agents"))
    async def on_enter() -> None:
        raise RuntimeError("the agent's bug")

    go_on = asyncio.Event()

    async def step() -> None:
        try:
            await on_enter()
        except RuntimeError:
            await go_on.wait()
            raise KeyError("its owner's to handle") from None

    taken: list[BaseException | None] = []

    async def awaits(task: asyncio.Task[None]) -> None:
        try:
            await task
        except KeyError as e:
            taken.append(e)

    loop = asyncio.get_running_loop()
    reports: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reports.append(context["message"]))
    failures = UserFailures()
    failures.install()
    try:
        task = loop.create_task(step(), context=_job_side())
        if owner == "done callback":
            task.add_done_callback(lambda t: taken.append(t.exception()))
        await asyncio.sleep(0)  # the agent's bug is logged
        waiter = loop.create_task(awaits(task)) if owner == "awaiting task" else task
        await asyncio.sleep(0)
        go_on.set()
        await asyncio.wait([task, waiter])
        for _ in range(3):
            await asyncio.sleep(0)  # the done callbacks, and what they call soon
        assert [str(f.error) for f in failures.take()] == ["the agent's bug"]
        assert [type(e) for e in taken] == [KeyError] and reports == []
    finally:
        failures.uninstall()
        loop.set_exception_handler(previous)

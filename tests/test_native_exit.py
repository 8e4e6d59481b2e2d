"""A process that ran a job exits without livekit's native runtime aborting it.

livekit's FFI forwards its log records to Python through a callback and logs one more as
it is disposed at exit; a callback still waiting for the GIL as the interpreter finalizes
aborts the process (SIGABRT, a run that passed reported as failed: CI drew it once). The
race itself is not reproducible on demand, so these tests pin what removes it: by the time
the runtime is disposed it sends its records to its own logger (``RUST_LOG`` makes that
logger print), not through Python. The release is tried in fresh interpreters (on this
tree: ``PYTHONPATH``): disposing the runtime here would leave this test process without
room events.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DISPOSED_OUTSIDE_PYTHON = "DEBUG livekit_ffi::server] disposing ffi server"

AGENT = """
from livekit.agents import Agent, AgentServer, AgentSession, JobContext

from agent_runtime import AgentJob

server = AgentServer()


@server.rtc_session()
async def entrypoint(ctx: JobContext) -> None:
    job = AgentJob.from_job_context(ctx, session=AgentSession(), grace_period=1.0)
    await job.start(Agent(instructions="hello"))
"""

TEST = """
from livekit import rtc

from agent import server


async def test_a_user_leaves(agent_room, run_entrypoint):
    agent_room.add_participant("user")
    await run_entrypoint(server)
    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_for("job", "closed")
"""


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RUST_LOG": "livekit_ffi=debug", "PYTHONPATH": str(ROOT)}
    for name in ("PYTEST_ADDOPTS", "RUST_LOG_STYLE"):  # the output is read as plain text
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_a_kit_test_run_disposes_the_native_runtime_with_python_out_of_its_logs(
    tmp_path: Path,
) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "test_agent.py").write_text(TEST)
    done = run(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--asyncio-mode=auto", "test_agent.py"],
        tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    # the job's RoomIO started the runtime; its last record never went through Python
    assert DISPOSED_OUTSIDE_PYTHON in done.stderr, done.stderr


def test_simulate_disposes_the_native_runtime_with_python_out_of_its_logs(
    tmp_path: Path,
) -> None:
    scenario = ROOT / "examples" / "testing" / "scenarios" / "user_drops_past_grace.yaml"
    done = run(["-m", "agent_runtime.tools.cli", "simulate", str(scenario)], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert DISPOSED_OUTSIDE_PYTHON in done.stderr, done.stderr


def test_a_process_that_never_used_the_native_runtime_does_not_start_it(
    tmp_path: Path,
) -> None:
    code = (
        "from agent_runtime.sdk import native_exit\n"
        "from livekit.rtc._ffi_client import FfiClient\n"
        "native_exit.release_at_exit()\n"
        "native_exit.release()\n"
        "assert FfiClient._instance is None, 'started the runtime only to dispose it'\n"
    )
    done = run(["-c", code], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "ffi server" not in done.stderr


def test_an_in_process_kit_run_leaves_the_runtime_to_the_process_that_runs_it(
    pytester: pytest.Pytester,
) -> None:
    """A run inside another (pytester's in-process runs, an IDE's runner) must not dispose
    the runtime the outer process still uses: the release waits for the process's exit."""
    from livekit import rtc

    from agent_runtime.sdk import native_exit

    rtc.AudioProcessingModule()  # the runtime is live in this process
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
    )
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = pytester.runpytest_inprocess(
        "-p", "agent_runtime.testing.pytest_plugin", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=1)
    assert native_exit._live_client() is not None, "the inner run disposed the runtime"


def test_an_agent_run_by_livekits_own_console_disposes_the_native_runtime_outside_python(
    tmp_path: Path,
) -> None:
    """The user's agent, run as deployed (livekit's CLI, not the kit): livekit's own exit
    hook disposed the runtime with its logs still going through Python, and a console run
    of the example aborted at exit (SIGABRT, "panic in a function that cannot unwind") on
    CI once. The job's start registers the release."""
    env = {"COLUMNS": "250", "LIVEKIT_URL": "", "LIVEKIT_API_KEY": "", "LIVEKIT_API_SECRET": ""}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "agent.py"), "console", "--text"],
        input="hello\n",
        cwd=tmp_path,
        env={**os.environ, **env, "RUST_LOG": "livekit_ffi=debug", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert DISPOSED_OUTSIDE_PYTHON in done.stdout + done.stderr, done.stderr[-3000:]

"""``agent-runtime fuzz FILE.py:SERVER`` where the agent is a module of the user's own
package (a ``src/`` layout): the file is imported as that package's module, so its relative
imports work as they do deployed (``python -m shop.agent dev``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_runtime.tools.cli import main

AGENT = """
from livekit.agents import Agent, AgentServer, AgentSession, JobContext

from agent_runtime import AgentJob, on_session_end

from IMPORT import GRACE

server = AgentServer(session_end_timeout=315)


@server.rtc_session(on_session_end=on_session_end)
async def entrypoint(ctx: JobContext) -> None:
    job = AgentJob.from_job_context(ctx, session=AgentSession(), grace_period=GRACE)
    await job.start(Agent(instructions="..."))
"""


@pytest.fixture(params=[".settings", "settings"], ids=["relative", "sibling"])
def package(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """``src/fsm_trial_shop/`` with an agent that imports its settings relatively, or as a
    sibling module (as a script run from its folder can)."""
    shop = tmp_path / "src" / "fsm_trial_shop"
    shop.mkdir(parents=True)
    (shop / "__init__.py").write_text("")
    (shop / "settings.py").write_text("GRACE = 12.0\n")
    (shop / "agent.py").write_text(AGENT.replace("IMPORT", request.param))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # what the command adds goes with it
    yield shop
    for name in [n for n in sys.modules if n.split(".")[0] in ("fsm_trial_shop", "settings")]:
        del sys.modules[name]


def test_an_agent_file_in_a_package_is_fuzzed_with_its_imports(
    package: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["fuzz", "src/fsm_trial_shop/agent.py:server", "--examples", "3", "--seed", "1"])
    out, err = capsys.readouterr()
    assert (code, err.splitlines()[1:]) == (0, []), err
    assert out.startswith("3 example(s) run") and out.rstrip().endswith("nothing found")
    assert sys.modules["fsm_trial_shop.agent"].GRACE == 12.0

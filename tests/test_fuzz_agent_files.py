"""``agent-runtime fuzz FILE.py:SERVER`` as a user's project has it: an agent that is a
module of the user's own package (a ``src/`` layout) is imported as that package's module,
so its relative imports work as they do deployed (``python -m shop.agent dev``); one that
exits as it is imported (livekit's CLI started unguarded) is one line, exit 2."""

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


@pytest.mark.filterwarnings("ignore:the built-in Python CLI is deprecated:DeprecationWarning")
@pytest.mark.parametrize(
    ("ending", "code"),
    [("sys.exit(3)", 3), ("cli.run_app(server)", 2)],
    ids=["sys-exit", "livekit-cli-unguarded"],
)
def test_an_agent_file_that_exits_as_it_is_imported_is_one_line_and_exit_2(
    ending: str,
    code: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent that starts livekit's CLI at import (``cli.run_app`` not under ``if
    __name__ == "__main__"``) ended the fuzz with livekit's "No such command 'fuzz'", and
    one that calls ``sys.exit`` ended it silently, with the module's exit code."""
    agent = tmp_path / "exits_at_import.py"
    agent.write_text(
        "import sys\n\nfrom livekit.agents import AgentServer, cli\n\n"
        f"server = AgentServer()\n{ending}\n"
    )
    argv = ["fuzz", f"{agent}:server", "--examples", "1"]
    monkeypatch.setattr(sys, "argv", ["agent-runtime", *argv])  # what livekit's CLI reads
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (
        f"agent-runtime fuzz: agent '{agent}:server': cannot import {agent}: it exited as it "
        f"was imported (SystemExit: {code}); a call such as cli.run_app(server) belongs under "
        'if __name__ == "__main__":'
    )

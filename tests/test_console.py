"""The example agent under livekit-agents' own console runner, text mode.

``python examples/agent.py console --text`` is the first thing a livekit developer runs: a
mock job with no room I/O (``(none) -> AgentSession -> (none)``). The composed job must run
there: the participant machine says it has nothing to follow, and the job closes through
``on_session_end`` when the console ends. Real: the console runner, the job process, the
session, the runtime. The console needs PortAudio even in text mode (Debian
``libportaudio2``, which CI installs).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _portaudio_missing() -> str | None:
    done = subprocess.run(
        [sys.executable, "-c", "import sounddevice"], capture_output=True, text=True, check=False
    )
    return None if done.returncode == 0 else done.stderr.strip().splitlines()[-1]


def _console(agent: Path, cwd: Path) -> str:
    """``python AGENT console --text``, given one line; what it printed (it exited 0)."""
    missing = _portaudio_missing()
    if missing is not None:
        pytest.skip(f"the console needs PortAudio (apt-get install libportaudio2): {missing}")
    env = {
        **os.environ,
        "COLUMNS": "250",  # the console's log lines are not wrapped
        "PYTHONPATH": str(ROOT),
        "LIVEKIT_URL": "",
        "LIVEKIT_API_KEY": "",
        "LIVEKIT_API_SECRET": "",
    }
    for name in ("AGENT_STT", "AGENT_LLM", "AGENT_TTS", "AGENT_AVATAR", "AGENT_TRACE"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, str(agent), "console", "--text"],
        input="hello\n",
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    return out


def test_the_example_runs_in_console_text_mode_without_an_error() -> None:
    out = _console(ROOT / "examples" / "agent.py", ROOT)
    assert "Traceback" not in out and "unhandled exception" not in out, out[-3000:]
    assert "(none) -> `AgentSession` -> (none)" in out  # console mode: no room I/O
    assert "the participant machine has nothing to follow" in out
    # the job closes once its session ended: whichever reaches it first, the session's own
    # close (the console's end of input) or livekit's on_session_end, names the reason
    closed = r"job closed \((session ended|session closed: user_initiated)\)"
    assert re.search(closed, out), out[-3000:]


def test_the_readmes_agent_runs_in_console_text_mode_as_written(tmp_path: Path) -> None:
    # a new developer's first run of the README's my_agent.py: `python my_agent.py console`
    # exited 0 having printed nothing (no livekit CLI in the file), the agent never run
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- quickstart: file my_agent.py -->\n```python\n(.*?)```", readme, re.S)
    assert found is not None, "the README's quick start has no my_agent.py"
    (tmp_path / "my_agent.py").write_text(found[1], encoding="utf-8")
    out = _console(tmp_path / "my_agent.py", tmp_path)
    assert "Traceback" not in out and "unhandled exception" not in out, out[-3000:]
    assert "(none) -> `AgentSession` -> (none)" in out, out[-3000:]  # livekit's console ran it
    assert re.search(r"job closed \((session ended|session closed: user_initiated)\)", out)

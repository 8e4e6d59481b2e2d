"""An agent that imports a livekit plugin inside its entrypoint (``examples/testing/my_agent.py``
imports bey there when ``BEY_API_KEY`` is set) runs under livekit: its job process
(``ipc/job_proc_lazy_main.py`` ``proc_main``, the default process executor) runs the
entrypoint on the process's main thread, where ``Plugin.register_plugin`` allows it. The
fuzzer ran every entrypoint on a thread of its own, so the same agent failed under
``agent-runtime fuzz`` only, with "Plugins must be registered on the main thread".

Real: livekit's ``Plugin`` registry, the bey plugin, the example agent, hypothesis. Faked,
because they need a server: the room and the session transport.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from livekit.agents import Plugin

from agent_runtime.testing.fuzz import FuzzOptions, fuzz
from agent_runtime.tools.cli import main
from tests.support import planted

ROOT = Path(__file__).resolve().parents[1]


def _not_imported_yet(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """As in a fresh worker: ``name`` not imported, its plugin not registered (restored
    after the test)."""
    for mod in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        monkeypatch.delitem(sys.modules, mod)
    package, _, leaf = name.rpartition(".")
    if package in sys.modules:
        monkeypatch.delattr(sys.modules[package], leaf, raising=False)
    monkeypatch.setattr(Plugin, "registered_plugins", list(Plugin.registered_plugins))


def test_the_cli_fuzzes_the_example_agent_that_imports_bey_in_its_entrypoint(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # before: "1 example(s) run ... a property failed / user code: the agent's entrypoint
    # raised RuntimeError: Plugins must be registered on the main thread"
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("BEY_API_KEY", "unused: the scripted avatar stands in for bey")
    monkeypatch.delitem(sys.modules, "my_agent", raising=False)
    _not_imported_yet(monkeypatch, "livekit.plugins.bey")
    code = main(["fuzz", "examples/testing/my_agent.py:server", "--examples", "5", "--seed", "1"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert out.startswith("5 example(s) run, ") and "nothing found" in out
    assert "livekit.plugins.bey" in sys.modules  # it ran the entrypoint's import


def test_fuzz_from_a_sync_test_runs_the_entrypoint_on_the_main_thread(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _not_imported_yet(monkeypatch, "tests.support.lazy_plugin")
    seen: list[str] = []

    def on_main_thread(_: Any) -> None:
        seen.append(threading.current_thread().name)

    report = fuzz(
        planted.lazy_plugin_server(),
        FuzzOptions(seed=1, examples=3),
        checks=[on_main_thread],
        out=tmp_path,
    )
    assert report.ok, report.summary()
    assert seen and set(seen) == {threading.main_thread().name}


async def test_fuzz_from_an_async_test_says_why_a_plugin_imported_in_the_entrypoint_fails(
    monkeypatch: pytest.MonkeyPatch, fuzz_entrypoint: Any
) -> None:
    # the test's loop runs on the main thread: the fuzzer's runs need one of their own, so
    # they run on a thread, as under livekit's thread executor (console mode), where the same
    # import fails too. One line before any drawing, not a shrunk "property failed"
    from agent_runtime.testing.fuzz.run import PluginOffMainThread

    _not_imported_yet(monkeypatch, "tests.support.lazy_plugin")
    with pytest.raises(PluginOffMainThread) as caught:
        fuzz_entrypoint(planted.lazy_plugin_server(), examples=3, seed=1)
    message = str(caught.value)
    assert "Plugins must be registered on the main thread" in message
    assert "import the plugin at the top of the agent's module" in message
    assert "from a sync test" in message

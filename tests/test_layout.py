"""What runs in production never imports the testing kit, the tools or the project's own
verification (``verification/``, not in the wheel), and the package's public namespace
exports the production API only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import agent_runtime

PACKAGE = Path(agent_runtime.__file__).parent
# every module outside the testing kit and the tools, subpackages (runtimes/avatar/) too
PRODUCTION = sorted(
    p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in ("testing", "tools")
)


# what production never imports: the testing kit, the tools and the project's own checks
NOT_PRODUCTION = ("agent_runtime.testing", "agent_runtime.tools", "verification")


def _module(path: Path) -> str:
    """``agent_runtime.observe.otel`` for ``agent_runtime/observe/otel.py``."""
    parts = ["agent_runtime", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module name ``path`` imports, relative imports resolved from its package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = _module(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                mod = f"{base}.{node.module}" if node.module else base
                out.add(mod)
                out.update(f"{mod}.{a.name}" for a in node.names)
            elif node.module:
                out.add(node.module)
                out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_production_modules_never_import_the_testing_kit_or_the_tools() -> None:
    lifecycle = PACKAGE / "runtimes" / "avatar" / "_lifecycle.py"
    assert lifecycle in PRODUCTION  # a subpackage's modules are checked, their imports resolved
    imported = _imports(lifecycle)
    assert {"agent_runtime.sdk.livekit_compat", "agent_runtime.runtimes.avatar._route"} <= imported
    offenders = {
        str(p.relative_to(PACKAGE)): sorted(
            m
            for m in _imports(p)
            if m.startswith(
                ("agent_runtime.testing", "agent_runtime.tools", "verification", "yaml")
            )
        )
        for p in PRODUCTION
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_production_module_is_over_500_lines() -> None:
    """A module a reader can hold at once (issue 24): one that grows past it is split by
    idea, as the avatar package was, not left to grow."""
    assert len(PRODUCTION) > 30  # every runtime, system, SDK and observation module
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PRODUCTION}
    assert {name: n for name, n in sizes.items() if n > 500} == {}


def test_no_tool_module_is_over_500_lines() -> None:
    """The tools and the project's own verification keep to the same size (issue 39)."""
    root = PACKAGE.parent
    tools = [*(PACKAGE / "tools").rglob("*.py"), *(root / "verification").rglob("*.py")]
    assert len(tools) > 30
    sizes = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in tools}
    assert {name: n for name, n in sizes.items() if n > 500} == {}


def test_no_testing_kit_module_is_over_500_lines() -> None:
    """The testing kit ships to users too, and keeps to the same size: a module per job
    (the virtual clock, the loop on virtual time, the room, its local participant, the
    session transport, a scenario's steps, its expect block, ...)."""
    kit = sorted((PACKAGE / "testing").rglob("*.py"))
    assert len(kit) > 30  # the fuzzer's and the invariants' subpackages too
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in kit}
    assert {name: n for name, n in sizes.items() if n > 500} == {}


# names that moved out of a kit module when it was split, by the module users import them
# from (the guides, the reference pages, their own tests): each still imports from there
_MOVED = {
    "clock": ("VirtualTimeLoop", "VirtualTimeStalled", "UPTIME", "run", "settle"),
    "entrypoint": (
        "served",
        "check_agent",
        "agent_label",
        "not_an_entrypoint",
        "EntrypointStalled",
        "NoAgentJob",
    ),
    "inmemory": ("InMemorySessionTransport", "RpcCall", "quiet_sdk_logs", "RPC_ROUND_TRIP_BUDGET"),
    "scenario": ("SessionStart", "HeldEnd", "Step", "STEP_EVENTS", "Expect", "FACTS"),
    "runner": ("stranger", "stranger_track"),
    "fuzz.run": (
        "FuzzReport",
        "write_scenario",
        "print_progress",
        "NotReplayable",
        "check_replayable",
        "replay",
    ),
}


def test_a_kit_module_split_in_two_still_exports_what_moved_out() -> None:
    """``from agent_runtime.testing.clock import VirtualTimeLoop`` (and the rest) keeps
    working: listed in the module's ``__all__``, so its reference page still shows it and
    ``mypy --strict`` takes the import."""
    import importlib

    for name, moved in _MOVED.items():
        module = importlib.import_module(f"agent_runtime.testing.{name}")
        for attr in moved:
            assert attr in module.__all__, (name, attr)
            assert getattr(module, attr) is not None


def test_the_public_namespace_is_the_production_api() -> None:
    for name in agent_runtime.__all__:
        obj = getattr(agent_runtime, name)
        module = getattr(obj, "__module__", "agent_runtime")
        assert not module.startswith(("agent_runtime.testing", "agent_runtime.tools")), name


def test_the_error_agent_job_raises_for_a_wrong_plugin_is_a_public_name() -> None:
    """The embedding guide names ``AvatarPluginError`` as what ``AgentJob(avatar=...)``
    raises; a user catches it from ``agent_runtime``, where every public name is."""
    from agent_runtime.runtimes.avatar import AvatarPluginError

    assert "AvatarPluginError" in agent_runtime.__all__
    assert agent_runtime.AvatarPluginError is AvatarPluginError


def test_importing_the_whole_runtime_loads_neither_the_kit_nor_yaml() -> None:
    code = (
        "import sys, agent_runtime\n"
        "for n in agent_runtime.__all__: getattr(agent_runtime, n)\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('agent_runtime.testing', "
        "'agent_runtime.tools', 'verification')) or m == 'yaml')\n"
        "print(','.join(bad))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == ""


def test_a_runtime_missing_an_effect_handler_fails_at_import() -> None:
    """The handler of effect ``x`` is ``_fx_x``, bound from the spec when the module is
    imported (``effect_table``): a runtime without one cannot be built, whatever the
    test. Every runtime's table holds exactly its spec's effects."""
    import importlib

    import pytest

    from agent_runtime.actor import effect_table
    from statemachines.machines import MACHINES

    class Partial:
        def _fx_run_close(self, _ev: object) -> None: ...

    with pytest.raises(TypeError, match="Partial runs machine 'job' but has no _fx_report_cut"):
        effect_table(Partial, MACHINES["job"])
    seen = set()
    for path in PRODUCTION:
        mod = importlib.import_module(_module(path))
        table = getattr(mod, "_EFFECTS", None)
        if table is None:
            continue
        spec = next(m for m in MACHINES.values() if set(table) == {e.name for e in m.effects})
        seen.add(spec.name)
        assert all(fn.__name__ == f"_fx_{name}" for name, fn in table.items())
    assert seen == set(MACHINES)  # every machine has its runtime

"""What runs in production never imports the testing kit or the tools, and the package's
public namespace exports the production API only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import agent_runtime

PACKAGE = Path(agent_runtime.__file__).parent
PRODUCTION = sorted(p for p in PACKAGE.glob("*.py"))


def _imports(path: Path) -> set[str]:
    """Every module name ``path`` imports, relative imports resolved from the package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = "agent_runtime" if node.level == 1 else ""
                mod = f"{base}.{node.module}" if node.module else base
                out.add(mod)
                out.update(f"{mod}.{a.name}" for a in node.names)
            elif node.module:
                out.add(node.module)
    return out


def test_production_modules_never_import_the_testing_kit_or_the_tools() -> None:
    assert PRODUCTION, "no production modules found"
    offenders = {
        p.name: sorted(
            m
            for m in _imports(p)
            if m.startswith(("agent_runtime.testing", "agent_runtime.tools", "yaml"))
        )
        for p in PRODUCTION
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_public_namespace_is_the_production_api() -> None:
    for name in agent_runtime.__all__:
        obj = getattr(agent_runtime, name)
        module = getattr(obj, "__module__", "agent_runtime")
        assert not module.startswith(("agent_runtime.testing", "agent_runtime.tools")), name


def test_importing_the_whole_runtime_loads_neither_the_kit_nor_yaml() -> None:
    code = (
        "import sys, agent_runtime\n"
        "for n in agent_runtime.__all__: getattr(agent_runtime, n)\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('agent_runtime.testing', "
        "'agent_runtime.tools')) or m == 'yaml')\n"
        "print(','.join(bad))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == ""


def test_every_runtime_names_its_handlers_after_the_spec_s_effects_and_guards() -> None:
    """One convention across runtimes: the handler of effect ``x`` is ``_fx_x``, of guard
    ``g`` is ``_guard_g`` (one function may serve two names of its table), so a spec's name
    finds its code by search."""
    import importlib

    seen = 0
    for path in PRODUCTION:
        mod = importlib.import_module(f"agent_runtime.{path.stem}")
        for table, prefix in (("_EFFECTS", "_fx_"), ("_GUARDS", "_guard_")):
            handlers = getattr(mod, table, None)
            if handlers is None:
                continue
            seen += 1
            names = {prefix + key for key in handlers}
            wrong = {k: fn.__name__ for k, fn in handlers.items() if fn.__name__ not in names}
            assert not wrong, f"{path.name} {table}: {wrong}"
    assert seen >= 10  # every machine's runtime was found

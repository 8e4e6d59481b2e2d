"""The parts of the code depend on each other one way (``docs/guide/layout.md``).

Every module of ``statemachines/``, ``agent_runtime/`` and ``verification/`` belongs to one
part, and each part has a rank; a module may import its own part and the parts of a lower
rank, never a part of the same rank or above. Every import counts: at the top, in a function, under
``TYPE_CHECKING``, relative or absolute, ``import a.b`` or ``from a import b`` (``b`` a
module or a name). What this catches: ``runtimes`` importing ``system`` (the two imported
each other), ``observe`` importing the actor or the system, ``sdk`` importing the core, the
core importing a runtime, the testing kit importing the tools, anything importing the
package's front (``agent_runtime/__init__.py``) but the testing kit, the tools and
``verification``, anything of the installed package importing ``verification`` (the dev
folder the wheel leaves out).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# part -> rank: an import goes to the same part or to a lower rank
RANKS = {
    "statemachines": 0,  # the machines as data: pure
    "observe": 1,  # the trace, OpenTelemetry, the snapshot's shapes: beside the core
    "sdk": 1,  # the adapter to livekit-agents: beside the core
    "core": 2,  # the actor, its step, messages, clock, emitter, settings (and a scheduler)
    "runtimes": 3,  # one runtime per machine, the room facts, the wiring, the teardown runner
    "system": 4,  # JobSystem and AgentJob
    "front": 5,  # agent_runtime/__init__.py: the public names
    "testing": 6,  # the testing kit
    "tools": 7,  # the CLI (it runs scenarios with the testing kit)
    # the project's checks of its own machines (explore, mutation): a dev
    # folder, not in the wheel, so nothing installed may import it
    "verification": 8,
}
PACKAGES = ("statemachines", "agent_runtime", "verification")
_FOLDERS = ("observe", "sdk", "runtimes", "system", "testing", "tools")


def part_of(module: str) -> str | None:
    """The part a module of this project belongs to (None: not this project's)."""
    top, *rest = module.split(".")
    if top in ("statemachines", "verification"):
        return top
    if top != "agent_runtime":
        return None
    if not rest:
        return "front"
    return rest[0] if rest[0] in _FOLDERS else "core"


def modules(root: Path) -> Iterator[tuple[str, Path]]:
    """(dotted name, path) of every module of the project's packages under ``root``."""
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), path


def imports(module: str, path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """(line, module imported) for every import in ``path``: ``from a import b`` names
    ``a.b`` when ``b`` is a module of the project, else ``a``."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                as_path = root / Path(*sub.split("."))
                is_module = as_path.with_suffix(".py").is_file() or as_path.is_dir()
                yield node.lineno, sub if is_module else target


def upward_imports(root: Path) -> list[str]:
    """One line per import of a part of the same or a higher rank than the importer's."""
    found = []
    for module, path in modules(root):
        mine = part_of(module)
        assert mine is not None
        for line, target in sorted(set(imports(module, path, root))):
            theirs = part_of(target)
            if theirs is None or theirs == mine or RANKS[theirs] < RANKS[mine]:
                continue
            found.append(
                f"{path.relative_to(root)}:{line}: {module} ({mine}) imports {target} "
                f"({theirs}): {mine} may import only "
                + ", ".join(p for p, r in RANKS.items() if r < RANKS[mine] or p == mine)
            )
    return found


def part_cycles(root: Path) -> list[list[str]]:
    """Every cycle of the graph of parts (an edge where some module of one imports some
    module of the other), each from its smallest part."""
    edges: dict[str, set[str]] = {p: set() for p in RANKS}
    for module, path in modules(root):
        mine = part_of(module)
        for _, target in imports(module, path, root):
            theirs = part_of(target)
            if mine is not None and theirs is not None and theirs != mine:
                edges[mine].add(theirs)
    cycles: list[list[str]] = []

    def walk(start: str, at: str, trail: list[str]) -> None:
        for nxt in sorted(edges[at]):
            if nxt == start:
                cycles.append([*trail, start])
            elif nxt > start and nxt not in trail:
                walk(start, nxt, [*trail, nxt])

    for start in sorted(edges):
        walk(start, start, [start])
    return cycles


def test_no_module_imports_a_part_above_its_own() -> None:
    found = upward_imports(ROOT)
    assert not found, "imports against the layers:\n" + "\n".join(found)


def test_no_cycle_between_parts() -> None:
    cycles = part_cycles(ROOT)
    assert not cycles, "cycles between parts:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_every_module_has_a_part() -> None:
    found = list(modules(ROOT))
    assert {part_of(m) for m, _ in found} == set(RANKS)  # every part has a module, no other


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path: Path) -> None:
    """On a small tree laid out like today's main: a runtime importing the system's
    routing, and the system importing the runtime back (absolute and relative)."""
    files = {
        "statemachines/__init__.py": "",
        "agent_runtime/__init__.py": "",
        "agent_runtime/actor.py": "from agent_runtime.observe.trace import Tracer\n",
        "agent_runtime/observe/__init__.py": "",
        "agent_runtime/observe/trace.py": "Tracer = object\n",
        "agent_runtime/observe/snapshot.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from agent_runtime.system.job_system import JobSystem\n"
        ),
        "agent_runtime/runtimes/__init__.py": "",
        "agent_runtime/runtimes/_base.py": "from agent_runtime.system.routing import Wiring\n",
        "agent_runtime/system/__init__.py": "",
        "agent_runtime/system/routing.py": "def helper():\n    from ..actor import Actor\n",
        "agent_runtime/system/job_system.py": "from ..runtimes import _base\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = upward_imports(tmp_path)
    assert [f.split(": ", 1)[0] for f in found] == [
        "agent_runtime/observe/snapshot.py:3",
        "agent_runtime/runtimes/_base.py:1",
    ]
    assert (
        "agent_runtime.runtimes._base (runtimes) imports agent_runtime.system.routing" in (found[1])
    )
    assert part_cycles(tmp_path) == [
        ["core", "observe", "system", "core"],
        ["runtimes", "system", "runtimes"],
    ]


def test_nothing_installed_imports_verification(tmp_path: Path) -> None:
    """``verification/`` is not in the wheel: a machine, the runtime or the CLI importing it
    would fail for every user. It may import all of them (it checks them)."""
    files = {
        "statemachines/__init__.py": "",
        "statemachines/delivery.py": "from verification.explore.real import run\n",
        "agent_runtime/__init__.py": "",
        "agent_runtime/tools/__init__.py": "",
        "agent_runtime/tools/cli.py": "def main():\n    import verification.explore.command\n",
        "verification/__init__.py": "",
        "verification/explore/__init__.py": "",
        "verification/explore/real.py": "import statemachines.delivery\n",
        "verification/explore/command.py": "from agent_runtime.tools import cli\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = upward_imports(tmp_path)
    assert [f.split(": ", 1)[0] for f in found] == [
        "statemachines/delivery.py:1",
        "agent_runtime/tools/cli.py:2",
    ]
    assert "statemachines.delivery (statemachines) imports verification.explore.real" in found[0]


# the parts that run in production: their order is the scheduler's, never asyncio's
_RUNTIME_PARTS = ("observe", "sdk", "core", "runtimes", "system", "front")


# the one accessor of the loop's ready queue (the testing kit's): its definition reads it
_ACCESSOR = "agent_runtime.sdk.asyncio_compat"


def ready_queue_uses(root: Path) -> list[str]:
    """``path:line`` of every ``asyncio.sleep(0)`` (yielding so that whatever the loop has
    ready runs first), every read of a loop's private ``_ready`` and every use of its
    accessor (``ready_handles``, defined in ``sdk/asyncio_compat.py`` for the testing kit)
    in the runtime's parts; ``self._ready`` (the scheduler's own queue) is not the loop's."""
    found = []
    for module, path in modules(root):
        if part_of(module) not in _RUNTIME_PARTS:
            continue
        if module == _ACCESSOR:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "sleep"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == 0
            ):
                found.append(f"{where}: sleep(0)")
            elif (
                isinstance(node, ast.Attribute)
                and node.attr == "_ready"
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")
            ):
                found.append(f"{where}: {ast.unparse(node)}")
            elif (isinstance(node, ast.Attribute) and node.attr == "ready_handles") or (
                isinstance(node, ast.alias) and node.name == "ready_handles"
            ):
                found.append(f"{where}: ready_handles")
        for call in ("getattr(loop, '_ready'", 'getattr(loop, "_ready"'):
            if call in path.read_text(encoding="utf-8"):
                found.append(f"{path.relative_to(root)}: {call})")
    return found


def test_the_runtime_never_leans_on_asyncios_ready_queue() -> None:
    found = ready_queue_uses(ROOT)
    assert not found, "the runtime orders work by asyncio's ready queue:\n" + "\n".join(found)


_YIELDS = "import asyncio\nasync def f():\n    await asyncio.sleep(0)\n"


def test_the_ready_queue_check_catches_a_yield_and_a_read(tmp_path: Path) -> None:
    files = {
        "agent_runtime/__init__.py": "",
        "agent_runtime/scheduler.py": "class S:\n    def f(self):\n        return self._ready\n",
        "agent_runtime/runtimes/__init__.py": "",
        "agent_runtime/runtimes/host.py": _YIELDS,
        "agent_runtime/clock.py": "def f(loop):\n    return loop._ready or getattr(loop, '_ready')",
        "agent_runtime/runtimes/job.py": (
            "from agent_runtime.sdk import asyncio_compat as aio\n"
            "from agent_runtime.sdk.asyncio_compat import ready_handles\n"
            "def f(loop):\n    return aio.ready_handles(loop)\n"
        ),
        "agent_runtime/sdk/__init__.py": "",
        "agent_runtime/sdk/asyncio_compat.py": "def ready_handles(loop):\n"
        "    return getattr(loop, '_ready', None)\n",
        "agent_runtime/testing/__init__.py": "",
        "agent_runtime/testing/clock.py": _YIELDS
        + "from agent_runtime.sdk.asyncio_compat import ready_handles\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert ready_queue_uses(tmp_path) == [
        "agent_runtime/clock.py:2: loop._ready",
        "agent_runtime/clock.py: getattr(loop, '_ready')",
        "agent_runtime/runtimes/host.py:3: sleep(0)",
        "agent_runtime/runtimes/job.py:2: ready_handles",
        "agent_runtime/runtimes/job.py:4: ready_handles",
    ]

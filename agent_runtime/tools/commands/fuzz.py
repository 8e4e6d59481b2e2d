"""``agent-runtime fuzz MODULE:SERVER [--examples N] [--seed S] [--out DIR] [--replay FILE]
[--check MODULE:FUNCTION ...] [--steps N] [--no-avatar] [--no-simulation] [--logs]``.

Fuzzes the lifecycle of the agent ``SERVER`` (an ``AgentServer`` with an ``rtc_session``
entrypoint, or the entrypoint function) in ``MODULE`` (a module name or a ``.py`` file):
hypothesis draws sequences of what can happen to a job, runs each against the entrypoint on
the in-memory room and a virtual clock, checks the properties, shrinks a failure and writes
it to ``--out`` as a scenario file; ``--replay FILE`` runs such a file again. Every option is
checked before anything runs (``--out`` created and written to; a replay file the fuzzer
cannot perform refused; the options that draw refused with ``--replay``; an entrypoint that
builds no ``AgentJob`` refused after one plain run). Exit 0 nothing found, 1 a property
failed (also on replay, and when the failure could not be written), 2 a usage error (one
line on stderr). The runs' log records are kept out of the output, the failing run's
shown in its report; ``--logs`` prints every run's as it comes.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent_runtime.observe.files import file_kind
from agent_runtime.parts import described, takes
from agent_runtime.sdk import livekit_compat as lk

# at the top, so a venv without the tools extra (hypothesis) is told so as the command loads
from agent_runtime.testing.entrypoint import NoAgentJob, not_an_entrypoint, served
from agent_runtime.testing.fuzz import BadCheck, FuzzOptions, fuzz, replay
from agent_runtime.testing.fuzz.properties import not_a_check
from agent_runtime.testing.fuzz.run import (
    NotReplayable,
    PluginOffMainThread,
    check_replayable,
    print_progress,
)
from agent_runtime.testing.scenario import ScenarioError, load_scenario
from agent_runtime.tools.output import check_directory


class UsageError(Exception):
    """A bad argument; the message is the one line printed."""


def not_a_file(path: Path) -> str:
    """Why ``path``, not a directory, cannot be the agent's file."""
    try:
        return f"{file_kind(path.stat().st_mode)}, not a regular file"
    except FileNotFoundError:
        return "no such file"
    except OSError as e:  # there, but not to be reached: a link loop, a file as a folder
        return e.strerror or str(e)


def _module(name: str) -> Any:
    if name.endswith(".py") or "/" in name:
        path = Path(name)
        if path.is_dir():
            raise UsageError(f"{name}: a directory; name the agent's .py file in it")
        if not path.is_file():
            raise UsageError(f"{name}: {not_a_file(path)}")
        sys.path.insert(0, str(path.resolve().parent))  # its sibling modules, as a script's
        package = _package_module(path)
        if package is not None:
            root, dotted = package
            sys.path.insert(0, str(root))
            return importlib.import_module(dotted)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise UsageError(f"{name}: cannot load it as a module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
        return module
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    return importlib.import_module(name)


def _package_module(path: Path) -> tuple[Path, str] | None:
    """A file in a package (a folder with ``__init__.py``, as in a ``src/`` layout): the
    folder above the package and the module's dotted name, so its relative imports work
    as when it runs deployed (``python -m shop.agent``); None for a file on its own."""
    folder, parts = path.resolve().parent, [path.stem]
    while (folder / "__init__.py").is_file() and folder.name.isidentifier():
        parts.insert(0, folder.name)
        folder = folder.parent
    if len(parts) == 1:
        return None
    return folder, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def load(spec: str, what: str) -> Any:
    """``MODULE:NAME`` -> the object, or ``UsageError`` saying why not."""
    return _load(spec, what)[1]


def _load(spec: str, what: str) -> tuple[Any, Any]:
    """``MODULE:NAME`` -> the module and the object."""
    module_name, sep, attr = spec.rpartition(":")
    # a second colon (no file of that name) or a NAME no Python name: the import or the
    # lookup would fail on a module or a name the user never wrote
    extra = ":" in module_name and not os.path.exists(module_name)  # False on any OSError
    if not sep or not module_name or not attr.isidentifier() or extra:
        raise UsageError(
            f"{what} {spec!r}: give MODULE:NAME (a module or .py file, one colon, a Python "
            "name in it)"
        )
    try:
        module = _module(module_name)
    except UsageError:
        raise
    except SystemExit as e:  # livekit's cli.run_app at import exits, having parsed our argv
        raise UsageError(
            f"{what} {spec!r}: cannot import {module_name}: it exited as it was imported "
            f"(SystemExit: {e.code}); a call such as cli.run_app(server) belongs under "
            'if __name__ == "__main__":'
        ) from None
    except Exception as e:  # the user's module failing to import is a usage error here
        raise UsageError(
            f"{what} {spec!r}: cannot import {module_name}: {type(e).__name__}: {e}"
        ) from None
    try:
        return module, getattr(module, attr)
    except AttributeError:
        if _bare_folder(module, module_name):
            raise UsageError(
                f"{what} {spec!r}: {module_name}: a folder that is not a package (no "
                f"__init__.py); name the agent's module in it ({module_name}.MODULE:{attr})"
            ) from None
        raise UsageError(f"{what} {spec!r}: {module_name} has no {attr!r}") from None


def _bare_folder(module: Any, name: str) -> bool:
    """Whether ``module`` is the folder ``name`` names in the current directory, with no
    ``__init__.py``: it imports as a namespace package with nothing in it, where the user
    meant a package. An installed namespace package (``google``) is a module like another."""
    if getattr(module, "__file__", None) is not None or not hasattr(module, "__path__"):
        return False
    folder = os.path.realpath(os.path.join(*name.split(".")))
    return folder in {os.path.realpath(p) for p in module.__path__}


def _server(spec: str) -> Any:
    module, given = _load(spec, "agent")
    # the entrypoint function an AgentServer of its module registered: run with that
    # server's on_session_end and on_simulation_end, as a worker runs it (fuzz() does too)
    try:
        server = served(given, module)
    except TypeError as e:  # servers with different hooks registered it: which one?
        raise UsageError(f"agent {spec!r}: {e}") from None
    hooks = lk.server_hooks(server)
    if (hooks.entrypoint is None) if hooks is not None else not callable(server):
        raise UsageError(
            f"agent {spec!r}: not an AgentServer with an rtc_session entrypoint, nor an "
            "entrypoint function"
        )
    entrypoint = server if hooks is None else hooks.entrypoint
    why = not_an_entrypoint(entrypoint)
    if why is not None:
        what = (
            "not an AgentServer, nor an entrypoint function"
            if hooks is None
            else "its rtc_session entrypoint is no entrypoint function"
        )
        raise UsageError(f"agent {spec!r}: {what} (a function taking the JobContext): {why}")
    return server


def _checks(specs: list[str]) -> list[Any]:
    checks = []
    for spec in specs:
        fn = load(spec, "--check")
        if not callable(fn):
            raise UsageError(f"--check {spec!r}: not a function")
        if (why := not_a_check(fn)) is not None:
            raise UsageError(f"--check {spec!r}: {why}")
        if not takes(fn, 1):
            raise UsageError(
                f"--check {spec!r}: {described(fn)} cannot be called with the outcome "
                "(a function of one argument, the FuzzOutcome)"
            )
        checks.append(fn)
    return checks


def _out(value: str | None, made: list[Path]) -> Path | None:
    """The directory, created, with a file written there and removed: a failure found
    after a long run must not be lost to a directory that cannot take it. The directories
    it made go to ``made`` (the innermost last), for a usage error found later to remove."""
    if value is None:
        return None
    path = Path(value)
    why = check_directory(path)  # a file or a link to nothing where a directory is needed
    if why is not None:
        raise UsageError(f"--out {value}: {why}")
    missing = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".fuzz-probe-"):
            pass
    except OSError as e:
        raise UsageError(
            f"--out {value}: cannot write there ({type(e).__name__}: {e.strerror or e})"
        ) from None
    finally:
        made += [p for p in reversed(missing) if p.is_dir()]
    return path


def _unmake(made: list[Path]) -> None:
    """A usage error changes nothing: the ``--out`` directories made are removed (only
    while empty: never what something else put there meanwhile)."""
    for path in reversed(made):
        with contextlib.suppress(OSError):
            path.rmdir()


# what draws runs: nothing with --replay, where the file says what runs
_DRAWING = (
    ("--examples", "examples"),
    ("--seed", "seed"),
    ("--steps", "steps"),
    ("--out", "out"),
    ("--no-avatar", "no_avatar"),
    ("--no-simulation", "no_simulation"),
)


def _replayable(args: argparse.Namespace) -> None:
    given = [option for option, name in _DRAWING if getattr(args, name) not in (None, False)]
    if given:
        raise UsageError(
            f"{', '.join(given)}: no meaning with --replay (the file's config and steps say "
            "what runs); leave {} out".format("it" if len(given) == 1 else "them")
        )
    try:
        check_replayable(load_scenario(args.replay), args.replay)
    except (ScenarioError, NotReplayable) as e:
        raise UsageError(str(e)) from None


def _int(option: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"{option}: {value!r} is not a whole number") from None


def run(args: argparse.Namespace) -> int:
    made: list[Path] = []
    try:
        try:
            given = {
                "examples": args.examples,
                "seed": args.seed,
                "steps": args.steps,
            }
            # unsaid: FuzzOptions' own defaults
            options = FuzzOptions(
                **{k: _int(f"--{k}", v) for k, v in given.items() if v is not None},
                avatar=not args.no_avatar,
                simulation=not args.no_simulation,
                logs=args.logs,
            )
        except ValidationError as e:
            err = e.errors()[0]
            raise UsageError(f"--{err['loc'][0]}: {err['msg']}") from None
        if args.replay is not None:
            _replayable(args)  # checked before the agent is imported
            out = None
        else:
            out = _out(args.out, made)
        server = _server(args.agent)
        specs = args.check or []
        checks = _checks(specs)
        if args.logs and not logging.getLogger().handlers:
            # the agent set up no logging of its own: the records go somewhere to be seen
            logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        try:
            if args.replay is not None:
                report = replay(server, Path(args.replay), checks=checks, logs=args.logs)
            else:
                report = fuzz(server, options, checks=checks, out=out, progress=print_progress)
        except (NoAgentJob, PluginOffMainThread) as e:
            raise UsageError(f"agent {args.agent!r}: {e}") from None
        except BadCheck as e:
            spec = next(sp for sp, fn in zip(specs, checks, strict=True) if fn is e.check)
            raise UsageError(f"--check {spec!r}: {e}") from None
    except UsageError as e:
        _unmake(made)
        print(f"agent-runtime fuzz: {e}", file=sys.stderr)
        return 2
    print(report.summary())
    for detail in report.details[:1]:
        print(detail.rstrip())
    return 0 if report.ok else 1

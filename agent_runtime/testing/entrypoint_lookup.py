"""What of an agent a run uses, the agent given as a test gives it (an ``AgentServer`` with
an ``rtc_session`` entrypoint, or the entrypoint function): its entrypoint and the hooks
and bounds of the server that registered it (``served``), whether it can run at all
(``check_agent``) and its name for files written about it (``agent_label``)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_runtime.runtimes.finalize import SimulationEndFn
from agent_runtime.sdk import livekit_compat as lk

if TYPE_CHECKING:
    from livekit.agents.job import JobContext

Entrypoint = Callable[["JobContext"], Awaitable[None]]
SessionEndFn = Callable[["JobContext"], Awaitable[None]]


def not_an_entrypoint(fn: Any) -> str | None:
    """Why ``fn`` cannot be the job's entrypoint (livekit awaits what it returns for the
    JobContext it is called with); None when it can. Run, it failed as a bug in the
    agent."""
    name = getattr(fn, "__name__", type(fn).__name__)
    if not callable(fn):
        return f"{name} cannot be called"
    # whether it is async is not checked: livekit awaits what a plain function returns too
    # (a lambda, a sync tracing decorator around the async entrypoint)
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        return f"{name}{inspect.signature(fn)} does not take the JobContext as its argument"
    except ValueError:  # no signature to read: it runs as it is
        return None
    return None


def check_agent(agent: Any) -> None:
    """Refuse, before anything runs, what cannot be run as a job: neither an
    ``AgentServer`` with an ``rtc_session`` entrypoint nor an entrypoint function."""
    entrypoint, _, _ = entrypoint_and_hooks(agent)
    why = not_an_entrypoint(entrypoint)
    if why is not None:
        raise TypeError(f"the entrypoint must be a function taking the JobContext: {why}")


def served(agent: Any, module: Any = None) -> Any:
    """The ``AgentServer`` whose ``rtc_session`` entrypoint ``agent`` is, when ``agent`` is
    an entrypoint function and a server among the globals of ``module`` (by default the
    function's own module) registered it: run with that server's ``on_session_end``,
    ``on_simulation_end`` and timeouts, as a worker runs it; servers that registered it
    alike (those the same) are one answer. Servers that registered it with different
    hooks or timeouts are a ``TypeError`` naming them: which one runs it is the caller's
    to say (pass that server). Anything else (a server, a function no server of its
    module registered) is returned as given."""
    if _hooks_of(agent) is not None or not callable(agent):
        return agent
    if module is None:
        module = sys.modules.get(getattr(agent, "__module__", None) or "")
    if module is None:
        return agent
    try:
        named = list(vars(module).items())
    except TypeError:  # no namespace to look in
        return agent
    servers: dict[int, tuple[str, Any]] = {}
    for name, v in named:
        if (hooks := _hooks_of(v)) is not None and hooks.entrypoint is agent:
            servers.setdefault(id(v), (name, v))
    if not servers:
        return agent
    (_, first), *others = servers.values()
    if any(_run_as(o) != _run_as(first) for _, o in others):
        names = ", ".join(name for name, _ in servers.values())
        raise TypeError(
            f"{getattr(agent, '__qualname__', agent)!s} is the entrypoint of AgentServers "
            f"with different hooks or timeouts ({names}): pass the server to run it with"
        )
    return first


def _run_as(server: Any) -> tuple[Any, ...]:
    """What of ``server`` a run of its entrypoint uses besides the entrypoint."""
    hooks = _hooks_of(server)
    return (
        getattr(hooks, "session_end", None),
        getattr(hooks, "simulation_end", None),
        lk.server_session_end_timeout(server),
        lk.server_shutdown_process_timeout(server),
    )


def _hooks_of(value: Any) -> Any:
    """``value``'s server hooks; None for what is no server, and for a global of a module
    whose attribute reads raise (a framework's proxy outside its context)."""
    try:
        return lk.server_hooks(value)
    except Exception:
        return None


def agent_label(agent: Any) -> str:
    """The agent's name for files written about it: its entrypoint's module and function
    (``my_agent.entrypoint``; a script run as ``__main__`` by its file's name), only
    letters, digits, ``_``, ``.`` and ``-``."""
    hooks = lk.server_hooks(agent)
    fn: Any = hooks.entrypoint if hooks is not None else agent
    for _ in range(100):  # functools.partial (nested too), __wrapped__: the function inside
        if isinstance(fn, functools.partial):
            fn = fn.func
            continue
        with contextlib.suppress(ValueError):  # a cycle of __wrapped__: the function as given
            fn = inspect.unwrap(fn)
        if not isinstance(fn, functools.partial):
            break
    module = getattr(fn, "__module__", None) or ""
    if module == "__main__":
        try:
            module = Path(inspect.getfile(fn if inspect.isroutine(fn) else type(fn))).stem
        except TypeError:  # no file (a builtin)
            module = ""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{module}.{name}" if module else name)
    return label.strip(".-")[:100] or "agent"


def entrypoint_and_hooks(
    entrypoint: Any,
) -> tuple[Entrypoint, SessionEndFn | None, SimulationEndFn | None]:
    """The entrypoint function and the server's hooks (``None`` for a bare function)."""
    hooks = lk.server_hooks(entrypoint)
    if hooks is not None:
        if hooks.entrypoint is None:
            raise ValueError("this AgentServer has no rtc_session entrypoint registered")
        return hooks.entrypoint, hooks.session_end, hooks.simulation_end
    if not callable(entrypoint):
        raise TypeError(
            f"give an AgentServer or an entrypoint function, not {type(entrypoint).__name__}"
        )
    return entrypoint, None, None

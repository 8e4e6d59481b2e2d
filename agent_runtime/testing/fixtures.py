"""The testing kit's pytest fixtures, for tests that drive an agent's own entrypoint.

Registered by the plugin (``pytest_plugin.py``); every one is function-scoped:

- ``virtual_clock``: a ``VirtualClock`` at 0; time moves only when the test says
  (``await virtual_clock.advance(10)``), and every timer due on the way fires in order.
- ``agent_room``: an ``InMemoryRoom`` (a real, unconnected ``rtc.Room`` standing in for the
  server) on that clock, connected: add participants and tracks, remove them with a reason.
- ``simulator``: livekit's own ``RemoteSession`` (started) on the simulator's end of an
  in-memory session transport; the agent's end is given to the jobs ``run_entrypoint``
  runs. ``await simulator.finalize_simulation(provisional_success=True)`` asks for the
  agent's verdict as a simulator does.
- ``scripted_avatar``: a ``ScriptedAvatar`` plugin (identity ``avatar``) whose provider side
  is the test: it joins when the test adds its participant and publishes video.
- ``run_entrypoint``: an ``EntrypointRunner`` for this room, clock and transport;
  ``job = await run_entrypoint(server)`` runs the server's ``rtc_session`` entrypoint
  unchanged and returns the ``AgentJob`` it built (the entrypoint function a server of
  its module registered runs with that server's hooks). At teardown, a job still running ends
  as livekit ends one (``test ended``), the job contexts are released, and what failed in
  the agent's code fails the test.
- ``fuzz_entrypoint``: ``fuzz_entrypoint(server, *checks, examples=1000, seed=None, ...)``
  fuzzes the entrypoint's lifecycle (``agent-runtime fuzz`` from a test): the test fails
  with the shrunk sequence and its seed when a property does not hold.

The async ones need pytest-asyncio (the ``testing`` extra brings it) and run on the test's
event loop with its default, function-scoped loop: they work in ``asyncio_mode = "auto"``
and in strict mode (where each async test carries ``@pytest.mark.asyncio``).

This module imports only pytest (and pytest-asyncio when present): the kit itself is
imported when a fixture is used.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pytest

if TYPE_CHECKING:
    from livekit.agents.voice.remote_session import RemoteSession

    from agent_runtime.testing.clock import VirtualClock
    from agent_runtime.testing.entrypoint import EntrypointRunner
    from agent_runtime.testing.inmemory import InMemoryRoom
    from agent_runtime.testing.inmemory_transport import InMemorySessionTransport
    from agent_runtime.testing.scripted_avatar import ScriptedAvatar

F = TypeVar("F", bound=Callable[..., Any])

try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - the testing extra brings it
    pytest_asyncio = None  # type: ignore[assignment]

# the identity the simulator fixture speaks as
SIMULATOR_IDENTITY = "simulator"


def _async_fixture(fn: F) -> F:
    """A function-scoped async fixture on the test's loop; without pytest-asyncio, a fixture
    that fails the test saying what to install."""
    if pytest_asyncio is None:  # pragma: no cover - the testing extra brings it

        def missing() -> None:
            pytest.fail(
                f"the {fn.__name__} fixture needs pytest-asyncio: "
                "install the project's testing extra (from a clone: pip install '.[testing]')",
                pytrace=False,
            )

        missing.__doc__ = fn.__doc__
        return cast(F, pytest.fixture(name=fn.__name__)(missing))
    return cast(F, pytest_asyncio.fixture(fn, loop_scope="function"))


@pytest.fixture
def virtual_clock() -> VirtualClock:
    """A virtual clock at 0: ``await virtual_clock.advance(seconds)`` moves time."""
    from agent_runtime.testing.clock import VirtualClock

    return VirtualClock()


@_async_fixture
async def agent_room(virtual_clock: VirtualClock) -> InMemoryRoom:
    """A connected in-memory room (``test-room``) on the test's virtual clock."""
    from agent_runtime.testing.inmemory import InMemoryRoom

    room = InMemoryRoom(name="test-room", clock=virtual_clock)
    room.connect_locally()
    return room


@pytest.fixture
def agent_session_transports() -> tuple[InMemorySessionTransport, InMemorySessionTransport]:
    """The two ends of an in-memory session transport: ``(agent's end, simulator's end)``.
    What the simulator's end sends comes from the participant ``simulator`` (add it to the
    room with the ``lk.simulator`` attribute: only the simulator gets the verdict)."""
    from agent_runtime.testing.inmemory_transport import InMemorySessionTransport

    return InMemorySessionTransport.pair(identities=("agent", SIMULATOR_IDENTITY))


@_async_fixture
async def simulator(
    agent_session_transports: tuple[InMemorySessionTransport, InMemorySessionTransport],
) -> AsyncIterator[RemoteSession]:
    """livekit's ``RemoteSession``, started, on the simulator's end of the transport."""
    from livekit.agents.voice.remote_session import RemoteSession

    remote = RemoteSession(agent_session_transports[1])
    await remote.start()
    yield remote
    await remote.aclose()


@pytest.fixture
def scripted_avatar(virtual_clock: VirtualClock) -> ScriptedAvatar:
    """An avatar plugin whose provider side is the test (identity ``avatar``). Give it to
    ``run_entrypoint(..., avatar=scripted_avatar)`` to stand in for the entrypoint's plugin."""
    from agent_runtime.testing.scripted_avatar import ScriptedAvatar

    return ScriptedAvatar(avatar_identity="avatar", clock=virtual_clock)


@_async_fixture
async def run_entrypoint(
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    agent_session_transports: tuple[InMemorySessionTransport, InMemorySessionTransport],
) -> AsyncIterator[EntrypointRunner]:
    """``job = await run_entrypoint(server_or_entrypoint, simulation=..., avatar=...)``: an
    entrypoint function that an ``AgentServer`` of its module registered runs with that
    server's ``on_session_end`` and ``on_simulation_end``."""
    from agent_runtime.testing.entrypoint import EntrypointRunner

    runner = EntrypointRunner(
        room=agent_room, clock=virtual_clock, transport=agent_session_transports[0]
    )
    yield runner
    await runner.aclose()


@pytest.fixture
def fuzz_entrypoint(tmp_path: Any) -> Callable[..., Any]:
    """``fuzz_entrypoint(server, *checks, examples=1000, seed=None, steps=25, avatar=True,
    simulation=True, logs=False, out=None)``: fuzz the entrypoint; returns the
    ``FuzzReport`` when nothing was found, fails the test with the shrunk sequence, its
    seed, the failing run's log and the scenario file written (``out``, by default the
    test's temporary directory) otherwise."""

    def fuzz_entrypoint(
        server: Any, *checks: Callable[..., Any], out: Any = None, **options: Any
    ) -> Any:
        from pathlib import Path

        from pydantic import ValidationError

        from agent_runtime.testing.fuzz import FuzzOptions, fuzz
        from agent_runtime.testing.fuzz.run import print_progress

        try:
            fuzz_options = FuzzOptions(**options)
        except ValidationError as e:  # one line naming the option, as the CLI's
            err = e.errors()[0]
            raise ValueError(f"fuzz_entrypoint({err['loc'][0]}=...): {err['msg']}") from None
        report = fuzz(
            server,
            fuzz_options,
            checks=checks,
            out=Path(out) if out is not None else tmp_path,
            progress=print_progress,  # the seed first, on the test's captured stderr
        )
        if not report.ok:
            detail = report.details[0] if report.details else ""
            pytest.fail(f"{report.summary()}\n{detail}", pytrace=False)
        return report

    return fuzz_entrypoint

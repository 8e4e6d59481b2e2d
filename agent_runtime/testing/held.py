"""The outside world's work, held until a test (or a scenario's ``held.end`` step) ends it.

A ``Gate`` is one wait for the world's word: the stand-in of an outside call (the room's
deletion, a shutdown callback, the agent's ``on_simulation_end``, the end of a session's
close, the avatar provider's start) awaits ``gate.outcome()``; the test says how it ends
with ``gate.open(word)``. ``hang`` is a word too: the call then never ends.

``Held`` is the scenario runner's set of such calls: the ones ``config.hold`` names wait
for a ``held.end`` step, the others end at once, as they always did. The explorer's
harness holds every call with the same ``Gate``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

from agent_runtime.sdk.session_close import hold_session_close

HANG = "hang"  # the word that makes a held call never end
# the outside calls a scenario may hold (``config.hold``), and the words that end each
# (``held.end``'s ``result``): avatar_start's first word comes before the route is in
# (routed, no_route, error), its second after (ok, error)
RESULTS: dict[str, tuple[str, ...]] = {
    "session_close": ("ok", "error", HANG),
    "simulation_end": ("ok", "error", HANG),
    "room_deletion": ("ok", "error", HANG),
    "shutdown_callback": ("ok", "error", HANG),
    "avatar_start": ("routed", "no_route", "ok", "error", HANG),
}


class HeldCallError(RuntimeError):
    """A held outside call ended with ``error``."""


class Gate:
    """One wait for the world's word: ``await gate.wait()`` returns what ``open`` said."""

    def __init__(self) -> None:
        self._fut: asyncio.Future[str] | None = None
        self._hang: asyncio.Future[None] | None = None
        self.said: str | None = None

    @property
    def waiting(self) -> bool:
        return self._fut is not None and not self._fut.done()

    @property
    def hung(self) -> bool:
        return self.said == HANG

    async def wait(self) -> str:
        self._fut = asyncio.get_running_loop().create_future()
        self.said = None
        return await self._fut

    async def outcome(self) -> str:
        """The word ``open`` says; ``hang`` never returns."""
        word = await self.wait()
        if word == HANG:
            self._hang = asyncio.get_running_loop().create_future()
            await self._hang  # cancelled by release() only
        return word

    def open(self, word: str) -> None:
        if self._fut is None or self._fut.done():
            raise RuntimeError(f"nothing waits to be told {word!r}")
        self.said = word
        self._fut.set_result(word)

    def release(self, word: str) -> None:
        """The end of a test: a wait ends with ``word``, a hang is cancelled."""
        if self.waiting:
            self.open(word)
        if self._hang is not None and not self._hang.done():
            self._hang.cancel()


class Held:
    """The scenario's outside calls: each one ``hold`` names waits for its ``held.end``
    step; the rest end at once."""

    def __init__(self, hold: Collection[str]) -> None:
        self.hold = frozenset(hold)
        self.gates: dict[str, list[Gate]] = {}  # by call (session_close: by session too)

    def release(self) -> None:
        """The run is over: every wait ends (``ok``), every hang is cancelled, and a call
        from now on ends at once."""
        self.hold = frozenset()
        for gates in self.gates.values():
            for gate in gates:
                gate.release("ok")

    def held(self, call: str) -> bool:
        return call in self.hold

    async def call(self, call: str, key: str = "") -> None:
        """The stand-in's work: at once, or (held) once its ``held.end`` says so; an
        ``error`` raises ``HeldCallError``, a ``hang`` never returns."""
        if call not in self.hold:
            return
        gate = Gate()
        self.gates.setdefault(f"{call}:{key}" if key else call, []).append(gate)
        if await gate.outcome() == "error":
            raise HeldCallError(f"the scenario's {call} failed (held.end)")

    async def shutdown_callback(self) -> None:
        """The scenario's shutdown callback (registered when held)."""
        await self.call("shutdown_callback")

    def hold_close(self, session: Any, name: str) -> None:
        """The session's close does its work once ``held.end`` says ``ok``, when held;
        ``error``: its teardown raises, as a plugin's may (``hold_session_close``)."""
        if "session_close" in self.hold:
            hold_session_close(session, lambda: self.call("session_close", name))

    def end(self, call: str, result: str, key: str = "") -> None:
        """End the held call waiting now, or raise saying nothing waits."""
        gates = self.gates.get(f"{call}:{key}" if key else call, [])
        if call not in self.hold:
            raise RuntimeError(f"{call} is not held (config.hold)")
        if not gates or not gates[-1].waiting:
            waiting = sorted(
                k.partition(":")[2]
                for k, g in self.gates.items()
                if k.startswith(f"{call}:") and g and g[-1].waiting
            )
            if key and waiting:  # one waits, of another session: say which
                raise RuntimeError(
                    f"no {call} call of session {key!r} waits to be ended (one of "
                    f"{', '.join(map(repr, waiting))} does)"
                )
            raise RuntimeError(f"no {call} call waits to be ended")
        gates[-1].open(result)

    def hung(self, call: str, key: str = "") -> bool:
        gates = self.gates.get(f"{call}:{key}" if key else call, [])
        return bool(gates) and gates[-1].hung

    def stalled(self, session: str | None = None) -> bool:
        """A held call (``session``: that session's close) waits or hangs: the work behind
        it waits on the world, not on real work."""
        keys = self.gates if session is None else (f"session_close:{session}",)
        return any(g.waiting or g.hung for k in keys for g in self.gates.get(k, ()))

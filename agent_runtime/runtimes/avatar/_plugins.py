"""What the lifecycle asks of an avatar plugin: to be a livekit-agents ``AvatarSession``
whose ``start()`` takes the options given, and, on close, its participant removed."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from livekit import api, rtc
from livekit.agents import get_job_context
from livekit.agents.voice.agent_session import AgentSession
from livekit.agents.voice.avatar import AvatarSession

from agent_runtime.clock import Clock
from agent_runtime.observe.trace import describe
from agent_runtime.runtimes.avatar._attempts import Report
from agent_runtime.sdk import livekit_compat as lk

logger = logging.getLogger("agent_runtime.avatar")

RemoveParticipant = Callable[[str], Awaitable[object] | object]
Warn = Callable[..., None]  # logs a WARNING: (msg, *args)
REMOVAL_TIMEOUT = 5.0  # a server API that never answers must not hold the close
# the part of a close's budget the plugin's own aclose() may take; the avatar participant's
# removal comes after it, whether or not it returned, in the rest. Closing with the job,
# most of it (a provider's "end session" call is not cut short; the rest lets the removal
# begin while the room is connected); a failed attempt's (before a retry, or given up), half
# of join_timeout (the removal has to end within that state's own bound too)
PLUGIN_CLOSE_SHARE = 0.9
RETRY_CLOSE_SHARE = 0.5


class AvatarPluginError(TypeError):
    """The object given as an avatar plugin is not a livekit-agents ``AvatarSession``
    (or its ``start()`` cannot take the options given); the message names the plugin."""


def plugin_name(obj: object) -> str:
    """``module.Class`` of a plugin object, or the name of a class or factory of one."""
    if isinstance(obj, functools.partial):
        return plugin_name(obj.func)
    target = obj if isinstance(obj, type) or inspect.isroutine(obj) else type(obj)
    module = getattr(target, "__module__", None) or "?"
    return f"{module}.{getattr(target, '__qualname__', type(obj).__qualname__)}"


def check_plugin(avatar: object) -> None:
    """``AvatarPluginError`` naming the plugin unless it is an ``AvatarSession``."""
    if not isinstance(avatar, AvatarSession):
        raise AvatarPluginError(
            f"avatar plugin {plugin_name(avatar)} is not a livekit-agents AvatarSession "
            f"(livekit.agents.voice.avatar.AvatarSession); it cannot be run"
        )


def check_factory(factory: Callable[[], object]) -> None:
    """``AvatarPluginError`` naming the plugin when its factory cannot be called with no
    arguments, as the job calls it: a misspelt keyword in a ``functools.partial``, a plugin
    class given without the options it requires. That is the code's mistake, found before
    anything starts; what only the call can tell (a provider key missing in one deployment)
    stays a fault of the run."""
    func: Callable[..., object] = factory
    args: tuple[Any, ...] = ()
    keywords: dict[str, Any] = {}
    if isinstance(factory, functools.partial):
        func, args, keywords = factory.func, factory.args, factory.keywords
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return  # none to read (a builtin, an extension type): only its call can tell
    try:
        signature.bind(*args, **keywords)
    except TypeError as e:
        raise AvatarPluginError(
            f"avatar plugin {plugin_name(factory)} cannot be built from what was given ({e})"
        ) from None


def check_start_options(avatar: AvatarSession, options: Mapping[str, Any]) -> None:  # type: ignore[type-arg]
    """``AvatarPluginError`` unless the plugin's ``start()`` takes these keyword options."""
    if not options:
        return
    try:
        inspect.signature(avatar.start).bind(None, None, **options)
    except TypeError as e:
        raise AvatarPluginError(
            f"avatar plugin {plugin_name(avatar)}: its start() does not take "
            f"{', '.join(sorted(options))} ({e})"
        ) from None


def check_start_args(
    avatar: AvatarSession,  # type: ignore[type-arg]
    agent_session: object,
    room: object,
    adapter_room: rtc.Room | None,
    options: Mapping[str, Any],
) -> None:
    """What the lifecycle's ``start()`` is given: an ``AgentSession``, an ``rtc.Room`` (the
    one its room events adapter follows, if one was given), options the plugin's
    ``start()`` takes; refused before anything starts."""
    if not isinstance(agent_session, AgentSession):
        raise TypeError(f"agent_session must be an AgentSession, got {agent_session!r}")
    if not isinstance(room, rtc.Room):
        raise TypeError(f"room must be an rtc.Room, got {room!r}")
    if adapter_room is not None and adapter_room is not room:
        raise ValueError("room_events must be an adapter of the same room")
    check_start_options(avatar, options)


def server_api_remover(room: rtc.Room) -> RemoveParticipant:
    """Removes a participant of ``room`` through the LiveKit server API of the job this runs
    in (``get_job_context().api``, credentials from the job's environment), as the plugins'
    own ``aclose()`` does; outside a job, or in one with no server URL or keys (livekit's
    console), there is no server API to call, which is logged."""
    return _ServerApiRemover(room)


class _ServerApiRemover:
    """``server_api_remover``'s callable: slotted rather than a closure (one per job)."""

    __slots__ = ("_room",)

    def __init__(self, room: rtc.Room) -> None:
        self._room = room

    async def __call__(self, identity: str) -> None:
        ctx = get_job_context(required=False)
        if ctx is None:
            logger.info("avatar %s left in the room: no job context, no server API", identity)
            return
        try:
            server = ctx.api
        except ValueError as e:
            # no server URL or keys (livekit's console job): the plugin's own close has
            # warned of it already
            logger.debug("avatar %s left in the room: the job has no server API (%s)", identity, e)
            return
        await server.room.remove_participant(
            api.RoomParticipantIdentity(room=self._room.name, identity=identity)
        )


async def remove_avatar_participant(
    remove: RemoveParticipant | None,
    room: rtc.Room | None,
    avatar: AvatarSession[Any],
    clock: Clock,
    warn: Warn = logger.warning,
) -> None:
    """``remove(identity)`` of the plugin's avatar while the room is connected (the server
    API needs it), bounded, best effort: "not found" (the plugin removed it already) is
    fine, any other failure is logged. Asked whether or not the room still lists it: the
    server may know an avatar that is joining."""
    if remove is None or room is None or not room.isconnected():
        return
    identity = avatar.avatar_identity
    if identity == room.local_participant.identity:
        return  # an in-process avatar is the agent itself: never removed
    try:
        res = remove(identity)
        if inspect.isawaitable(res):
            await clock.wait_for(res, REMOVAL_TIMEOUT)
    except Exception as e:
        if getattr(e, "code", None) == "not_found":
            logger.debug("avatar %s was not in the room any more", identity)
        else:
            warn("could not remove the avatar participant %s: %s", identity, e)


def built_plugin(factory: Callable[[], AvatarSession[Any]]) -> AvatarSession[Any]:
    """A fresh plugin for a retry's attempt, from the factory the job was given (a plugin
    may not be restartable: runway reuses its first close's end-of-session task, so a
    second session on the same object is never ended). Raising, it is a failed start."""
    plugin = factory()
    check_plugin(plugin)
    return plugin


def warn_no_route(avatar: AvatarSession[Any], warn: Warn = logger.warning) -> None:
    warn(
        "the plugin's start() (%s) returned without installing an audio route; treating it "
        "as a failed start",
        plugin_name(avatar),
    )


async def stop_join_wait(avatar: AvatarSession[Any]) -> None:
    """Cancel the plugin base class's wait for its avatar to join, if it still runs."""
    join = lk.avatar_join_task(avatar)
    if join is not None:
        join.cancel()
        await asyncio.gather(join, return_exceptions=True)


class PluginCloser:
    """An attempt's close, as the lifecycle runs it: the plugin's own ``aclose()`` within
    its part of the close's budget (``PLUGIN_CLOSE_SHARE``, or ``RETRY_CLOSE_SHARE`` for a
    failed attempt's release or retirement), then, whether or not that returned, the avatar
    participant removed (never an avatar that is the agent itself).

    ``aclose()`` runs once per attempt (``begin()`` says one starts): a close asked while
    it runs, or after it ended, waits for that one rather than calling it again (a
    published plugin forgets its provider session before its "end session" call: a second
    call ends nothing). A failed attempt's close runs as a task of this closer's, which
    its state's end does not cut: the job's close waits for it, within its own share, and
    cuts it there at the latest, so nothing outlives the job. The job's usual close (none
    under way) runs it in the close's own task."""

    __slots__ = ("_clock", "_closing", "_remove", "_report", "plugin")

    def __init__(
        self,
        avatar: AvatarSession[Any],
        remove: RemoveParticipant | None,
        clock: Clock,
        report: Report | None = None,
    ) -> None:
        """``report``: the machine's (``Actor.report``), so that each line, the traceback's
        too, names the job and the machine."""
        self.plugin, self._remove, self._clock = avatar, remove, clock  # the current attempt's
        self._report = report
        # the current attempt's aclose(), once a close asked for it (None: not yet)
        self._closing: asyncio.Future[None] | None = None

    def begin(self) -> None:
        """A new attempt starts (the plugin's ``start()`` again): its close is its own. The
        last one's has ended: its release waited for it, cutting it within its bound (one
        still finishing after that cut, a plugin slow to take it, is cut again here)."""
        self.cut()
        self._closing = None

    def cut(self) -> asyncio.Future[None] | None:
        """The machine is let go at once (``release_now``): an ``aclose()`` still running
        is cut, so nothing of an attempt outlives it; returned, to be waited for (a plugin
        may clean up when cut). The job's close has waited for it within its share."""
        closing = self._closing
        if closing is None or closing.done():
            return None
        closing.cancel()
        return closing

    async def close(self, budget: float) -> None:
        """The job's close: the attempt's ``aclose()`` (a failed attempt's close still
        running, or a new one) waited for within its share of ``budget`` seconds, cut there
        (logged); cancelled, it cuts that ``aclose()`` too."""
        bound = PLUGIN_CLOSE_SHARE * budget
        if self._closing is not None:
            await self._wait(self._closing, bound, "", cuts=True)
            return
        # none under way (the usual close): run in the close's own task, no task of its
        # own, marked as this attempt's close for any close asked after it
        ran = self._closing = asyncio.get_running_loop().create_future()
        try:
            await self._clock.wait_for(self._run(""), bound)
        except TimeoutError:
            self._warn_cut(bound, "")
        finally:
            if not ran.done():
                ran.set_result(None)

    async def close_attempt(self, budget: float, when: str) -> None:
        """``close`` for a failed attempt's release (before a retry, or given up): within
        half of ``budget`` (the state's bound), cut there; cancelled (its state left), it
        leaves the ``aclose()`` running. ``when`` says which in a warning."""
        await self._wait(self._aclose(when), RETRY_CLOSE_SHARE * budget, when, cuts=False)

    async def remove(self, room: rtc.Room | None, *, in_process: bool) -> None:
        """After the plugin's own close (in case it did not, or could not: spatialreal drops
        its room first, a hung one was cut)."""
        if not in_process:
            await remove_avatar_participant(
                self._remove, room, self.plugin, self._clock, self._warn
            )

    def _aclose(self, when: str) -> asyncio.Future[None]:
        """The attempt's ``aclose()``: started by the first close asked (``when`` names it
        in a warning), the same task for every close after."""
        if self._closing is None:
            name = f"avatar plugin {plugin_name(self.plugin)}: aclose(){when}"
            self._closing = asyncio.get_running_loop().create_task(self._run(when), name=name)
        return self._closing

    async def _run(self, when: str) -> None:
        """The plugin's own ``aclose()``: a failure or a ``CancelledError`` it raised itself
        (nothing cancelled it) is logged by ``warn``, a WARNING naming its cause as a failed
        start's is (its traceback at DEBUG), never raised; a cut goes on up."""
        name = plugin_name(self.plugin)
        try:
            await self.plugin.aclose()
        except asyncio.CancelledError as e:
            me = asyncio.current_task()
            if me is None or me.cancelling():
                raise
            self._warn(
                "avatar plugin %s: aclose() raised CancelledError%s (nothing cancelled it)",
                name,
                when,
            )
            self._say(
                logging.DEBUG, "avatar plugin %s: aclose()'s CancelledError", name, exc_info=e
            )
        except Exception as e:
            # a provider's failure, as a failed start is: one line with its cause
            self._warn("avatar plugin %s: aclose() failed%s (%s)", name, when, describe(e))
            self._say(logging.DEBUG, "avatar plugin %s: aclose()'s failure", name, exc_info=e)

    async def _wait(
        self, task: asyncio.Future[None], bound: float, when: str, *, cuts: bool
    ) -> None:
        """Until ``task`` (the attempt's ``aclose()``) has ended, cut after ``bound`` seconds
        (a WARNING). A cancellation of the caller's goes on up, cutting ``task`` only if
        ``cuts``; at once if it has ended (returned, failed or cut)."""
        if task.done():
            return
        try:
            await self._clock.wait_for(task if cuts else asyncio.shield(task), bound)
        except TimeoutError:
            self._warn_cut(bound, when)
            if not task.done():  # a shielded wait left it running
                task.cancel()
                await asyncio.wait([task])
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is None or me.cancelling():
                raise
            # nothing cancelled this wait: another close's bound cut the task (logged there)

    def _warn_cut(self, bound: float, when: str) -> None:
        name = plugin_name(self.plugin)
        self._warn("avatar plugin %s: aclose() did not return within %gs%s; cut", name, bound, when)

    def _warn(self, msg: str, *args: Any) -> None:
        self._say(logging.WARNING, msg, *args)

    def _say(self, level: int, msg: str, *args: Any, exc_info: BaseException | None = None) -> None:
        if self._report is not None:
            self._report(logger, level, msg, *args, exc_info=exc_info)
        else:
            logger.log(level, msg, *args, exc_info=exc_info)

"""``RoomDeletion``: the job's room deletion, driven by the ``room_deletion`` machine.

Built beside the job machine (by ``JobSystem``, or by ``JobRuntime`` alone): anyone may ask
for the deletion (``request``), the job's ``closing`` work allows it (``allow``) once the
hold is over and the room work is done, and it then runs once, bounded by
``close_timeout``. See ``statemachines.room_deletion``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from livekit import rtc

from agent_runtime._messages import Reported
from agent_runtime.actor import Event, effect_table
from agent_runtime.clock import AsyncioClock, Clock
from agent_runtime.observe.trace import Tracer
from agent_runtime.runtimes._base import Hear, MachineRuntime, released
from agent_runtime.runtimes.routing import Wiring
from agent_runtime.scheduler import Scheduler
from statemachines.room_deletion import ROOM_DELETION

logger = logging.getLogger("agent_runtime.room_deletion")

DeleteRoomFn = Callable[[], Awaitable[Any]]


class RoomDeletion(MachineRuntime[str]):
    """One job's room deletion. Built by a job, its ``owner`` (the job) hears the machine
    itself; alone, its own ``state_changed`` listeners do."""

    def __init__(
        self,
        delete_room: DeleteRoomFn,
        *,
        close_timeout: float = 10.0,
        clock: Clock | None = None,
        tracer: Tracer | None = None,
        scheduler: Scheduler | None = None,
        instance: str = "",
        owner: Hear | None = None,
        wiring: Wiring | None = None,
    ) -> None:
        super().__init__()
        self._delete_room = delete_room
        self._clock: Clock = clock or AsyncioClock()
        self._close_timeout = close_timeout
        self._deleted_at: float | None = None
        self._run_machine(
            ROOM_DELETION,
            _EFFECTS,
            instance=instance,
            clock=self._clock,
            tracer=tracer,
            scheduler=scheduler,
            hear=owner,  # its owner (the job) hears the actor itself: nothing to add
            wiring=wiring,  # the job's: a wiring of its own would be one more per job
        )

    def _timeouts(self) -> Mapping[str, float | None]:
        return {"close_timeout": self._close_timeout}

    @property
    def deleted_at(self) -> float | None:
        """When the server call succeeded, or ``None``."""
        return self._deleted_at

    def request(self) -> None:
        """Ask for the deletion; it runs once the job allows it (at once if it did)."""
        self.post(Event("request"))

    def post(self, event: Event) -> None:
        """An event for the machine (``request``, ``allow``), unless it is released."""
        self._post(event)

    async def allow(self) -> None:
        """The job's room work is done: let an asked deletion run, and wait for it (it is
        bounded by ``close_timeout``)."""
        self.post(Event("allow"))
        await self.settled()

    async def settled(self) -> None:
        """Wait until what was posted is handled and no deletion runs (it is bounded)."""
        await released(self.when_settled())

    def when_settled(self) -> asyncio.Future[None] | None:
        """``settled()`` as a future, or None when it is so now."""
        return self.actor.when_settled(_not_deleting)

    async def aclose(self) -> None:
        """Release: a deletion under way runs to its end or its bound first."""
        if not self.actor.closed:
            self.actor.post(Event("close"))
            await self.actor.until(lambda state: ROOM_DELETION.state(state).final)
        await self.actor.aclose()

    # -- effects ---------------------------------------------------------------------------
    async def _fx_delete_room(self, _ev: Event) -> Event:
        try:
            await self._delete_room()
        except Exception as e:
            raise Reported(e) from e  # report_failure's line is the operator's, once
        return Event("delete_done")

    def _fx_record_deleted(self, _ev: Event) -> None:
        self._deleted_at = self._clock.now()

    def _fx_report_failure(self, ev: Event) -> None:
        detail = ev.data.get("detail", "")
        self.actor.report(
            logger, logging.WARNING, "deleting the room failed: %s", detail, event=ev.name
        )

    def _fx_report_cut(self, ev: Event) -> None:
        self.actor.report(
            logger,
            logging.WARNING,
            "deleting the room was cut off after %gs (close_timeout): the server did not answer",
            ev.data.get("after", self._close_timeout),
            event=ev.name,
        )

    def _fx_report_never_allowed(self, ev: Event) -> None:
        self.actor.report(
            logger,
            logging.WARNING,
            "room deletion was asked for, but the job closed before its room work was done; "
            "the room is left as it is",
            event=ev.name,
        )


# the room_deletion machine's handlers, shared by every instance (Handlers binds them)
_EFFECTS = effect_table(RoomDeletion, ROOM_DELETION)


def room_deletion_for(
    room: rtc.Room,
    delete_room: DeleteRoomFn | None,
    *,
    close_timeout: float,
    clock: Clock,
    tracer: Tracer | None,
    scheduler: Scheduler | None,
    owner: Hear,
    wiring: Wiring,
) -> RoomDeletion:
    """The room's deletion, through ``delete_room`` or the server API."""
    return RoomDeletion(
        delete_room or _ServerApiDeleter(room),
        close_timeout=close_timeout,
        clock=clock,
        tracer=tracer,
        scheduler=scheduler,
        instance=room.name or "job",
        owner=owner,
        wiring=wiring,
    )


class _ServerApiDeleter:
    """Delete through the server API with credentials from the environment (as a job does).
    A slotted callable rather than a closure: one is held per job."""

    __slots__ = ("_room",)

    def __init__(self, room: rtc.Room) -> None:
        self._room = room

    async def __call__(self) -> None:
        from livekit import api

        async with api.LiveKitAPI() as lkapi:
            await lkapi.room.delete_room(api.DeleteRoomRequest(room=self._room.name))


def _not_deleting(state: str) -> bool:
    return state != "deleting"

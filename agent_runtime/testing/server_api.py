"""``ctx.api`` under the testing kit: the job's calls on its own room, answered by the test's.

livekit's ``JobContext.api`` is a server client built from ``LIVEKIT_URL`` and the keys in
the environment; livekit's ``AvatarSession.aclose()`` removes its avatar participant
through it. In a test that reached whatever server the developer's environment named (or
logged "url must be set" with a traceback): the kit has no server, so what a job asks of its
own room is answered on the test's room, and anything else is an ``AttributeError`` saying
so, never a request. ``KitServer`` is that server: the room's deletion and the avatar's
removal, whoever asks (``AgentJob``, ``ctx.delete_room``, ``ctx.api``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from livekit import api, rtc

from agent_runtime.clock import Clock
from agent_runtime.testing.inmemory import InMemoryRoom

_NO_SERVER = "the testing kit has no LiveKit server"


class KitRoomService:
    """``ctx.api.room``: ``remove_participant`` and ``delete_room`` on the test's room."""

    def __init__(
        self,
        room_name: str,
        remove: Callable[[str], Awaitable[None]],
        delete: Callable[[str | None], Awaitable[Any]],
    ) -> None:
        self._room_name, self._remove, self._delete = room_name, remove, delete

    async def remove_participant(
        self, req: api.RoomParticipantIdentity
    ) -> api.RemoveParticipantResponse:
        if req.room == self._room_name:  # another room is none of the test's
            await self._remove(req.identity)
        return api.RemoveParticipantResponse()

    async def delete_room(self, req: api.DeleteRoomRequest) -> api.DeleteRoomResponse:
        await self._delete(req.room)
        return api.DeleteRoomResponse()

    def __getattr__(self, name: str) -> NoReturn:
        raise AttributeError(
            f"ctx.api.room.{name}: {_NO_SERVER}; it answers remove_participant and "
            "delete_room on the test's room"
        )


class KitServerApi:
    """``ctx.api``: its ``room`` service only."""

    def __init__(self, room: KitRoomService) -> None:
        self.room = room

    def __getattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"ctx.api.{name}: {_NO_SERVER}; it answers ctx.api.room only")


class KitServer:
    """What the server does with the job's calls on its own room (the test's ``room``):
    the room's deletion (``AgentJob``'s, ``ctx.delete_room``'s, ``ctx.api``'s) and the
    avatar participant's removal, on the test's clock."""

    def __init__(self, room: InMemoryRoom, clock: Clock) -> None:
        self.room = room
        self.clock = clock

    def api(self) -> KitServerApi:
        """``ctx.api``, answered here."""
        return KitServerApi(
            KitRoomService(self.room.name, self.remove_avatar, self.ctx_delete_room)
        )

    async def delete_room(self) -> None:
        """The server API call, as the server answers it: the room is deleted and everyone
        in it disconnected (reason ``ROOM_DELETED``). The agent hears only its own room's
        ``disconnected``, as a real room's SDK does (its listener ends there), and the job
        ends as livekit's job process ends one whose room disconnected. A room deleted
        already is no room to delete (the server's ``NOT_FOUND``, which livekit ignores)."""
        if self.room.deleted_at is not None:
            return
        self.room.deleted_at = self.clock.now()
        self.room.disconnect_locally(rtc.DisconnectReason.ROOM_DELETED)

    def ctx_delete_room(self, room_name: str | None = None) -> asyncio.Future[Any]:
        """``JobContext.delete_room`` as the server would answer it: the test's room
        deleted, and disconnected if it still was connected (another room's name is no room
        of the test's: nothing to record)."""
        if room_name not in (None, self.room.name):
            done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        return asyncio.ensure_future(self.delete_room())

    async def remove_avatar(self, identity: str) -> None:
        """The avatar participant removed from the test's room (reason
        ``PARTICIPANT_REMOVED``), if it is there."""
        if identity in self.room.remote_participants:  # the server's "not found" is fine
            self.room.remove_participant(identity, rtc.DisconnectReason.PARTICIPANT_REMOVED)

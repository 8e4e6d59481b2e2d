"""``ctx.api`` under the testing kit: the job's calls on its own room, answered by the test's.

livekit's ``JobContext.api`` is a server client built from ``LIVEKIT_URL`` and the keys in
the environment; livekit's ``AvatarSession.aclose()`` removes its avatar participant
through it. In a test that reached whatever server the developer's environment named (or
logged "url must be set" with a traceback): the kit has no server, so what a job asks of its
own room is answered on the test's room, and anything else is an ``AttributeError`` saying
so, never a request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from livekit import api

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

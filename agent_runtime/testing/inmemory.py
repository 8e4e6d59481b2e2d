"""The embedded in-memory room: a real ``rtc.Room`` with no connection, plus a stand-in for
the one thing that needs a network, the local participant's signalling (RPCs, byte streams,
track publication).

Room events are the SDK's own: ``rtc.Room.emit`` with real ``RemoteParticipant`` and
``RemoteTrackPublication`` objects built from their protobuf infos, in the argument orders
the Python SDK uses (``track_muted`` is ``(participant, publication)``). Outgoing RPCs end
as scripted (``ok``, ``timeout``, ``error``) on the injected clock; incoming ones call the
handlers registered with ``register_rpc_method``.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
from collections.abc import Awaitable, Mapping
from typing import Any

from livekit import rtc

from agent_runtime import settings
from agent_runtime.clock import AsyncioClock, Clock
from agent_runtime.parts import check_part
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.sdk.livekit_compat import participant_pb2, room_pb2, track_pb2
from agent_runtime.testing.inmemory_participant import (
    RPC_ROUND_TRIP_BUDGET,
    InMemoryLocalParticipant,
    InMemoryStream,
    RpcCall,
)
from agent_runtime.testing.inmemory_transport import InMemorySessionTransport
from agent_runtime.testing.sdk_logs import quiet_sdk_logs, sdk_task_failures_at_debug

# the local participant, the session transport and the SDK's logs have modules of their own;
# their names stay here too, where users import them
__all__ = [
    "PARTICIPANT_KINDS",
    "RPC_ROUND_TRIP_BUDGET",
    "TRACK_KINDS",
    "InMemoryLocalParticipant",
    "InMemoryRoom",
    "InMemorySessionTransport",
    "InMemoryStream",
    "NotInRoom",
    "RpcCall",
    "quiet_sdk_logs",
    "sdk_task_failures_at_debug",
    "stranger",
    "stranger_track",
]

# every rtc.ParticipantKind the SDK knows, by the names settings derives from the enum
PARTICIPANT_KINDS: dict[str, int] = {
    name: participant_pb2.ParticipantKind.Value(f"PARTICIPANT_KIND_{name.upper()}")
    for name in settings.PARTICIPANT_KINDS
}
TRACK_KINDS: dict[str, int] = {
    "audio": track_pb2.TrackKind.KIND_AUDIO,
    "video": track_pb2.TrackKind.KIND_VIDEO,
}


class NotInRoom(KeyError):
    """Who a test named is not in the room (a ``KeyError``, with a message saying who is)."""

    __str__ = BaseException.__str__  # not KeyError's, which quotes the message


class InMemoryRoom(rtc.Room):
    """An unconnected ``rtc.Room`` that a test or the scenario runner drives like the SFU."""

    def __init__(
        self, *, name: str = "room", agent_identity: str = "agent", clock: Clock | None = None
    ) -> None:
        super().__init__()  # first: a room refused below is still one rtc.Room can delete
        for what, value in (("name", name), ("agent_identity", agent_identity)):
            if not isinstance(value, str):
                raise TypeError(f"InMemoryRoom: {what} must be a str, not {type(value).__name__}")
        check_part("clock", clock)
        self.clock: Clock = clock or AsyncioClock()
        self._local = InMemoryLocalParticipant(self, agent_identity)
        lk.set_room_info(self, room_pb2.RoomInfo(name=name))
        self._sids = itertools.count(1)
        self.deleted_at: float | None = None
        self._delivery: contextvars.Context | None = None

    def deliver_in(self, context: contextvars.Context | None) -> None:
        """Emit the room's events in (a copy of) ``context``, or, given None, in the
        caller's. A real room's events come from its own task, one of the job's; this
        room's come from the test's call, so the kit delivers them in the job's context
        (what its handlers start is the job's)."""
        self._delivery = context

    def emit(self, event: Any, *args: Any) -> None:
        if self._delivery is None:
            super().emit(event, *args)
        else:
            self._delivery.copy().run(super().emit, event, *args)

    # the network side the SDK would give us after connect()
    @property
    def local_participant(self) -> Any:  # an InMemoryLocalParticipant standing in
        return self._local

    def isconnected(self) -> bool:
        return self.connection_state != rtc.ConnectionState.CONN_DISCONNECTED

    # -- what the SFU would do -------------------------------------------------------------
    def connect(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("InMemoryRoom has no server; use connect_locally()")

    def connect_locally(self) -> None:
        if self.isconnected():
            return
        self._set_state(rtc.ConnectionState.CONN_CONNECTED)
        self.emit("connected")

    def reconnect_locally(self) -> None:
        """A network blip, as the SDK reports one: reconnecting, then connected again."""
        if not self.isconnected():
            return
        self._set_state(rtc.ConnectionState.CONN_RECONNECTING)
        self.emit("reconnecting")
        self._set_state(rtc.ConnectionState.CONN_CONNECTED)
        self.emit("reconnected")

    def disconnect_locally(self, reason: int = rtc.DisconnectReason.CLIENT_INITIATED) -> None:
        if not self.isconnected():
            return
        self._set_state(rtc.ConnectionState.CONN_DISCONNECTED)
        self.emit("disconnected", reason)

    def _set_state(self, state: rtc.ConnectionState.ValueType) -> None:
        lk.set_connection_state(self, state)
        self.emit("connection_state_changed", state)

    async def disconnect(self, *, reason: Any = rtc.DisconnectReason.CLIENT_INITIATED) -> None:
        self.disconnect_locally(reason)

    def add_participant(
        self,
        identity: str,
        *,
        kind: str = "standard",
        attributes: Mapping[str, str] | None = None,
    ) -> rtc.RemoteParticipant:
        if not isinstance(identity, str) or not identity:
            error = ValueError if isinstance(identity, str) else TypeError
            raise error(f"identity must be a non-empty string, not {identity!r}")
        if identity in self.remote_participants:  # the SFU never lists an identity twice
            raise ValueError(f"{identity!r} is already in the room (a rejoin: remove, then add)")
        if kind not in PARTICIPANT_KINDS:
            raise ValueError(f"unknown participant kind {kind!r}: one of {list(PARTICIPANT_KINDS)}")
        attrs = dict(attributes or {}) if isinstance(attributes, Mapping | None) else None
        if attrs is None or not all(isinstance(x, str) for kv in attrs.items() for x in kv):
            raise TypeError(f"attributes must map strings to strings, not {attributes!r}")
        info = participant_pb2.ParticipantInfo(
            identity=identity,
            sid=f"PA_{next(self._sids)}",
            kind=PARTICIPANT_KINDS[kind],  # type: ignore[arg-type]
            attributes=attrs,
        )
        p = rtc.RemoteParticipant(participant_pb2.OwnedParticipant(info=info))
        lk.room_participants(self)[identity] = p
        self.emit("participant_connected", p)
        # the SFU then reports it active (the SDK's wait_for_participant waits for that)
        lk.participant_info(p).state = participant_pb2.ParticipantState.PARTICIPANT_STATE_ACTIVE
        self.emit("participant_active", p)
        return p

    def remove_participant(
        self, identity: str, reason: int = rtc.DisconnectReason.CLIENT_INITIATED
    ) -> rtc.RemoteParticipant:
        p = self.participant(identity, "remove_participant")
        if isinstance(reason, bool) or reason not in rtc.DisconnectReason.values():
            raise ValueError(f"remove_participant: {reason!r} is no rtc.DisconnectReason value")
        del lk.room_participants(self)[identity]
        lk.participant_info(p).disconnect_reason = reason  # type: ignore[assignment]
        self.emit("participant_disconnected", p)
        return p

    def participant(self, identity: str, doing: str = "participant") -> rtc.RemoteParticipant:
        """The participant ``identity`` in the room, or ``NotInRoom`` saying who is."""
        if (p := self.remote_participants.get(identity)) is None:
            here = ", ".join(map(repr, self.remote_participants)) or "nobody"
            raise NotInRoom(f"{doing}: {identity!r} is not in the room (in the room: {here})")
        return p

    def publish_track(self, identity: str, kind: str = "audio") -> rtc.RemoteTrackPublication:
        p = self.participant(identity, "publish_track")
        if kind not in TRACK_KINDS:
            raise ValueError(f"unknown track kind {kind!r}: audio or video")
        sid = f"TR_{next(self._sids)}"
        pub = rtc.RemoteTrackPublication(
            track_pb2.OwnedTrackPublication(
                info=track_pb2.TrackPublicationInfo(sid=sid, kind=TRACK_KINDS[kind], name=kind)  # type: ignore[arg-type]
            )
        )
        lk.participant_publications(p)[sid] = pub
        self.emit("track_published", pub, p)
        return pub

    def mute_track(self, identity: str, *, muted: bool = True) -> None:
        p = self.participant(identity, "mute_track")
        for pub in p.track_publications.values():
            lk.publication_info(pub).muted = muted
            # the Python SDK's order: (participant, publication)
            self.emit("track_muted" if muted else "track_unmuted", p, pub)

    def set_participant_attributes(self, identity: str, attributes: Mapping[str, str]) -> None:
        p = self.participant(identity, "set_participant_attributes")
        changed = dict(attributes)
        lk.participant_info(p).attributes.update(changed)
        self.emit("participant_attributes_changed", changed, p)

    async def invoke_rpc(self, method: str, caller: str, payload: str) -> str:
        """An incoming RPC from ``caller``; returns the handler's reply or raises ``RpcError``."""
        handler = self._local.rpc_handlers.get(method)
        if handler is None:
            raise rtc.RpcError(rtc.RpcError.ErrorCode.UNSUPPORTED_METHOD, "Method not supported")
        data = rtc.RpcInvocationData(
            request_id=f"RQ_{next(self._sids)}",
            caller_identity=caller,
            payload=payload,
            response_timeout=10.0,
            method=method,
        )
        try:
            res = handler(data)
            if asyncio.iscoroutine(res) or isinstance(res, Awaitable):
                res = await res
        except rtc.RpcError:
            raise
        except Exception as e:
            raise rtc.RpcError(rtc.RpcError.ErrorCode.APPLICATION_ERROR, str(e)) from e
        return str(res or "")

    def listener_count(self) -> int:
        """Callbacks registered on the room (tests check nothing is left after close)."""
        return sum(len(v) for v in lk.listeners(self).values())


def stranger(identity: str) -> rtc.RemoteParticipant:
    """A participant the room never had (the SFU never reports one; a scenario may)."""
    info = lk.participant_pb2.ParticipantInfo(identity=identity, sid="PA_unknown")
    return rtc.RemoteParticipant(lk.participant_pb2.OwnedParticipant(info=info))


def stranger_track(kind: str) -> rtc.RemoteTrackPublication:
    pb = lk.track_pb2
    k = pb.TrackKind.KIND_VIDEO if kind == "video" else pb.TrackKind.KIND_AUDIO
    info = pb.TrackPublicationInfo(sid="TR_unknown", kind=k)
    return rtc.RemoteTrackPublication(pb.OwnedTrackPublication(info=info))

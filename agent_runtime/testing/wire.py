"""Session requests as a simulator puts them on the wire, for tests and scenario files.

``build_request`` turns a request kind and a payload mapping into the real protobuf
``SessionRequest``; a value of the wrong type is encoded with its own wire type, as a buggy
client would send it, so the host sees exactly what a real malformed message looks like.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from google.protobuf import descriptor, json_format, message_factory
from google.protobuf import message as pb_message
from livekit.protocol.agent_pb import agent_session as agent_pb

REQUEST_KINDS = frozenset(
    f.name for f in agent_pb.SessionRequest.DESCRIPTOR.oneofs_by_name["request"].fields
)
# a request kind this agent has no name for is sent on a field number the protocol does not
# use, which is how a newer simulator's request arrives at an older agent
_UNKNOWN_KIND_FIELD = 999


def build_request(
    kind: str, payload: Mapping[str, Any] | None = None, *, request_id: str
) -> agent_pb.SessionRequest:
    """A ``SessionRequest`` as a simulator would put it on the wire, from a kind name and a
    payload mapping (scenario files, tests).

    Fields of the right type are set normally. A field given a value of another type is
    encoded with that value's wire type, as a buggy client would send it, so the host sees
    the same malformed message a real one would. A kind this agent does not know goes on a
    field number it has no name for. A payload key that is not a field of ``kind`` raises
    ``ValueError``.
    """
    if not isinstance(kind, str) or not kind:
        raise ValueError("a session request needs a kind name")
    payload = dict(payload or {})
    base = agent_pb.SessionRequest(request_id=request_id).SerializeToString()
    if kind not in REQUEST_KINDS:
        if payload:
            raise ValueError(f"unknown request kind {kind!r} cannot carry a payload")
        body = b""
        number = _UNKNOWN_KIND_FIELD
    else:
        field = agent_pb.SessionRequest.DESCRIPTOR.fields_by_name[kind]
        msg_type = field.message_type
        assert msg_type is not None  # every request kind is a message
        holder = agent_pb.SessionRequest()
        sub = getattr(holder, kind)
        raw = b""
        for key, value in payload.items():
            f = msg_type.fields_by_name.get(key)
            if f is None:
                names = ", ".join(msg_type.fields_by_name) or "none"
                raise ValueError(f"{kind} has no field {key!r} (fields: {names})")
            if _fits(f, value):
                if f.type == descriptor.FieldDescriptor.TYPE_MESSAGE:
                    json_format.ParseDict(dict(value), getattr(sub, key))
                else:
                    setattr(sub, key, value)
            else:
                raw += _encode_raw(f.number, value, f"{kind}.{key}")
        body = sub.SerializeToString() + raw
        number = field.number
    data = base + _tag(number, 2) + _varint(len(body)) + body
    req = agent_pb.SessionRequest()
    req.ParseFromString(data)
    return req


def _fits(f: Any, value: Any) -> bool:
    t = descriptor.FieldDescriptor
    if f.type == t.TYPE_BOOL:
        return isinstance(value, bool)
    if f.type == t.TYPE_STRING:
        return isinstance(value, str)
    if f.type in (t.TYPE_FLOAT, t.TYPE_DOUBLE):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if f.type == t.TYPE_MESSAGE:
        if not isinstance(value, Mapping):
            return False
        try:
            json_format.ParseDict(dict(value), _sub_message(f))
        except json_format.ParseError:
            return False
        return True
    return isinstance(value, int) and not isinstance(value, bool)


def _sub_message(f: Any) -> pb_message.Message:
    assert f.message_type is not None
    return message_factory.GetMessageClass(f.message_type)()


def _encode_raw(number: int, value: Any, where: str) -> bytes:
    if isinstance(value, bool | int):
        return _tag(number, 0) + _varint(int(value) & (2**64 - 1))
    if isinstance(value, float):
        return _tag(number, 1) + struct.pack("<d", value)
    if isinstance(value, str | bytes):
        b = value.encode() if isinstance(value, str) else value
        return _tag(number, 2) + _varint(len(b)) + b
    raise ValueError(f"{where}: cannot put a {type(value).__name__} on the wire")


def _tag(number: int, wire_type: int) -> bytes:
    return _varint((number << 3) | wire_type)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)

"""The glue between the machines, defined once: what the runtime decides by.

Pure (no livekit, no I/O, no clock). Two kinds of declaration (the links between the
machines are ``statemachines.links``):

* **guards**: every guard of every spec, as a function of a small facts view of its machine
  (a ``Protocol`` below) and of the event's data. The runtimes evaluate them on facts read
  from live objects. ``GUARDS`` lists them by machine (a test keeps it equal to the
  specs' guards).
* **room conditions**: the named conditions of ``statemachines.routing``'s routes, as
  functions of the fact and of what the job knew just before it (``ROOM_CONDITIONS``), and
  how that knowledge follows the facts (``simulators_after``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from .avatar import PLUGIN_CLEARS
from .system import watched

# livekit's participant attributes (livekit.agents.types; a test pins the values)
SIMULATOR_ATTRIBUTE = "lk.simulator"
PUBLISH_ON_BEHALF = "lk.publish_on_behalf"
# livekit-agents' defaults (job.DEFAULT_PARTICIPANT_KINDS, room_io's closing reasons), as
# rtc.ParticipantKind and rtc.DisconnectReason names
DEFAULT_PARTICIPANT_KINDS: tuple[str, ...] = ("connector", "sip", "standard")
DEFAULT_CLOSING_REASONS: tuple[str, ...] = ("CLIENT_INITIATED", "ROOM_DELETED", "USER_REJECTED")

EventData = Mapping[str, Any]
EMPTY: EventData = MappingProxyType({})


# -- job ----------------------------------------------------------------------------------------


class JobFacts(Protocol):
    @property
    def is_simulation(self) -> bool: ...
    @property
    def simulator_present(self) -> bool: ...  # a participant carries lk.simulator
    @property
    def room_connected(self) -> bool: ...
    @property
    def finalize_answered(self) -> bool: ...


def hold_needed(f: JobFacts, data: EventData = EMPTY) -> bool:
    """Shutdown holds for the simulator: a simulation, a simulator present, the room
    connected and no finalize answered yet."""
    return f.is_simulation and f.simulator_present and f.room_connected and not f.finalize_answered


# -- participant --------------------------------------------------------------------------------


class ParticipantFacts(Protocol):
    @property
    def participant_identity(self) -> str | None: ...  # the configured one, if any
    @property
    def participant_kinds(self) -> frozenset[str]: ...
    @property
    def agent_identity(self) -> str | None: ...  # the agent's own (local) identity
    @property
    def linked_identity(self) -> str | None: ...
    @property
    def close_on_disconnect(self) -> bool: ...
    @property
    def closing_reasons(self) -> frozenset[str]: ...
    @property
    def grace_period(self) -> float: ...


def eligible(f: ParticipantFacts, data: EventData) -> bool:
    """The joining participant may be linked: the configured identity (or any, when none is
    configured), an allowed kind, not publishing on the agent's behalf (an avatar worker)."""
    identity = data.get("identity")
    if not isinstance(identity, str) or not identity:
        return False
    if f.participant_identity is not None and identity != f.participant_identity:
        return False
    if data.get("kind") not in f.participant_kinds:
        return False
    attributes = data.get("attributes") or {}
    agent = f.agent_identity
    return not (
        agent is not None
        and isinstance(attributes, Mapping)
        and attributes.get(PUBLISH_ON_BEHALF) == agent
    )


def is_linked(f: ParticipantFacts, data: EventData) -> bool:
    """The event is about the identity the link follows."""
    return f.linked_identity is not None and data.get("identity") == f.linked_identity


def closing_reason(f: ParticipantFacts, data: EventData) -> bool:
    """A departure that closes at once: close_on_disconnect on, and a closing reason."""
    return f.close_on_disconnect and data.get("reason") in f.closing_reasons


def grace_enabled(f: ParticipantFacts, data: EventData) -> bool:
    """Another departure waits for a rejoin: a grace period, or close_on_disconnect off
    (then grace has no timer: a departure never closes)."""
    return not f.close_on_disconnect or f.grace_period > 0


# -- session host -------------------------------------------------------------------------------


class HostFacts(Protocol):
    @property
    def attached_session(self) -> str | None: ...  # the attached session's label

    def is_simulator(self, identity: str) -> bool | None:
        """Whether ``identity`` carries lk.simulator; ``None``: the host cannot tell."""
        ...


def is_current(f: HostFacts, data: EventData) -> bool:
    """The event's session is the attached one."""
    return f.attached_session is not None and data.get("session") == f.attached_session


def from_simulator(f: HostFacts, data: EventData) -> bool:
    """The request's sender carries lk.simulator (a host that cannot tell answers)."""
    caller = data.get("caller")
    name = caller if isinstance(caller, str) else ""
    verdict = f.is_simulator(name)
    return True if verdict is None else bool(name) and verdict


# -- finalize -----------------------------------------------------------------------------------


class FinalizeFacts(Protocol):
    @property
    def is_simulation(self) -> bool: ...


def simulation(f: FinalizeFacts, data: EventData) -> bool:
    """The job is a simulation."""
    return f.is_simulation


# -- avatar -------------------------------------------------------------------------------------


class RetryPolicy(Protocol):
    @property
    def attempts(self) -> int: ...
    @property
    def transient(self) -> frozenset[str]: ...
    @property
    def rejoin(self) -> bool: ...


class AvatarFacts(Protocol):
    @property
    def avatar_present(self) -> bool: ...
    @property
    def avatar_has_video(self) -> bool: ...
    @property
    def plugin_clear_in_flight(self) -> bool: ...  # the plugin's own clear holds its sink
    @property
    def agent_speaking(self) -> bool: ...  # the session's agent state is speaking
    @property
    def route_recorded(self) -> bool: ...  # the sink the plugin installed is known
    @property
    def attempts(self) -> int: ...  # restarts made so far
    @property
    def last_cause(self) -> str: ...  # what ended the last attempt
    @property
    def retry(self) -> RetryPolicy: ...


def has_video(f: AvatarFacts, data: EventData) -> bool:
    """The avatar participant is in the room and publishes video."""
    return f.avatar_present and f.avatar_has_video


def avatar_present(f: AvatarFacts, data: EventData) -> bool:
    """The avatar participant is in the room."""
    return f.avatar_present


def clear_pending(f: AvatarFacts, data: EventData) -> bool:
    """The interrupt reached the plugin's sink, whose own clear now holds it."""
    return bool(data.get("delivered")) and f.plugin_clear_in_flight


def delivered(f: AvatarFacts, data: EventData) -> bool:
    """The interrupt reached the plugin's sink (its own clear ran)."""
    return bool(data.get("delivered"))


def retry_left(f: AvatarFacts, data: EventData) -> bool:
    """The policy calls this loss transient and has restarts left."""
    cause = data.get("cause", f.last_cause)
    return str(cause) in f.retry.transient and f.attempts < f.retry.attempts


def speaking_in_room(f: AvatarFacts, data: EventData) -> bool:
    """The agent is speaking on room audio (where the machine's route is put back): the
    next attempt's start would swap its sink in under that reply and cut it."""
    return f.agent_speaking


def rejoin(f: AvatarFacts, data: EventData) -> bool:
    """A late join gets the audio again: the policy's rejoin, and a route to reinstall."""
    return f.retry.rejoin and f.route_recorded


# -- playout ------------------------------------------------------------------------------------


class PlayoutFacts(Protocol):
    @property
    def avatar_state(self) -> str | None: ...  # the avatar machine's state (None: no avatar)
    @property
    def audio_at_avatar(self) -> bool: ...  # its sink holds ended segments not reported
    @property
    def watchdog_on(self) -> bool: ...  # re-prompts are configured
    @property
    def user_linked(self) -> bool: ...  # the link (if any) is linked: someone to re-prompt
    @property
    def user_speaking(self) -> bool: ...
    @property
    def reprompts(self) -> int: ...  # in a row, since the user last spoke
    @property
    def max_reprompts(self) -> int: ...


def avatar_joined(f: PlayoutFacts, data: EventData) -> bool:
    """The avatar machine is joined (or clearing, which is joined with a clear in flight)."""
    return f.avatar_state in PLUGIN_CLEARS


def audio_at_avatar(f: PlayoutFacts, data: EventData) -> bool:
    """The avatar's sink holds agent audio whose segment ended and that it has not reported
    played (what the SDK's playout wait hangs on). An avatar's report says how many it
    leaves owed (``owed``, counted as it came: the avatar's own step may count it later)."""
    owed = data.get("owed")
    return f.audio_at_avatar if owed is None else bool(owed)


def watchdog_on(f: PlayoutFacts, data: EventData) -> bool:
    return f.watchdog_on


def user_listening(f: PlayoutFacts, data: EventData) -> bool:
    """A linked user is there and silent (listening, or away)."""
    return f.user_linked and not f.user_speaking


def reprompts_left(f: PlayoutFacts, data: EventData) -> bool:
    return f.reprompts < f.max_reprompts


# what the playout machine follows of the session and of the other machines: each change's
# event for it (None: nothing)


def agent_state_event(new_state: str, old_state: str | None = None) -> str | None:
    """The event for the session's ``agent_state_changed`` to ``new_state`` (from
    ``old_state``, when known). The session's start (from ``initializing``) ends no turn:
    a greeting queued in ``on_enter`` is created before it."""
    if new_state in ("thinking", "speaking"):
        return f"agent_{new_state}"
    if new_state in ("listening", "idle"):
        return None if old_state == "initializing" else "agent_listening"
    return None  # initializing


def avatar_change_event(source: str, dest: str) -> str | None:
    """The event for the avatar machine moving from ``source`` to ``dest`` (``system.WATCHES``)."""
    return next(iter(watched("avatar", source, dest, "playout")), None)


def link_change_event(source: str, dest: str) -> str | None:
    """The event for the participant link moving from ``source`` to ``dest``
    (``system.WATCHES``)."""
    return next(iter(watched("participant", source, dest, "playout")), None)


# -- session ----------------------------------------------------------------------------------


class SessionFacts(Protocol):
    @property
    def own_session(self) -> str | None: ...  # the job's own session's label, if it has one


def is_own(f: SessionFacts, data: EventData) -> bool:
    """The event's session is the job's own (the one the participant link follows)."""
    return f.own_session is not None and data.get("session") == f.own_session


Guard = Callable[[Any, EventData], bool]

GUARDS: Mapping[str, Mapping[str, Guard]] = MappingProxyType(
    {
        "job": {"hold_needed": hold_needed},
        "participant": {
            "eligible": eligible,
            "is_linked": is_linked,
            "same_identity": is_linked,
            "closing_reason": closing_reason,
            "grace_enabled": grace_enabled,
        },
        "session_host": {"is_current": is_current, "from_simulator": from_simulator},
        "session": {"is_own": is_own},
        "finalize": {"simulation": simulation},
        "avatar": {
            "has_video": has_video,
            "avatar_present": avatar_present,
            "clear_pending": clear_pending,
            "delivered": delivered,
            "retry_left": retry_left,
            "speaking_in_room": speaking_in_room,
            "rejoin": rejoin,
        },
        "room_deletion": {},
        "playout": {
            "avatar_joined": avatar_joined,
            "audio_at_avatar": audio_at_avatar,
            "watchdog_on": watchdog_on,
            "user_listening": user_listening,
            "reprompts_left": reprompts_left,
        },
    }
)


# -- room conditions ------------------------------------------------------------------------------


class RoomFacts(Protocol):
    """What a machine's runtime knows of the room just before a fact."""

    @property
    def avatar_identity(self) -> str | None: ...
    @property
    def simulators(self) -> frozenset[str]: ...  # participants known to carry lk.simulator


# a room fact as plain data: {"fact": NAME, and its fields: identity, kind, reason,
# attributes (the participant's, as last known), changed, muted}
Fact = Mapping[str, Any]
Condition = Callable[[RoomFacts, Fact], bool]


def is_avatar(room: RoomFacts, fact: Fact) -> bool:
    return room.avatar_identity is not None and fact.get("identity") == room.avatar_identity


def is_video(room: RoomFacts, fact: Fact) -> bool:
    return fact.get("fact") == "track_published" and fact.get("kind") == "video"


def last_simulator_left(room: RoomFacts, fact: Fact) -> bool:
    if fact.get("fact") != "participant_left":
        return False
    identity = fact.get("identity")
    attributes = fact.get("attributes") or {}
    was = identity in room.simulators or SIMULATOR_ATTRIBUTE in attributes
    return was and not (room.simulators - {identity})


def last_simulator_attribute_removed(room: RoomFacts, fact: Fact) -> bool:
    if fact.get("fact") != "attributes_changed":
        return False
    if SIMULATOR_ATTRIBUTE in (fact.get("attributes") or {}):
        return False
    identity = fact.get("identity")
    return identity in room.simulators and not (room.simulators - {identity})


ROOM_CONDITIONS: Mapping[str, Condition] = MappingProxyType(
    {
        "is_avatar": is_avatar,
        "is_video": is_video,
        "last_simulator_left": last_simulator_left,
        "last_simulator_attribute_removed": last_simulator_attribute_removed,
    }
)


_NO_ONE: frozenset[str] = frozenset()  # the one empty answer (each frozenset() is new)


def simulators_after(simulators: frozenset[str], fact: Fact) -> frozenset[str]:
    """Which participants carry lk.simulator once ``fact`` happened."""
    name, identity = fact.get("fact"), fact.get("identity")
    if not isinstance(identity, str):
        return simulators
    if name in ("participant_joined", "attributes_changed"):
        if SIMULATOR_ATTRIBUTE in (fact.get("attributes") or {}):
            return simulators if identity in simulators else simulators | {identity}
    elif name != "participant_left":
        return simulators
    # the same set when nothing changes: a set per participant's fact is memory per job
    if identity not in simulators:
        return simulators
    return simulators - {identity} or _NO_ONE

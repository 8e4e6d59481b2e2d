"""What a user hands ``AgentJob``, checked before anything changes: the avatar plugin and its
start options, the ``RoomOptions`` a start is given, and the parts the testing kit injects
(``injected``); what a job is built from besides its settings (``Parts``). The tracing a
job writes to is ``settings.observed``."""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from livekit import rtc
from livekit.agents import NOT_GIVEN, Agent, NotGivenOr
from livekit.agents.utils import is_given
from livekit.agents.voice.avatar import AvatarSession
from livekit.agents.voice.remote_session import SessionTransport
from livekit.agents.voice.room_io import RoomOptions

from agent_runtime.clock import Clock
from agent_runtime.observe.trace import Tracer
from agent_runtime.runtimes.avatar import (
    RemoveParticipant,
    check_factory,
    check_plugin,
    check_start_options,
    plugin_name,
)
from agent_runtime.runtimes.playout import RepromptFn
from agent_runtime.runtimes.room_deletion import DeleteRoomFn
from agent_runtime.runtimes.session_host import SimulationEndFn
from agent_runtime.settings import JobSettings, SettingError, SettingTypeError

if TYPE_CHECKING:
    from livekit.agents.job import JobContext
    from livekit.agents.simulation import SimulationContext, SimulationDispatch

logger = logging.getLogger("agent_runtime.agent_job")

# parts the testing kit injects into jobs built in its context (virtual clock, in-memory
# transport, recorded room deletion); production never sets it
_INJECTED: ContextVar[Mapping[str, Any] | None] = ContextVar("agent_runtime_injected", default=None)
_INJECTABLE = frozenset(
    {"clock", "transport", "tracer", "delete_room", "remove_avatar_participant", "otel", "avatar"}
)


@contextlib.contextmanager
def injected(**parts: Any) -> Iterator[None]:
    """Jobs built inside this context (``AgentJob(...)`` or ``from_job_context``) take these
    parts unless given explicitly: ``clock``, ``transport``, ``tracer``, ``delete_room``,
    ``remove_avatar_participant``, ``otel`` (an ``OtelSink``). ``avatar`` (an
    ``AvatarSession``) replaces the avatar plugin a job is given, if it is given one. For
    tests that run an unchanged entrypoint on virtual time and an in-memory room."""
    unknown = sorted(set(parts) - _INJECTABLE)
    if unknown:
        raise TypeError(f"cannot inject {', '.join(unknown)}; one of {sorted(_INJECTABLE)}")
    token = _INJECTED.set({**(_INJECTED.get() or {}), **parts})
    try:
        yield
    finally:
        _INJECTED.reset(token)


def injections() -> Mapping[str, Any]:
    """What the ``injected`` context in force gives the jobs built now."""
    return _INJECTED.get() or {}


# an avatar plugin, or what builds one when the job is built (a class, a functools.partial)
AvatarPlugin = AvatarSession | Callable[[], AvatarSession]  # type: ignore[type-arg]


def check_avatar(avatar: AvatarPlugin | None, start_options: object) -> dict[str, Any]:
    """The plugin's start options, once the plugin given and its options are checked (a
    factory's call is checked against its signature here, what it builds in
    ``build_avatar``)."""
    if avatar is not None and not isinstance(avatar, AvatarSession):
        if callable(avatar):
            check_factory(avatar)  # a misspelt keyword, a required option not given
        else:
            check_plugin(avatar)  # AvatarPluginError (a TypeError) naming it
    if start_options is not None and not isinstance(start_options, Mapping):
        raise TypeError(
            "avatar_start_options must be a mapping of the plugin's start() keyword "
            f"options, not {type(start_options).__name__}"
        )
    options = dict(start_options or {})
    for key in options:  # else "sequence item 0: expected str instance" from deep inside
        if not isinstance(key, str):
            raise SettingTypeError(
                f"avatar_start_options: the plugin's start() takes keyword names (str), not {key!r}"
            )
    if options and avatar is None:
        raise SettingError("avatar_start_options given without an avatar")
    if isinstance(avatar, AvatarSession):
        check_start_options(avatar, options)
    return options


def build_avatar(
    avatar: AvatarPlugin, start_options: Mapping[str, Any], labels: Mapping[str, str]
) -> tuple[AvatarSession | None, str | None]:  # type: ignore[type-arg]
    """The plugin, built by its factory when one was given, or why there is none. A factory
    that raises (a plugin whose service is gone, a provider key missing in this deployment)
    or builds something that is no ``AvatarSession`` is a fault of the run, not of the code:
    it is logged naming the plugin, and the job runs on room audio."""
    if isinstance(avatar, AvatarSession):
        return avatar, None
    try:
        built = avatar()
        check_plugin(built)
    except Exception as e:
        error = (
            f"avatar plugin {plugin_name(avatar)} could not be built "
            f"({type(e).__name__}: {e}); the agent runs on room audio"
        )
        logger.error("%s", error, extra=dict(labels))
        return None, error
    check_start_options(built, start_options)  # the code's own mistake: refused
    return built, None


def check_linked_identity(
    participant_identity: str | None, plugin: AvatarSession[Any] | None
) -> None:
    """``participant_identity`` naming the avatar is refused: the avatar publishes on the
    agent's behalf, and the link never follows it, so it would wait for its user forever."""
    if plugin is None or participant_identity is None:
        return
    avatar = plugin.avatar_identity
    if participant_identity == avatar:
        raise SettingError(
            f"participant_identity {participant_identity!r} is the avatar's identity "
            f"(avatar_identity {avatar!r}): the link never follows the avatar, which "
            "publishes on the agent's behalf; name the user's identity (or None: the first "
            "user who joins)"
        )


def check_agent(agent: object) -> None:
    """``start()``'s agent, refused before anything starts when it is no ``Agent``."""
    if isinstance(agent, type) and issubclass(agent, Agent):
        raise TypeError(f"agent must be an Agent instance, not the class {agent.__name__}")
    if not isinstance(agent, Agent):
        raise TypeError(f"agent must be a livekit.agents.Agent, not {type(agent).__name__}")


def room_options(settings: JobSettings, given: NotGivenOr[RoomOptions]) -> RoomOptions:
    """The ``RoomOptions`` the session starts with: the machines' close rules, the linked
    participant from the job's settings. What would contradict them is refused."""
    s = settings
    opts = copy.copy(given) if is_given(given) else RoomOptions()
    if not isinstance(opts, RoomOptions):
        raise TypeError(f"room_options must be a RoomOptions, not {type(opts).__name__}")
    if opts.delete_room_on_close:
        raise ValueError(
            "RoomOptions(delete_room_on_close=True) deletes the room as the session closes, "
            "before a simulator can ask for its verdict: pass delete_room_on_close=True to "
            "AgentJob instead (the room is deleted after the job's hold)"
        )
    if not opts.close_on_disconnect:
        raise ValueError(
            "RoomOptions(close_on_disconnect=False): pass close_on_disconnect=False to "
            "AgentJob instead (the participant machine decides what a departure means)"
        )
    if is_given(opts.participant_identity) and (
        opts.participant_identity != s.participant_identity
    ):
        raise ValueError(
            "RoomOptions.participant_identity: pass participant_identity= to AgentJob "
            "instead (the participant machine links that identity)"
        )
    if is_given(opts.participant_kinds):
        raise ValueError(
            "RoomOptions.participant_kinds: pass participant_kinds= to AgentJob instead"
        )
    opts.close_on_disconnect = False  # the participant machine decides
    opts.delete_room_on_close = False  # the job machine defers deletion past its hold
    opts.participant_identity = s.participant_identity or NOT_GIVEN
    opts.participant_kinds = [
        rtc.ParticipantKind.Value(f"PARTICIPANT_KIND_{k.upper()}") for k in s.participant_kinds
    ]
    return opts


@dataclass
class Parts:
    """What a job is built from besides its settings: each has a production default."""

    clock: Clock
    tracer: Tracer | None = None
    transport: SessionTransport | None = None
    simulation: SimulationContext | SimulationDispatch | None = None
    on_simulation_end: SimulationEndFn | None = None
    delete_room: DeleteRoomFn | None = None
    remove_avatar_participant: RemoveParticipant | None = None
    on_reprompt: RepromptFn | None = None
    plugin: AvatarSession | None = None  # type: ignore[type-arg]
    rebuild_avatar: Callable[[], AvatarSession] | None = None  # type: ignore[type-arg]
    avatar_start_options: dict[str, Any] = field(default_factory=dict)
    job_context: JobContext | None = None  # the livekit job it runs in (from_job_context)

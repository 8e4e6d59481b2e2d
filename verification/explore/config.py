"""What a run of the real job is explored under: who may be in the room, the settings the
job is built with (``Config``), and the named configs ``dev.py explore --config`` offers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from statemachines.glue import PUBLISH_ON_BEHALF, SIMULATOR_ATTRIBUTE

AGENT_IDENTITY = "agent"


@dataclass(frozen=True)
class Person:
    identity: str
    kind: str  # an rtc.ParticipantKind name
    attributes: tuple[tuple[str, str], ...] = ()


PEOPLE: dict[str, Person] = {
    "user": Person("user", "standard"),
    "sip": Person("sip", "sip"),  # a phone leg
    "simulator": Person("simulator", "standard", ((SIMULATOR_ATTRIBUTE, "1"),)),
    "avatar": Person("avatar", "agent", ((PUBLISH_ON_BEHALF, AGENT_IDENTITY),)),
    "stranger": Person("stranger", "standard"),  # sends a finalize; never in the room
}
GRACE_PERIOD = 15.0  # any positive grace period decides alike
# the playout watchdog's re-prompts in a row before it hands over (any limit past the
# first decides alike: one keeps the states few)
MAX_REPROMPTS = 1

# the job's settings in every run (seconds)
SETTINGS: dict[str, float] = {
    "join_timeout": 30.0,
    "session_end_timeout": 300.0,
    "close_timeout": 10.0,
    "session_close_timeout": 60.0,
    "backoff_initial": 1.0,
    "backoff_multiplier": 2.0,
}


@dataclass(frozen=True)
class Config:
    """The job's settings a run is explored under, and who is in the room when it starts.
    The job is always the one users get: playout on with its avatar."""

    simulation: bool = True
    participant_identity: str | None = None  # None: the first eligible participant
    close_on_disconnect: bool = True
    grace: bool = True  # grace_period > 0
    rejoin: bool = False  # retry_avatar's rejoin: a late join routes audio again
    retry_attempts: int = 0  # retry_avatar's attempts (every cause transient)
    delete_room_on_close: bool = False
    present: tuple[str, ...] = ("simulator",)  # in the room at the start, in join order
    max_finalize_requests: int = 2
    # playout's re-prompt watchdog: off (PlayoutOptions' default), or on, handing over after
    # MAX_REPROMPTS by waiting for the user or by closing the session
    watchdog: Literal["off", "wait", "close"] = "off"
    # the user's own AgentJob.aclose() and aclose(graceful=False) among the inputs
    aclose: bool = False
    # the session started at the run's start; off: only the runtime follows the room then,
    # and the session's start is an input (a shutdown or the avatar's start may come first)
    session_started: bool = True

    def label(self) -> str:
        parts = ["simulation" if self.simulation else "no simulation"]
        if self.participant_identity is not None:
            parts.append(f"identity {self.participant_identity}")
        if not self.close_on_disconnect:
            parts.append("close_on_disconnect off")
        else:
            parts.append("grace_period > 0" if self.grace else "grace_period 0")
        if self.rejoin:
            parts.append("rejoin")
        if self.retry_attempts:
            parts.append(f"{self.retry_attempts} retry")
        if self.delete_room_on_close:
            parts.append("delete_room_on_close")
        if self.watchdog != "off":
            parts.append(f"watchdog then {self.watchdog}")
        if self.aclose:
            parts.append("aclose")
        if not self.session_started:
            parts.append("the session started late")
        parts.append(f"present: {', '.join(self.present) or 'nobody'}")
        return ", ".join(parts)


CONFIGS: dict[str, Config] = {
    # examples/agent.py in a simulation: the simulator is who it links (no identity is
    # configured, and livekit's default kinds include SIP)
    "example": Config(),
    # a SIP leg there first is linked; the room deleted at the end
    "sip": Config(present=("sip", "simulator"), grace=False, delete_room_on_close=True),
    # a configured identity; an avatar that may come back
    "identity": Config(
        participant_identity="user",
        present=("sip", "simulator"),
        close_on_disconnect=False,
        rejoin=True,
        retry_attempts=1,
    ),
    # not a simulation: nobody there at the start
    "plain": Config(simulation=False, present=(), delete_room_on_close=True, retry_attempts=1),
    # the user's own closes: one that holds for the simulator, an abort that ends the hold
    "aclose": Config(aclose=True),
    "aclose-plain": Config(
        simulation=False, present=(), delete_room_on_close=True, retry_attempts=1, aclose=True
    ),
    # playout's watchdog on, handing over by closing the session; an avatar that may return
    "watchdog": Config(
        simulation=False, present=(), retry_attempts=1, rejoin=True, watchdog="close"
    ),
    # the watchdog waiting for the user after a SIP leg, the room deleted at the end
    "watchdog-wait": Config(
        present=("sip", "simulator"), grace=False, delete_room_on_close=True, watchdog="wait"
    ),
    # as example, the session's start an input: the job may hold before it (held), or while
    # the avatar's start runs (starting_held)
    "late-start": Config(session_started=False),
}

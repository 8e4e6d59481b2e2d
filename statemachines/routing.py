"""Which room fact becomes which event of which machine: one declared table.

The runtime subscribes each machine to the room through this table (nothing else turns a
room callback into a machine event), the diagrams print it, and the explorer reads it. A
route fires when its fact arrives and every one of its named conditions holds; conditions
are evaluated on the fact and on what the job knew just before it (which participants carry
the simulator attribute), and are defined once, by name, in ``CONDITIONS``.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, model_validator

from .machines import MACHINES

FactName = Literal[
    "participant_joined",  # {identity, kind, attributes}
    "participant_left",  # {identity, kind, reason}
    "track_published",  # {identity, kind}: audio | video
    "track_muted",  # {identity, kind, muted}
    "attributes_changed",  # {identity, changed}
    "room_connected",
    "room_disconnected",  # {reason}
    "reconnecting",
    "reconnected",
]
FACTS: tuple[str, ...] = get_args(FactName)

CONDITIONS: dict[str, str] = {
    "is_avatar": "the fact's participant is the avatar (its identity is the avatar's)",
    "is_video": "the published track is a video track",
    "last_simulator_left": (
        "the participant carried lk.simulator (when it left, or as last known) and no other "
        "participant in the room carries it"
    ),
    "last_simulator_attribute_removed": (
        "a participant known as a simulator no longer carries lk.simulator, and no other "
        "participant does"
    ),
}


class Route(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    fact: FactName
    machine: str
    event: str
    when: tuple[str, ...] = ()
    note: str = ""

    @model_validator(mode="after")
    def _known(self) -> Route:
        spec = MACHINES.get(self.machine)
        if spec is None:
            raise ValueError(f"route {self.fact} -> unknown machine {self.machine!r}")
        if self.event not in spec.events:
            raise ValueError(f"route {self.fact} -> {self.machine} has no event {self.event!r}")
        for c in self.when:
            if c not in CONDITIONS:
                raise ValueError(f"route {self.fact} -> {self.machine}: unknown condition {c!r}")
        return self


ROUTES: tuple[Route, ...] = (
    Route(fact="room_connected", machine="avatar", event="room_connected"),
    Route(
        fact="participant_joined", when=("is_avatar",), machine="avatar", event="avatar_connected"
    ),
    Route(fact="participant_left", when=("is_avatar",), machine="avatar", event="avatar_left"),
    Route(
        fact="track_published",
        when=("is_avatar", "is_video"),
        machine="avatar",
        event="video_published",
    ),
    # every participant: the machine's own `eligible` guard decides who is linked
    Route(fact="participant_joined", machine="participant", event="participant_connected"),
    Route(fact="participant_left", machine="participant", event="participant_disconnected"),
    Route(
        fact="participant_left",
        when=("last_simulator_left",),
        machine="job",
        event="simulator_left",
        note="SIP legs and avatars leaving do not count",
    ),
    Route(
        fact="attributes_changed",
        when=("last_simulator_attribute_removed",),
        machine="job",
        event="simulator_left",
    ),
    Route(fact="room_disconnected", machine="job", event="room_disconnected"),
)


def routes_for(machine: str) -> tuple[Route, ...]:
    return tuple(r for r in ROUTES if r.machine == machine)

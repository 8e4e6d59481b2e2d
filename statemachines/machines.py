"""Every machine of the runtime, by name: the one list diagrams, tables and tests read."""

from .agent_job import AGENT_JOB
from .avatar import AVATAR
from .finalize import FINALIZE
from .job import JOB
from .participant import PARTICIPANT
from .playout import PLAYOUT
from .room_deletion import ROOM_DELETION
from .session import SESSION
from .session_host import SESSION_HOST
from .spec import MachineSpec

MACHINES: dict[str, MachineSpec] = {
    m.name: m
    for m in (
        AVATAR,
        JOB,
        SESSION_HOST,
        PARTICIPANT,
        ROOM_DELETION,
        FINALIZE,
        PLAYOUT,
        SESSION,
        AGENT_JOB,
    )
}

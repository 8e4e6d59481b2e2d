"""``AgentJob.snapshot()``: what every machine of a live job is doing, as plain JSON data.

Real: the scenario runner's ``AgentJob`` (every machine's runtime, real ``AgentSession``,
the scripted avatar plugin), on virtual time. Faked as everywhere: the room's server side.
"""

from __future__ import annotations

import json

from statemachines.machines import MACHINES
from tests.support.scenario_job import scenario_job

HOLD = """
name: a hold in progress
config: {simulation: true, session_end_timeout: 120}
participants:
  - {identity: simulator, attributes: {lk.simulator: "true"}}
steps:
  - {at: 0, event: session.start}
  - {at: 10, event: session.close, reason: user_initiated}
  - {at: 25, event: end}
"""

AVATAR = """
name: an avatar that never joins
config: {avatar_identity: avatar-1, join_timeout: 5, playout: true}
participants: [{identity: user}]
steps:
  - {at: 0, event: session.start}
  - {at: 0.5, event: avatar.start}
  - {at: END, event: end}
"""


def round_trips(value: object) -> bool:
    return json.loads(json.dumps(value)) == value


async def test_during_the_hold_the_job_waits_in_awaiting_finalize_until_its_deadline() -> None:
    async with scenario_job(HOLD) as (sim, _):
        snap = sim.agent_job.snapshot()
    assert snap["t"] == 25.0
    job = snap["machines"]["job"]
    assert (job["state"], job["since"]) == ("awaiting_finalize", 10.0)
    # the hold's deadline: entered at 10, session_end_timeout 120
    assert job["timer"] == {"event": "hold_timeout", "deadline": 130.0, "remaining": 105.0}
    assert snap["finalize"] == {
        "simulation": True,
        "simulators": ["simulator"],
        "hold_needed": True,
        "answered": False,
        "verdict": None,
    }
    assert snap["machines"]["session_host"]["state"] == "detached"
    assert snap["attached_session"] is None and not snap["primary_session_attached"]
    assert snap["close_reason"] == "user_initiated" and snap["room_connected"]
    assert snap["closed_at"] is None and snap["room_deleted_at"] is None
    assert round_trips(snap)


async def test_while_the_avatar_is_awaited_then_after_it_failed() -> None:
    async with scenario_job(AVATAR.replace("END", "2")) as (sim, _):
        routing = sim.agent_job.snapshot()
    avatar = routing["machines"]["avatar"]
    assert (avatar["state"], avatar["since"]) == ("routing", 0.5)
    assert avatar["timer"] == {"event": "join_timeout", "deadline": 5.5, "remaining": 3.5}
    assert routing["audio_route"] == "avatar"

    async with scenario_job(AVATAR.replace("END", "10")) as (sim, _):
        restored = sim.agent_job.snapshot()
    avatar = restored["machines"]["avatar"]
    assert (avatar["state"], avatar["since"], avatar["timer"]) == ("restored", 5.5, None)
    assert restored["audio_route"] == "room"  # the agent is audible again
    assert restored["linked_identity"] == "user"
    assert restored["attached_session"] == "session-1" and restored["primary_session_attached"]
    participant = restored["machines"]["participant"]
    assert (participant["state"], participant["since"]) == ("linked", 0.0)
    assert list(restored["machines"]) == list(MACHINES)  # every machine of the job
    assert round_trips(restored)


async def test_the_snapshot_shows_every_actor_the_job_system_holds_in_machines_order() -> None:
    """The job's system holds its actors (no walk of the runtime objects): the snapshot
    lists each of them once, in ``MACHINES`` order, and nothing else."""
    async with scenario_job(HOLD.replace("25", "12")) as (sim, _):
        job = sim.agent_job
        snap = job.snapshot()
        held = [a.spec.name for a in job.system.actors]
    assert list(snap["machines"]) == held
    assert held == [name for name in MACHINES if name in held]  # MACHINES order
    # this job has no avatar and no playout: every other machine is there
    assert set(held) == set(MACHINES) - {"avatar", "playout"}
    assert snap["machines"]["agent_job"]["state"] == "running"

"""The avatar scenario files in examples/scenarios, played against the lifecycle.

A small stand-in for the scenario runner (only the events these files use), so the files
are checked against the behaviour they describe: every ``expect`` block must hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from livekit import rtc
from test_avatar_rig import Rig, add_active

from agent_runtime.avatar import route_of

SCENARIOS = sorted((Path(__file__).parent.parent / "examples" / "scenarios").glob("avatar_*.yaml"))


async def play(doc: dict[str, Any]) -> dict[str, Any]:
    config = doc.get("config", {})
    rig = Rig(connected=False, join_timeout=float(config.get("join_timeout", 30.0)))
    rig.avatar.avatar_identity = config.get("avatar_identity", "avatar")
    for p in doc.get("participants", []):
        add_active(rig.room, p["identity"], kind=p.get("kind", "standard"))
    for step in doc["steps"]:
        await rig.clock.run_until(float(step["at"]))
        ev = step["event"]
        if ev == "room.connected":
            rig.room.connect_locally()
        elif ev == "session.start":
            await rig.start_session()
        elif ev == "avatar.start":
            await rig.start_avatar()
        elif ev == "avatar.close":
            await rig.lifecycle.aclose()
        elif ev == "session.interrupt":
            rig.session.interrupt()
            rig.lifecycle.interrupt()
        elif ev == "participant_connected":
            add_active(rig.room, step["identity"], kind=step.get("kind", "standard"))
        elif ev == "track_published":
            rig.room.publish_track(step["identity"], step["kind"])
        elif ev == "participant_disconnected":
            reason = rtc.DisconnectReason.Value(step.get("reason", "CLIENT_INITIATED"))
            rig.room.remove_participant(step["identity"], reason)
        elif ev == "end":
            break
        else:
            raise AssertionError(f"event {ev!r} is not played by this stand-in")
    result = {
        "final_states": {"avatar": rig.lifecycle.state},
        "facts": {
            "audio_output": route_of(rig.session),
            "rpcs_sent": [
                {"t": c.t, "method": c.method, "destination": c.destination, "outcome": c.outcome}
                for c in rig.room.local_participant.rpc_calls
            ],
        },
    }
    await rig.aclose()
    return result


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
async def test_scenario_expectations_hold(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    result = await play(doc)
    for section, want in doc["expect"].items():
        for key, value in want.items():
            assert result[section][key] == value, f"{path.name}: {section}.{key}"


def test_the_issue_scenarios_are_all_there() -> None:
    assert {p.stem for p in SCENARIOS} >= {
        "avatar_never_joins_avatar_first",
        "avatar_never_joins_session_first",
        "avatar_joins_then_drops",
        "avatar_interrupt_after_left",
        "avatar_close_during_routing",
        "avatar_start_before_room_connects",
    }

"""The avatar scenario files (``examples/scenarios/avatar_*.yaml``) played against the
lifecycle.

A stand-in for ``agent-runtime simulate`` that plays only what the avatar files use, so
each file's expectations about the avatar (its final state, where the audio ends, the RPCs
sent) are checked against ``AvatarLifecycle`` itself. Expectations about other machines
are left to the real runner.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from livekit import rtc

from agent_runtime.runtimes.avatar import route_of
from agent_runtime.testing.clock import settle
from agent_runtime.testing.scripted_avatar import ScriptedAvatar
from tests.support.avatar_rig import Rig, add_active
from tests.support.world import stranger, stranger_track

BUNDLED = sorted((Path(__file__).parent.parent / "examples" / "scenarios").glob("avatar_*.yaml"))


def _speaks(path: Path) -> bool:
    """A file where the agent speaks: this stand-in has no room audio paced on its clock,
    so such a file is the real runner's alone (``tests/test_record.py`` simulates every
    bundled file, its expect block checked)."""
    return any(step["event"] == "agent.say" for step in yaml.safe_load(path.read_text())["steps"])


SCENARIOS = [p for p in BUNDLED if not _speaks(p)]
CHECKED_FACTS = ("audio_output", "rpcs_sent")


async def play(doc: dict[str, Any]) -> dict[str, Any]:
    config = doc.get("config", {})
    avatar = ScriptedAvatar(avatar_identity=config.get("avatar_identity", "avatar"))
    rig = Rig(
        connected=bool(config.get("room_connected", True)),
        avatar=avatar,
        join_timeout=float(config.get("join_timeout", 30.0)),
        retry=config.get("retry_avatar", False),
    )
    for p in doc.get("participants", []):
        # the rig's room has its user already: the SFU would not report it joining twice
        if p["identity"] not in rig.room.remote_participants:
            add_active(rig.room, p["identity"], kind=p.get("kind", "standard"))
    for step in doc["steps"]:
        await rig.clock.run_until(float(step["at"]))
        ev = step["event"]
        if ev == "end":
            break
        if ev == "room.connected":
            rig.room.connect_locally()
        elif ev == "session.start":
            await rig.start_session()
        elif ev in ("avatar.start", "avatar.start_error"):
            if ev == "avatar.start_error":
                avatar.start_error = RuntimeError("scripted start error")
            await rig.start_avatar()
        elif ev == "avatar.close":
            await rig.lifecycle.aclose()
        elif ev == "session.interrupt":
            rig.session.interrupt()
            rig.lifecycle.interrupt()
        elif ev == "participant_connected":
            add_active(rig.room, step["identity"], kind=step.get("kind", "standard"))
        elif ev == "track_published":
            if step["identity"] in rig.room.remote_participants:
                rig.room.publish_track(step["identity"], step.get("kind", "audio"))
            else:  # as the runner does: a stranger's event (an avatar removed meanwhile)
                track = stranger_track(step.get("kind", "audio"))
                rig.room.emit("track_published", track, stranger(step["identity"]))
        elif ev == "participant_disconnected":
            reason = rtc.DisconnectReason.Value(step.get("reason", "CLIENT_INITIATED"))
            rig.room.remove_participant(step["identity"], reason)
        elif ev == "rpc_outcome":
            rig.room.local_participant.rpc_script[step["method"]].append(step["result"])
        else:
            raise AssertionError(f"event {ev!r} is not played by this stand-in")
        await settle()
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


def matches(want: Any, got: Any) -> bool:
    """Numbers approximately, objects by the keys given, lists element by element."""
    if isinstance(want, dict):
        return isinstance(got, dict) and all(
            k in got and matches(v, got[k]) for k, v in want.items()
        )
    if isinstance(want, list):
        return (
            isinstance(got, list)
            and len(want) == len(got)
            and all(matches(w, g) for w, g in zip(want, got, strict=True))
        )
    if isinstance(want, int | float) and not isinstance(want, bool):
        return isinstance(got, int | float) and math.isclose(want, got, abs_tol=1e-6)
    return bool(want == got)


def check(doc: dict[str, Any], result: dict[str, Any]) -> list[str]:
    expect = doc.get("expect", {})
    failures = []
    want_state = expect.get("final_states", {}).get("avatar")
    if want_state is not None and want_state != result["final_states"]["avatar"]:
        failures.append(
            f"avatar: expected {want_state!r}, got {result['final_states']['avatar']!r}"
        )
    for fact in CHECKED_FACTS:
        if fact in expect.get("facts", {}) and not matches(
            expect["facts"][fact], result["facts"][fact]
        ):
            failures.append(
                f"{fact}: expected {expect['facts'][fact]!r}, got {result['facts'][fact]!r}"
            )
    return failures


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
async def test_bundled_avatar_scenario(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert check(doc, await play(doc)) == []


NEVER_JOINS = """
name: never joins, avatar first; then a late join that is removed
config: {avatar_identity: avatar-1, join_timeout: 5}
participants: [{identity: user}]
steps:
  - {at: 0, event: avatar.start}
  - {at: 0.5, event: session.start}
  - {at: 8, event: participant_connected, identity: avatar-1, kind: agent}
  - {at: 8.5, event: track_published, identity: avatar-1, kind: video}
  - {at: 9, event: session.interrupt}
  - {at: 10, event: end}
expect:
  final_states: {avatar: restored}
  facts: {audio_output: room, rpcs_sent: []}
"""


async def test_the_stand_in_plays_and_checks() -> None:
    doc = yaml.safe_load(NEVER_JOINS)
    result = await play(doc)
    assert check(doc, result) == []
    doc["expect"]["facts"]["audio_output"] = "avatar"
    assert check(doc, result) == ["audio_output: expected 'avatar', got 'room'"]


def test_only_the_files_where_the_agent_speaks_are_left_to_the_real_runner() -> None:
    # the retry that waits for the agent's reply was added without the stand-in playing
    # agent.say: it failed here with "event 'agent.say' is not played by this stand-in"
    left = [p.stem for p in BUNDLED if p not in SCENARIOS]
    assert left == ["avatar_retry_waits_for_speech"]
    assert len(SCENARIOS) >= 10

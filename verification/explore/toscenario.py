"""A run of the real job (``real.Run``) as a scenario file that ``agent-runtime simulate``
replays: its config as the scenario's ``config``, who is in the room as its
``participants``, each input as a step at the virtual time it was driven, and
``expect: {invariants: all}``, so simulate fails on the invariant the run broke.

The harness's stand-ins wait for the world's word (a session's close, the agent's
``on_simulation_end``, a deletion, a shutdown callback, the avatar provider's start); the
scenario runner's end that work at once unless ``config.hold`` names the call, when it
waits for a ``held.end`` step. So a call is held when the run needs it (an outcome that
fails or hangs, another input or the end while it waits), and each of its outcomes is a
``held.end`` step; otherwise an outcome that ends its wait maps onto nothing. An input
with no scenario step makes the run not reproducible as a scenario: ``NotReproducible``
says which input, and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from agent_runtime.testing.scenario import HELD_CALLS, parse_scenario
from verification.explore.actions import SHUTDOWN_REASON, SPEECH
from verification.explore.config import GRACE_PERIOD, PEOPLE, SETTINGS, Config
from verification.explore.harness import VERDICT
from verification.explore.real import Applied
from verification.explore.real_inputs import TIME

# each stand-in's outcome: the held call it ends (``config.hold``), its ``held.end``
# result, and whose close (session_close)
ENDS: dict[str, tuple[str, str, str | None]] = {
    "a_closed": ("session_close", "ok", None), "a_hangs": ("session_close", "hang", None),
    "a_fails": ("session_close", "error", None),
    "b_closed": ("session_close", "ok", "B"), "verdict_ready": ("simulation_end", "ok", None),
    "deletion_returns": ("room_deletion", "ok", None),
    "deletion_fails": ("room_deletion", "error", None),
    "callbacks_return": ("shutdown_callback", "ok", None),
    "callback_hangs": ("shutdown_callback", "hang", None),
    "plugin_routed": ("avatar_start", "routed", None),
    "plugin_fails": ("avatar_start", "error", None),
    "plugin_no_route": ("avatar_start", "no_route", None),
    "plugin_returns": ("avatar_start", "ok", None),
    "plugin_fails_late": ("avatar_start", "error", None),
}  # fmt: skip
# outcomes the runner's stand-ins give at once, by themselves, when their call is not held
FOLDED = frozenset(t for t, (_, result, _) in ENDS.items() if result in ("ok", "routed"))
# inputs with no scenario step, and why
REFUSED: dict[str, str] = {
    "request_deletion": "no scenario step asks for the room's deletion",
    "interrupt": "the harness pushes audio straight into the avatar's sink first, which no "
    "scenario step does",
}
_STEPS: dict[str, dict[str, Any]] = {
    "room_disconnects": {"event": "room.disconnected", "reason": "CLIENT_INITIATED"},
    "finalize": {"event": "session_request", "caller": PEOPLE["simulator"].identity,
                 "request": "finalize_simulation", "payload": {"provisional_success": True}},
    "stranger_finalize": {"event": "session_request", "caller": PEOPLE["stranger"].identity,
                          "request": "finalize_simulation",
                          "payload": {"provisional_success": True}},
    "ping": {"event": "session_request", "caller": PEOPLE["simulator"].identity,
             "request": "ping"},
    "malformed": {"event": "session_request", "caller": PEOPLE["simulator"].identity,
                  "request": "finalize_simulation", "payload": {"provisional_success": "yes"}},
    "attach_b": {"event": "session.attach", "session": "B"},
    "close_a": {"event": "session.close", "reason": "user_initiated"},
    "ctx_shutdown": {"event": "ctx.shutdown", "reason": SHUTDOWN_REASON},
    "job_shutdown": {"event": "job.shutdown", "reason": SHUTDOWN_REASON},
    "aclose": {"event": "job.aclose"},
    "abort": {"event": "job.aclose", "graceful": False},
    "avatar_start": {"event": "avatar.start"},
    "session_start": {"event": "session.start"},
    "avatar_video": {"event": "track_published", "identity": PEOPLE["avatar"].identity,
                     "kind": "video"},
    "avatar_leaves": {"event": "participant_disconnected",
                      "identity": PEOPLE["avatar"].identity, "reason": "CLIENT_INITIATED"},
    "interrupt_idle": {"event": "session.interrupt"},
    "user_interrupts": {"event": "session.interrupt"},
    "agent_says": {"event": "agent.say", "duration": SPEECH, "text": "A reply."},
    "user_speaks": {"event": "user.state", "state": "speaking"},
    "user_listens": {"event": "user.state", "state": "listening"},
    "avatar_close": {"event": "avatar.close"},
    "clear_settles": {"event": "rpc", "method": "lk.playback_finished",
                      "caller": PEOPLE["avatar"].identity,
                      "payload": {"playback_position": 0.0, "interrupted": True}},
    "avatar_reports": {"event": "rpc", "method": "lk.playback_finished",
                       "caller": PEOPLE["avatar"].identity,
                       "payload": {"playback_position": SPEECH, "interrupted": False}},
}  # fmt: skip


class NotReproducible(ValueError):
    """The run has an input a scenario cannot reproduce: the message says which, and why."""


def _person(who: str) -> dict[str, Any]:
    p = PEOPLE[who]
    return {"identity": p.identity, "kind": p.kind, "attributes": dict(p.attributes)}


def _config(config: Config) -> dict[str, Any]:
    if config.watchdog != "off":
        raise NotReproducible(
            "the watchdog's re-prompt says nothing in the harness; a scenario's says "
            "reprompt_speech seconds of audio"
        )
    out: dict[str, Any] = {
        "avatar_identity": PEOPLE["avatar"].identity,
        "join_timeout": SETTINGS["join_timeout"],
        "session_end_timeout": SETTINGS["session_end_timeout"],
        "close_timeout": SETTINGS["close_timeout"],
        "session_close_timeout": SETTINGS["session_close_timeout"],
        "grace_period": GRACE_PERIOD if config.grace else 0.0,
        "close_on_disconnect": config.close_on_disconnect,
        "delete_room_on_close": config.delete_room_on_close,
        "simulation": config.simulation,
        "retry_avatar": {
            "attempts": config.retry_attempts,
            "rejoin": config.rejoin,
            "backoff": {
                "initial": SETTINGS["backoff_initial"],
                "multiplier": SETTINGS["backoff_multiplier"],
            },
        },
        # the harness's on_simulation_end vetoes the run
        "agent_verdict": {"success": False, "reason": VERDICT},
    }
    if config.participant_identity is not None:
        out["participant_identity"] = config.participant_identity
    return out


def _step(token: str) -> dict[str, Any]:
    person, _, reason = token.partition(":")
    who, _, what = person.rpartition("_")
    if who in ("user", "sip", "simulator", "avatar") and what in ("joins", "leaves"):
        if what == "joins":
            return {"event": "participant_connected", **_person(who)}
        return {"event": "participant_disconnected", "identity": PEOPLE[who].identity,
                "reason": reason}  # fmt: skip
    if token not in _STEPS:
        raise NotReproducible("no scenario step does it")
    return dict(_STEPS[token])


def held_calls(log: Sequence[Applied]) -> tuple[str, ...]:
    """The calls the scenario holds: one with an outcome the runner does not give by
    itself (a failure, a hang), or another input (the end too) while it waits."""
    held: set[str] = set()
    for a in log:
        if a.token in ENDS and a.token not in FOLDED:
            held.add(ENDS[a.token][0])
        mine = ENDS[a.token][0] if a.token in ENDS else None
        held.update(ENDS[w][0] for w in a.waiting if w in ENDS and ENDS[w][0] != mine)
    return tuple(c for c in HELD_CALLS if c in held)


def _end(token: str) -> dict[str, Any]:
    call, result, session = ENDS[token]
    step = {"event": "held.end", "call": call, "result": result}
    return step if session is None else {**step, "session": session}


def _steps(log: Sequence[Applied], held: Sequence[str], started: bool) -> list[dict[str, Any]]:
    """Each input as a step: ``TIME`` only moves the next step's ``at``; an outcome of a
    held call is its ``held.end``, of another call nothing (the runner gives it). The
    session's start comes first when the run began with it (``started``), else where the
    path has it."""
    steps: list[dict[str, Any]] = [{"at": 0.0, "event": "session.start"}] if started else []
    for i, a in enumerate(log, 1):
        what = f"input {i} ({a.token})"
        if a.token in ENDS:
            if a.token not in a.waiting:
                raise NotReproducible(f"{what}: nothing waits for it")
            if ENDS[a.token][0] in held:
                steps.append({"at": round(a.at, 6), **_end(a.token)})
            continue
        if a.token in REFUSED:
            raise NotReproducible(f"{what}: {REFUSED[a.token]}")
        if a.token in (TIME, "end"):
            continue
        try:
            steps.append({"at": round(a.at, 6), **_step(a.token)})
        except NotReproducible as e:
            raise NotReproducible(f"{what}: {e}") from None
    end = round(log[-1].at, 6) if log else 0.0
    steps.append({"at": end, "event": "end"})
    return steps


def scenario_of(config_name: str, config: Config, log: Sequence[Applied], title: str) -> str:
    """The scenario file's text (YAML), checked by the scenario loader, or
    ``NotReproducible``."""
    held = held_calls(log)
    config_out = _config(config)
    if held:
        config_out["hold"] = list(held)
    data = {
        "name": title,
        "description": f"Written by dev.py explore (config {config_name}): the "
        "inputs the explorer drove, at the virtual times it drove them; every invariant "
        "is expected to hold.",
        "config": config_out,
        "participants": [_person(who) for who in config.present],
        "steps": _steps(log, held, config.session_started),
        "expect": {"invariants": "all"},
    }
    text = yaml.safe_dump(data, sort_keys=False)
    parse_scenario(yaml.safe_load(text), source=title)  # a file simulate would refuse is a bug
    return text


def write_scenario(
    directory: str | Path, name: str, config_name: str, config: Config, log: Sequence[Applied]
) -> Path:
    """Write ``DIRECTORY/NAME.yaml`` (the directory made if missing); its path."""
    text = scenario_of(config_name, config, log, name)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path

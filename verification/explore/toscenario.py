"""A run of the real job (``real.Run``) as a scenario file that ``agent-runtime simulate``
replays: its config as the scenario's ``config``, who is in the room as its
``participants``, each input as a step at the virtual time it was driven, and
``expect: {invariants: all}``, so simulate fails on the invariant the run broke.

The scenario runner's stand-ins end their work at once (a session's close finishes, the
agent's ``on_simulation_end`` returns, a deletion returns); the harness's wait for the
world's word. So an outcome that ends such a wait maps onto nothing, provided it comes
right after the input that began the wait; an input that comes while such a wait is open,
or an outcome the runner has no step for (a hang, a failure), makes the run not
reproducible as a scenario: ``NotReproducible`` says which input, and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from agent_runtime.testing.scenario import parse_scenario
from verification.conformance.actions import SPEECH
from verification.conformance.harness import VERDICT
from verification.conformance.paths import SETTINGS
from verification.explore.abstract import GRACE_PERIOD, PEOPLE, Config
from verification.explore.real import TIME, Applied

# outcomes the runner's stand-ins give at once, by themselves
FOLDED = frozenset(
    {"a_closed", "b_closed", "verdict_ready", "deletion_returns", "callbacks_return",
     "plugin_routed", "plugin_returns"}
)  # fmt: skip
# inputs with no scenario step, and why
REFUSED: dict[str, str] = {
    "a_hangs": "no scenario step makes a session's close hang",
    "deletion_fails": "no scenario step makes the room deletion fail",
    "callback_hangs": "no scenario step makes a shutdown callback hang",
    "plugin_fails": "the harness's avatar fails on the attempt it is told to; a scenario's "
    "avatar.start_error fails a number of attempts and the retries start at once",
    "plugin_no_route": "no scenario step makes the avatar plugin return with no route",
    "plugin_fails_late": "no scenario step makes the avatar plugin fail after its route",
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
    "shutdown": {"event": "job.shutdown", "reason": "the conformance test ends it"},
    "aclose": {"event": "job.aclose"},
    "abort": {"event": "job.aclose", "graceful": False},
    "avatar_start": {"event": "avatar.start"},
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
    if token in REFUSED:
        raise NotReproducible(REFUSED[token])
    if token not in _STEPS:
        raise NotReproducible("no scenario step does it")
    return dict(_STEPS[token])


def _steps(log: Sequence[Applied]) -> list[dict[str, Any]]:
    """Each input as a step: ``TIME`` only moves the next step's ``at``; an outcome the
    runner gives by itself maps onto nothing."""
    steps: list[dict[str, Any]] = [{"at": 0.0, "event": "session.start"}]
    for i, a in enumerate(log, 1):
        waiting = [w for w in a.waiting if w != "clear_settles"]
        what = f"input {i} ({a.token})"
        if a.token in FOLDED:
            if a.token not in waiting:
                raise NotReproducible(f"{what}: nothing waits for it")
            continue
        if a.token in REFUSED:
            raise NotReproducible(f"{what}: {REFUSED[a.token]}")
        if waiting and a.token == "end":
            raise NotReproducible(
                f"the run ends while {', '.join(waiting)} may still come: the scenario "
                "runner's stand-ins would end that work at once, and the run go on"
            )
        if waiting:
            raise NotReproducible(
                f"{what} comes while {', '.join(waiting)} may still come: the scenario "
                "runner's stand-ins end that work at once, before any other input"
            )
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
    data = {
        "name": title,
        "description": f"Written by dev.py explore --real (config {config_name}): the "
        "inputs the explorer drove, at the virtual times it drove them; every invariant "
        "is expected to hold.",
        "config": _config(config),
        "participants": [_person(who) for who in config.present],
        "steps": _steps(log),
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

"""The scenario file: the rebuilt scenario as a mapping (its config, participants, steps
and ``expect`` block) and as YAML with a header of what could not be rebuilt."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

from agent_runtime.testing.scenario import Config
from agent_runtime.tools.record._state import _ANSWERED, _DELETED, Recorded, _State
from statemachines.machines import MACHINES

ALWAYS = (
    "participants the agent found in the room when its session started are in the room at "
    "t=0: the trace does not say when they joined",
    "settings the trace does not show stay at their defaults (a timeout that never fired, "
    "unless its state was held that long: then the next whole second past the hold; "
    "delete_room_on_close when the room deletion was never asked for: a job that did not "
    "close, nor report its session's close, shows nothing of it)",
    "what the session said or heard, payloads of session requests other than "
    "finalize_simulation, and room events no machine handled are not in the trace",
)


class _FilePass(_State):
    def _scenario(self, name: str, primary: str | None) -> dict[str, Any]:
        self.steps.sort(key=lambda s: s[0])
        steps = [s for _, s in self.steps]
        end = max(r.t for r in self.records)
        steps.append({"at": end, "event": "end"})
        if self.had_inputs:
            self.note(
                "the trace holds a scenario's own inputs (simulate --trace); they are not "
                "used: the steps are rebuilt from the machines' events, as for a production trace"
            )
        doc: dict[str, Any] = {"name": name}
        identity = self._avatar_identity()
        if identity is not None:
            self.config = {"avatar_identity": identity, **self.config}
        defaults = Config()
        config = {
            k: v
            for k, v in self.config.items()
            if k == "avatar_identity" or getattr(defaults, k, object()) != v
        }
        if isinstance(config.get("agent_verdict"), dict) and config["agent_verdict"] == {
            "success": True,
            "reason": "",
        }:
            del config["agent_verdict"]
        if config:
            doc["config"] = config
        if self.participants:
            doc["participants"] = list(self.participants.values())
        doc["steps"] = steps
        doc["expect"] = self._expect()
        return doc

    def _expect(self) -> dict[str, Any]:
        finals: dict[str, str] = {}
        for r in self.records:
            if r.kind in ("transition", "ignore", "reject") and r.machine in MACHINES:
                finals[r.machine] = r.dest or r.source
        deletion = finals.get("room_deletion")
        if deletion is not None and not MACHINES["room_deletion"].state(deletion).final:
            aclosed = any(
                r.machine == "agent_job" and r.event in ("close", "abort") for r in self.records
            )
            if aclosed:
                # aclose() closes the deletion after the lifecycle, and the job's trace
                # file closed with the lifecycle: the run's last state is not the trace's
                del finals["room_deletion"]
                self.note(
                    "the room deletion's close by aclose() came after the job's trace file "
                    "closed: its final state is not in the expect block"
                )
        facts: dict[str, Any] = {}
        final_job = {s.name for s in MACHINES["job"].states if s.final}
        closed_at = next(
            (
                r.t
                for r in self.records
                if r.machine == "job" and r.kind == "transition" and r.dest in final_job
            ),
            None,
        )
        if closed_at is not None:
            facts["job_closed_at"] = closed_at
        if self.session_closed_at is not None:
            facts["session_closed_at"] = self.session_closed_at
        deleted_at = next(
            (
                r.t
                for r in self.records
                if r.machine == "room_deletion" and r.kind == "transition" and r.event in _DELETED
            ),
            None,
        )
        if deleted_at is not None:
            facts["room_deleted_at"] = deleted_at
        answered = [
            r
            for r in self.records
            if r.machine == "finalize" and r.kind == "transition" and r.event in _ANSWERED
        ]
        facts["finalize_answered"] = bool(answered)
        if answered:
            facts["verdict"] = answered[0].data.get("verdict")
        return {"final_states": dict(sorted(finals.items())), "facts": facts}


def render(recorded: Recorded, *, source: str) -> str:
    """The scenario as a YAML file: a header saying where it came from and what could not
    be rebuilt, then the scenario (each step on one line, as the bundled files are)."""
    doc = recorded.scenario
    lines = [
        "# Recorded by `agent-runtime record` from the trace",
        f"#   {source}",
        "# The steps are rebuilt from the events the machines handled (a trace holds no raw",
        "# room inputs). What the trace cannot tell, and what was assumed:",
        *_wrapped(recorded.notes, "#   - ", "#     "),
    ]
    lines.append(_dump({"name": doc["name"]}))
    for key in ("config",):
        if key in doc:
            lines.append(_dump({key: doc[key]}, flow_inner=True))
    if "participants" in doc:
        lines.append("participants:")
        lines += [f"  - {_flow(p)}" for p in doc["participants"]]
    lines.append("steps:")
    lines += [f"  - {_flow(s)}" for s in doc["steps"]]
    lines.append("expect:")
    lines.append(f"  final_states: {_flow(doc['expect']['final_states'])}")
    lines.append(f"  facts: {_flow(doc['expect']['facts'])}")
    return "\n".join(lines) + "\n"


def _flow(value: Any) -> str:
    return str(yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**6)).strip()


def _dump(value: dict[str, Any], *, flow_inner: bool = False) -> str:
    if not flow_inner:
        return str(yaml.safe_dump(value, sort_keys=False, width=10**6)).strip()
    ((key, inner),) = value.items()
    return f"{key}: {_flow(inner)}"


def _wrapped(items: Iterable[str], first: str, rest: str, width: int = 92) -> list[str]:
    out: list[str] = []
    for item in items:
        line = first
        for word in item.split():
            if len(line) + len(word) + 1 > width and line.strip("# -"):
                out.append(line.rstrip())
                line = rest
            line += word + " "
        out.append(line.rstrip())
    return out

"""The config the events reveal: timeouts (from the ``after`` each timeout event carries,
or how long a state was held without one), a simulation, the agent's verdict, a room that
connected late, ``close_on_disconnect``, a configured participant identity,
``retry_avatar``'s restarts and backoff, ``delete_room_on_close``; and where the work a
scenario's runner stands in for did not end as it would there."""

from __future__ import annotations

import math
from typing import Any

from agent_runtime.observe.trace import TraceRecord
from agent_runtime.settings import (
    ALL_CAUSES,
    DEFAULT_CLOSING_REASONS,
    DEFAULT_PARTICIPANT_KINDS,
    MAX_WAIT,
    Backoff,
    PlayoutOptions,
)
from agent_runtime.testing.result import seconds_text as secs
from agent_runtime.testing.scenario import Config
from agent_runtime.tools.record._state import _ANSWERED, _DELETED, _SESSION_CLOSE_REPORTS, _State
from statemachines.machines import MACHINES

_PUBLISH_ON_BEHALF = "lk.publish_on_behalf"
# the avatar's events whose rows read its rejoin guard: a late join, an attempt given up
_REJOIN_READ = frozenset({"avatar_connected", "route_restored"})
# the work the scenario runner stands in for: the event that ends it well, and what it does
_STAND_INS: dict[str, tuple[frozenset[str], str]] = {
    "room_deletion": (_DELETED, "the room deletion succeeds at once"),
    "finalize": (
        frozenset({"verdict_ready"}),
        "on_simulation_end returns at once and its reply goes out",
    ),
}

# timeouts whose setting another pass derives: the avatar's backoff (``_retry``), the
# playout bound (``margin``, by the speech pass) and the watchdog's (playout options)
_DERIVED = ("retry_backoff", "playout_bound", *PlayoutOptions.model_fields)


def _outlasting(held: float) -> float:
    """A timeout longer than ``held``, for a state held that long without it firing: the
    next whole second past it. Not ``held`` itself: a timeout due at the instant of the event
    that ended the state fires before that event in the replay."""
    return float(math.floor(held) + 1)


def _timeouts() -> dict[tuple[str, str], tuple[str, str, float]]:
    """(machine, state) -> (its timeout event, setting, default), from the specs (two states
    may time out with the same event: the avatar's releasing and retiring)."""
    out: dict[tuple[str, str], tuple[str, str, float]] = {}
    for m in MACHINES.values():
        for s in m.states:
            if s.timeout is not None:
                out[(m.name, s.name)] = (s.timeout.event, s.timeout.setting, s.timeout.default)
    return out


class _ConfigPass(_State):
    def _settings(self) -> None:
        entered: dict[tuple[str, str], float] = {}
        held: dict[tuple[str, str], float] = {}
        fired: dict[str, float] = {}
        timeouts = _timeouts()
        states_with_timeouts = set(timeouts)
        last = max(r.t for r in self.records)
        linked: str | None = None
        refused_eligible = False
        for r in self.records:
            if r.kind != "transition":
                if r.machine == "participant" and r.event == "participant_connected":
                    refused_eligible |= self._refused(r)
                continue
            m = r.machine
            spec = timeouts.get((m, r.source or ""))
            if spec is not None and spec[0] == r.event:
                after = r.data.get("after")
                since = entered.get((m, r.source), 0.0)
                value = after if isinstance(after, int | float) else r.t - since
                fired.setdefault(spec[1], float(value))
                if spec[1] not in (*Config.model_fields, *_DERIVED):
                    self.note(
                        f"t={secs(r.t)}: {m} left {r.source} on {r.event} after "
                        f"{secs(float(value))}s; a scenario cannot set {spec[1]}, and what "
                        f"{r.source} waited for "
                        "ends at once in one"
                    )
            if r.source != r.dest:
                if (m, r.source) in entered:
                    start = entered.pop((m, r.source))
                    held[(m, r.source)] = max(held.get((m, r.source), 0.0), r.t - start)
                if (m, r.dest) in states_with_timeouts:
                    entered[(m, r.dest)] = r.t
            g, d = r.guards, r.data
            if (m == "job" and g.get("hold_needed")) or (m == "finalize" and g.get("simulation")):
                self.config["simulation"] = True
            if m == "participant" and r.event == "participant_connected":
                if r.source == "waiting" and r.dest != "waiting" and linked is None:
                    linked = str(d.get("identity"))
                refused_eligible |= self._refused(r)
            if m == "participant" and r.event == "participant_disconnected" and g.get("is_linked"):
                if g.get("closing_reason") is False and d.get("reason") in DEFAULT_CLOSING_REASONS:
                    self.config["close_on_disconnect"] = False
                elif g.get("closing_reason") is False and g.get("grace_enabled") is False:
                    fired.setdefault("grace_period", 0.0)
            # a late join routed to again, or an attempt given up and kept for one
            if m == "avatar" and r.event in _REJOIN_READ and g.get("rejoin"):
                self.config["retry_avatar"] = True
            if m == "finalize" and r.event in _ANSWERED:
                self.config["simulation"] = True
                verdict = d.get("verdict")
                if isinstance(verdict, dict):
                    self.config["agent_verdict"] = {
                        "success": bool(verdict.get("success")),
                        "reason": str(verdict.get("reason", "")),
                    }
        for (m, s), start in entered.items():  # still held when the trace ends
            held[(m, s)] = max(held.get((m, s), 0.0), last - start)
        for (m, s), (_, setting, default) in timeouts.items():
            # a setting of the playout machine's is one of its options
            into = self.playout if setting in PlayoutOptions.model_fields else self.config
            if into is self.config and setting not in Config.model_fields:
                continue
            if setting in fired:
                into[setting] = fired[setting]
            elif held.get((m, s), 0.0) >= default:
                # held that long without its timeout: the setting was longer (than every
                # state that takes it was held)
                longer = _outlasting(held[(m, s)])
                into[setting] = max(longer, float(into.get(setting, 0.0)))
        if refused_eligible and linked is not None:
            self.config["participant_identity"] = linked

    def _retry(self) -> None:
        """``retry_avatar``'s restarts and backoff, from the avatar's own decisions: each
        ``failed -> backoff`` is a restart the policy allowed, each wait in ``backoff`` one of
        its delays, and each wait left on another event (or still waited when the trace
        ends) was shorter than its delay. The rebuilt policy allows exactly the restarts
        seen (a trace that ends before the policy gave up shows no more); a cause refused
        while restarts were still to come was not transient."""
        restarts: list[str] = []
        refused: list[tuple[int, str]] = []  # (restarts done then, cause)
        delays: list[float] = []
        # the waits the timer did not end: (restarts made before, seconds held since the
        # wait last started, left at)
        cut: list[tuple[int, float, float]] = []
        since: float | None = None
        for r in self.records:
            if r.kind != "transition" or r.machine != "avatar":
                continue
            if r.source == "failed" and r.event == "route_restored":
                cause = str(r.data.get("cause", ""))
                if r.dest == "backoff":
                    restarts.append(cause)
                elif r.guards.get("retry_left") is False:
                    refused.append((len(restarts), cause))
            if r.dest == "backoff" and r.source != "backoff":
                since = r.t
            elif r.source == "backoff" and since is not None:
                after = r.data.get("after")
                if r.event == "backoff_elapsed":
                    # a wait started again (backoff -> backoff) shows its delay as well
                    if len(delays) < len(restarts):
                        delays.append(
                            float(after) if isinstance(after, int | float) else r.t - since
                        )
                elif r.dest != "backoff" and len(delays) < len(restarts):
                    # closed (or rejoined) while it waited, measured from its last start
                    cut.append((len(delays), r.t - since, r.t))
                since = r.t if r.dest == "backoff" else None
        if since is not None and len(delays) < len(restarts):
            last = max(r.t for r in self.records)
            cut.append((len(delays), last - since, last))
        if not restarts:
            return
        policy: dict[str, Any] = {"attempts": len(restarts)}
        if not any(done == len(restarts) for done, _ in refused):
            self.note(
                f"retry_avatar.attempts is {len(restarts)}, the restarts the trace shows: "
                "the avatar never ran out of them, so the job may have allowed more"
            )
        backoff = self._backoff(delays, cut)
        if backoff is not None:
            policy["backoff"] = backoff
        not_transient = {c for done, c in refused if done < len(restarts)} - set(restarts)
        if not_transient:
            policy["transient"] = sorted(ALL_CAUSES - not_transient)
        if self.config.get("retry_avatar") is True:
            policy["rejoin"] = True
        self.config["retry_avatar"] = policy
        self._unheard_rearms()

    def _unheard_rearms(self) -> None:
        """A backoff started again while the agent spoke in the room, in a trace with no
        playout machine: the speech is in no record, and the rebuilt run does not wait."""
        again = [
            r.t
            for r in self.records
            if r.kind == "transition" and r.machine == "avatar" and r.source == r.dest == "backoff"
        ]
        if again and not self.of("playout"):
            self.note(
                f"t={', '.join(secs(t) for t in again)}: the avatar's backoff started again "
                f"while the agent was speaking in the room; with the playout machine off the "
                f"trace holds no speech, so the rebuilt run starts the retry at the first "
                f"backoff's end (record --check names where it differs)"
            )

    def _backoff(
        self, delays: list[float], cut: list[tuple[int, float, float]]
    ) -> dict[str, float] | None:
        """The backoff the waits show (None: the default). ``delays[n]`` is the delay
        before restart ``n``, its wait ended on its timer; each of ``cut``, ``(n, held, t)``,
        was left at ``t`` after ``held`` seconds on another event: the delay before restart
        ``n`` was longer. What the delays fix is kept (the first one the initial, the second
        the growth, one short of the growth the cap); what they do not (the defaults) is
        raised to outlast each cut wait."""
        default = Backoff()
        initial, multiplier, cap = default.initial, default.multiplier, default.max
        cap_seen = False
        if delays:
            initial = delays[0]
            multiplier = delays[1] / initial if len(delays) > 1 and initial > 0 else 2.0
            multiplier = min(10.0, max(1.0, multiplier))
            grown = [initial * multiplier**n for n in range(len(delays))]
            # a delay short of the growth is the cap; otherwise the default cap, or above
            capped = [d for d, g in zip(delays, grown, strict=True) if d < g - 1e-9]
            cap_seen = bool(capped)
            cap = min(capped) if capped else max(30.0, max(delays))
        changed = bool(delays)
        for n, held, t in cut:
            delay = Backoff.model_construct(initial=initial, multiplier=multiplier, max=cap).delay
            if delay(n) > held:
                continue
            need = min(_outlasting(held), float(MAX_WAIT))
            if not delays:  # the first wait (no delay came before it): the initial
                initial = need
            elif n == 1 and len(delays) == 1 and initial > 0:  # the growth no delay shows
                multiplier = min(10.0, max(multiplier, need / initial))
            if not cap_seen:
                cap = max(cap, need, initial)
            changed = True
            delay = Backoff.model_construct(initial=initial, multiplier=multiplier, max=cap).delay
            if delay(n) <= held:
                self.note(
                    f"t={secs(t)}: the avatar waited {secs(held)}s to restart and its backoff "
                    f"did not end the wait; the backoff the trace's other waits show ends it "
                    f"after {secs(delay(n))}s, so the replay restarts the avatar then"
                )
        if not changed:
            return None
        return {"initial": initial, "multiplier": multiplier, "max": cap}

    def _deletion(self) -> None:
        """``delete_room_on_close``, from who asked for the room's deletion. With it, the
        job's close work asks just before it allows the deletion, and the attached session's
        close asks as the host reports it; a request at any other moment is the agent's own
        (``request_room_deletion``), the step ``job.request_room_deletion``."""
        recs = self.of("room_deletion")
        if not recs:
            return
        by_close: set[int] = set()
        allowed_unasked = False
        for k, (_, r) in enumerate(recs):
            if r.event != "allow":
                continue
            before = recs[k - 1][1] if k else None
            if before is not None and before.event == "request" and before.t == r.t:
                by_close.add(recs[k - 1][0])
            else:
                allowed_unasked = True  # the close work allowed it without asking: off
        by_session: set[int] = set()
        reported: int | None = None  # the last session close the host reported, unanswered
        for i, r in enumerate(self.records):
            if r.kind not in ("transition", "ignore", "reject"):
                continue
            if (
                r.machine == "session_host"
                and r.event in _SESSION_CLOSE_REPORTS
                and "report_session_closed" in r.effects
            ):
                reported = i
            elif r.machine == "room_deletion":
                if (
                    r.event == "request"
                    and reported is not None
                    and self.records[reported].t == r.t
                ):
                    by_session.add(i)
                reported = None
        on = not allowed_unasked and bool(by_close or by_session)
        if on:
            self.config["delete_room_on_close"] = True
        for i, r in recs:
            if r.event == "request" and not (on and i in by_close | by_session):
                self.step(i, r.t, "job.request_room_deletion")

    def _stand_ins(self) -> None:
        """The work a scenario's runner stands in for ends at once and never fails: the room
        deletion, ``on_simulation_end`` and the verdict's reply. Say where the trace's did
        not."""
        for machine, (result, what) in _STAND_INS.items():
            spec = MACHINES[machine]
            failures = {e.error_event: e.name for e in spec.effects if e.error_event}
            entered: float | None = None
            for _, r in self.of(machine):
                if r.kind != "transition" or r.source == r.dest:
                    continue
                # an error event that is also the work's own outcome (verdict_ready: a
                # failed on_simulation_end is answered too) is a failure only when the
                # transition names the effect that failed
                failed = r.event in failures and (
                    r.event not in result or r.data.get("effect") == failures[r.event]
                )
                if failed:
                    self.note(
                        f"t={secs(r.t)}: {machine} got {r.event} ({failures[r.event]} failed); "
                        f"in a scenario {what}"
                    )
                elif spec.state(r.source).invoke and (
                    r.event not in result or (entered is not None and r.t > entered)
                ):
                    took = f" after {secs(r.t - entered)}s" if entered is not None else ""
                    self.note(
                        f"t={secs(r.t)}: {machine} left {r.source} on {r.event}{took}; "
                        f"in a scenario {what}"
                    )
                if spec.state(r.dest).invoke:
                    entered = r.t

    @staticmethod
    def _refused(r: TraceRecord) -> bool:
        """A participant of a linkable kind that was not linked (a configured identity)."""
        attrs = r.data.get("attributes") or {}
        return (
            r.guards.get("eligible") is False
            and r.data.get("kind") in DEFAULT_PARTICIPANT_KINDS
            and _PUBLISH_ON_BEHALF not in attrs
        )

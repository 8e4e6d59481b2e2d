"""The avatar channel: the user's starts and closes of the avatar (with the plugin's starts
that raised), interruptions with the outcome of the ``lk.clear_buffer`` RPC that followed
(but the one the session's close makes), and the avatar's ``lk.playback_finished`` RPCs
(but the playout bound's own finish, a declared link)."""

from __future__ import annotations

from typing import Any

from agent_runtime.observe.trace import TraceRecord
from agent_runtime.testing.inmemory_participant import RPC_ROUND_TRIP_BUDGET
from agent_runtime.testing.result import seconds_text as secs
from agent_runtime.tools.record._state import _State

_RPC_TIMEOUT_CODES = frozenset({1501, 1502})  # CONNECTION_TIMEOUT, RESPONSE_TIMEOUT
_RPC_GONE = {1503: "disconnected", 1401: "not_found"}  # RECIPIENT_DISCONNECTED / _NOT_FOUND


class _AvatarPass(_State):
    def _avatar_input(self, i: int, r: TraceRecord, ending: int) -> None:
        e = r.event
        if i in self.linked:
            return  # another machine's effect posted it (the playout bound's finish)
        if e == "start":
            self._avatar_start(i, r)
        elif e == "close":
            if i < ending:
                self.step(i, r.t, "avatar.close")
        elif e == "interrupt":
            if r.data.get("origin") == "session" and r.t == self.primary_closed_at:
                return  # the session's close cut the agent's speech: it follows by itself
            # the plugin's own clear is the task of `clearing` (the avatar is joined)
            if r.dest == "clearing":
                done = self._next_avatar(i, "clear_buffer_done", until="interrupt")
                result = None if done is None else _rpc_result(done.data)
                if done is not None and result is None:
                    result = self._plugin_clear(r, done)
                if done is not None and result is not None:
                    # a timeout waits the SDK's round trip in the replay (a scenario's config
                    # has no clear_buffer_timeout: record refused its own file with it)
                    self.step(i, r.t, "rpc_outcome", method="lk.clear_buffer", result=result)
            self.step(i, r.t, "session.interrupt")
        elif e == "playback_finished":
            payload = {k: r.data[k] for k in ("playback_position", "interrupted") if k in r.data}
            self.step(
                i,
                r.t,
                "rpc",
                method="lk.playback_finished",
                caller=self._avatar_identity() or "avatar",
                payload=payload,
            )

    def _plugin_clear(self, interrupt: TraceRecord, done: TraceRecord) -> str | None:
        """The plugin's own clear, whose ``lk.clear_buffer`` RPC the trace does not hold:
        one that took the SDK's round-trip budget was that RPC unanswered (a timeout:
        the plugin then counts the playout done at once); one that took another time is
        rebuilt as answered at once, said in the file's header."""
        took = done.t - interrupt.t
        if abs(took - RPC_ROUND_TRIP_BUDGET) <= 1e-3:
            self.note(
                f"t={secs(interrupt.t)}: the avatar plugin's own clear took "
                f"{secs(RPC_ROUND_TRIP_BUDGET)} s, the SDK's round-trip budget: its "
                "lk.clear_buffer RPC (not in the trace) is rebuilt as timing out"
            )
            return "timeout"
        return None

    def _avatar_start(self, i: int, r: TraceRecord) -> None:
        """The user's avatar start at ``i``, with the plugin's starts that raised: a
        scenario scripts the first ones (``avatar.start_error {times}``), or every one; when
        a start (the first or a retry) never ended by itself before the avatar closed or
        the trace ended, every start is held and ended where the trace shows
        (``_held_start``)."""
        if self._starts_held():
            self._held_start(i, r)
            return
        attempts = [
            self.records[n] if how == "raised" else None
            for n, how in self._plugin_starts(i)[0]
            if how != "timed_out"
        ]
        raised = [a for a in attempts if a is not None]
        leading = next((n for n, a in enumerate(attempts) if a is None), len(attempts))
        if leading < len(raised):  # one raised after a start that did not
            later = raised[leading]
            self.note(
                f"t={secs(later.t)}: a retry's plugin start raised after an earlier one did "
                "not; a scenario scripts only the first starts' failures, so the replay's "
                "retry starts"
            )
        if leading == 0:
            self.step(i, r.t, "avatar.start")
            return
        first = raised[0]
        # a state task that raised reports no outcome: it is an error
        outcome = first.data.get("outcome", "error")
        if outcome != "error":
            self.note(
                f"t={secs(r.t)}: the avatar plugin's start ended in {outcome} at "
                f"t={secs(first.t)}; replayed as a start that raises at once"
            )
        if leading == len(attempts):
            self.step(i, r.t, "avatar.start_error")  # every attempt raised
        else:
            self.step(i, r.t, "avatar.start_error", times=leading)

    def _held_start(self, i: int, r: TraceRecord) -> None:
        """The user's start at ``i`` with the provider's side held (``config.hold``): each
        plugin start that ended is ended by a ``held.end`` step where the trace shows it,
        one still running at the avatar's close (or the trace's end) is left held."""
        held = self.config.setdefault("hold", [])
        if "avatar_start" not in held:
            held.append("avatar_start")
        self.step(i, r.t, "avatar.start")
        end = {"event": "held.end", "call": "avatar_start"}
        for n, how in self._plugin_starts(i)[0]:
            t = self.records[n].t
            if how == "no_route":
                self.steps.append((n, {"at": t, **end, "result": "no_route"}))
            elif how == "returned":  # with its route in
                self.steps.append((n, {"at": t, **end, "result": "routed"}))
                self.steps.append((n, {"at": t, **end, "result": "ok"}))
            elif how == "raised":
                outcome = self.records[n].data.get("outcome", "error")
                if outcome != "error":
                    self.note(
                        f"t={secs(t)}: the avatar plugin's start ended in {outcome}; "
                        "replayed as a start that raises then"
                    )
                self.steps.append((n, {"at": t, **end, "result": "error"}))
            # timed_out: left held, the runtime's start_timeout ends it as it did

    def _starts_held(self) -> bool:
        """Whether a plugin start (a user's start or a retry) never ended by itself before
        the avatar closed or the trace ended, ``start_timeout`` cut it, or it took time: a
        scenario holds the avatar's starts then."""
        if self._held_starts is None:
            self._held_starts = any(
                self._plugin_starts(i)[1]
                for i, r in enumerate(self.records)
                if r.machine == "avatar" and r.kind == "transition" and r.event == "start"
            )
        return self._held_starts

    def _plugin_starts(self, start: int) -> tuple[list[tuple[int, str]], bool]:
        """How each plugin start of the user's ``start`` at ``start`` and its retries ended,
        in order: (the index of the record that says so, ``raised``, ``returned``,
        ``no_route`` or ``timed_out``: the runtime's ``start_timeout``), and whether a
        scenario must hold them to end each where the trace shows: one more began (the
        user's, or a retry) and never ended, one was cut by ``start_timeout`` or returned
        without a route, or one took time (the provider's call: an avatar joining meanwhile
        is seen only by the start's end, not at once as after an instant start)."""
        out: list[tuple[int, str]] = []
        began = 1 if self.records[start].kind == "transition" else 0
        since = [self.records[start].t]  # when each start began
        for n in range(start + 1, len(self.records)):
            r = self.records[n]
            if r.machine != "avatar" or r.kind == "effect":
                continue
            if r.event in ("start", "close"):
                break  # the user's next start, or the end
            if r.kind == "transition" and r.dest == "starting" and r.source != "starting":
                began += 1  # a retry's start, once the last attempt is released
                since.append(r.t)
            elif r.event == "start_error" and r.data.get("effect") == "start_plugin":
                out.append((n, "raised"))
            elif r.event == "plugin_started":
                out.append((n, "returned"))
            elif r.event == "no_route":
                out.append((n, "no_route"))
            elif r.event == "start_timeout" and r.kind == "transition":
                out.append((n, "timed_out"))
        took_time = any(self.records[n].t > t for (n, _), t in zip(out, since, strict=False))
        # only a held start can return without a route (``held.end`` ``no_route``)
        held = began > len(out) or any(how in ("timed_out", "no_route") for _, how in out)
        return out, held or took_time

    def _next_avatar(self, start: int, event: str, *, until: str) -> TraceRecord | None:
        for r in self.records[start + 1 :]:
            if r.machine != "avatar" or r.kind == "effect":
                continue
            if r.event == event:
                return r
            if r.event == until:
                return None
        return None


def _rpc_result(data: dict[str, Any]) -> str | None:
    """An ``lk.clear_buffer`` outcome as the scenario's ``rpc_outcome`` result; None when
    the trace says nothing of it (the plugin's own clear settled: its RPC is not traced)."""
    outcome, code = data.get("outcome"), data.get("code")
    if outcome is None and code is None:
        return None
    if outcome == "ok":
        return "ok"
    if outcome == "timeout" or code in _RPC_TIMEOUT_CODES:
        return "timeout"
    return _RPC_GONE.get(code, "error") if isinstance(code, int) else "error"

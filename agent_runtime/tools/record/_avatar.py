"""The avatar channel: the user's starts and closes of the avatar (with the plugin's starts
that raised), interruptions with the outcome of the ``lk.clear_buffer`` RPC that followed
(but the one the session's close makes), and the avatar's ``lk.playback_finished`` RPCs
(but the playout bound's own finish, a declared link)."""

from __future__ import annotations

from typing import Any

from agent_runtime.observe.trace import TraceRecord
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
                if done is not None and result is not None:
                    self.step(i, r.t, "rpc_outcome", method="lk.clear_buffer", result=result)
                    if result == "timeout" and done.t > r.t:
                        self.config.setdefault("clear_buffer_timeout", done.t - r.t)
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

    def _avatar_start(self, i: int, r: TraceRecord) -> None:
        """The user's avatar start at ``i``, with the plugin's starts that raised: a
        scenario scripts the first ones (``avatar.start_error {times}``), or every one; a
        start that never ended is held (``config.hold``)."""
        attempts = self._plugin_starts(i)
        raised = [a for a in attempts if a is not None]
        leading = next((n for n, a in enumerate(attempts) if a is None), len(attempts))
        if leading < len(raised):  # one raised after a start that did not
            later = raised[leading]
            self.note(
                f"t={secs(later.t)}: a retry's plugin start raised after an earlier one did "
                "not; a scenario scripts only the first starts' failures, so the replay's "
                "retry starts"
            )
        if not attempts:
            # the plugin's start neither returned nor raised before the avatar closed or the
            # trace ended: it was still running, as a held start is
            held = self.config.setdefault("hold", [])
            if "avatar_start" not in held:
                held.append("avatar_start")
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

    def _plugin_starts(self, start: int) -> list[TraceRecord | None]:
        """Each plugin start of the user's ``start`` at ``start`` and its retries, in
        order: the ``start_error`` it raised, or None when it returned."""
        out: list[TraceRecord | None] = []
        for r in self.records[start + 1 :]:
            if r.machine != "avatar" or r.kind == "effect":
                continue
            if r.event in ("start", "close"):
                break  # the user's next start, or the end
            if r.event == "start_error" and r.data.get("effect") == "start_plugin":
                out.append(r)
            elif r.event in ("plugin_started", "no_route"):
                out.append(None)
        return out

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

"""The session and job channel: the agent's own inputs in order (the session started or
another attached, the session closing for a reason of its own, the job asked to shut down
or closed by the user's ``aclose()``), handing the avatar's and the session requests' to
their passes."""

from __future__ import annotations

from agent_runtime.system.job_system import LIFECYCLE_SHUTDOWN
from agent_runtime.testing.result import seconds_text as secs
from agent_runtime.testing.scenario import CLOSE_REASONS
from agent_runtime.tools.record._avatar import _AvatarPass
from agent_runtime.tools.record._requests import _RequestPass
from statemachines.machines import MACHINES
from statemachines.session_host import REQUESTS

# a session closing for one of these follows from something else in the trace
_CONSEQUENT_CLOSES = frozenset({"participant_disconnected", "job_shutdown"})


class _SessionPass(_AvatarPass, _RequestPass):
    def _ending_index(self, primary: str | None) -> int:
        """The first record showing the job ending: a shutdown asked, the primary session
        closed, or the job leaving its initial state (what closes the avatar by itself)."""
        initial = MACHINES["job"].initial
        for i, r in enumerate(self.records):
            if r.kind not in ("transition", "ignore", "reject"):
                continue
            if r.machine == "job" and (r.event == "shutdown" or r.dest != initial):
                return i
            primary_closed = r.machine == "participant" or r.data.get("session") == primary
            if r.event == "session_closed" and r.kind == "transition" and primary_closed:
                return i
        return len(self.records)

    def _primary_label(self) -> str | None:
        for _, r in self.of("session_host"):
            if r.event == "attach" and r.data.get("session"):
                return str(r.data["session"])
        return None

    def _inputs(self, primary: str | None, ending: int) -> None:
        recs = self.records
        attached: set[str] = set()
        closed = False
        given_up_at: float | None = None
        lifecycle_close_at: float | None = None
        for i, r in enumerate(recs):
            m, e, d = r.machine, r.event, r.data
            if r.kind not in ("transition", "ignore", "reject"):
                continue
            if m == "session_host" and e == "attach":
                label = str(d.get("session", ""))
                if label in attached:
                    self.note(f"t={secs(r.t)}: {label} attached again; a scenario cannot do that")
                    continue
                attached.add(label)
                if label == primary:
                    self.step(i, r.t, "session.start")
                else:
                    self.step(i, r.t, "session.attach", session=label)
            elif e == "session_closed" and m in ("session_host", "participant", "job"):
                reason = str(d.get("reason", ""))
                if m == "session_host" and d.get("session") != primary:
                    if reason not in _CONSEQUENT_CLOSES:
                        self.note(
                            f"t={secs(r.t)}: {d.get('session')} closed ({reason}); a scenario "
                            "closes only the primary session"
                        )
                    continue
                if closed or reason not in CLOSE_REASONS:
                    continue
                closed = True
                self.session_closed_at = r.t
                # the watchdog's hand-over closes it by itself (when_exhausted: close)
                if reason not in _CONSEQUENT_CLOSES and r.t != self.watchdog_closed_at:
                    self.step(i, r.t, "session.close", reason=reason)
                    if any(s.event == "speech_done" and s.t == r.t for _, s in self.of("playout")):
                        self.note(
                            f"t={secs(r.t)}: the session closed ({reason}) as the agent's "
                            "speech ended: a session's shutdown lets the speech in progress "
                            "end first, and the trace does not show when it was asked; it "
                            "is rebuilt as a close at that instant"
                        )
            elif m == "participant" and e == "session_close_timeout":
                given_up_at = r.t
            elif m == "participant" and e == "close_failed" and r.kind == "transition":
                given_up_at = r.t  # the job's shutdown that follows is its own answer
                self.note(
                    f"t={secs(r.t)}: the session could not be asked to close "
                    f"({d.get('detail', 'no detail')}): the link gave up on it and the job "
                    "shut down; no scenario step does that"
                )
            elif m == "agent_job" and e in ("close", "abort"):
                # the user's aclose(): the job machine's shutdown (or abort) follows from it
                lifecycle_close_at = r.t
                if e == "close":
                    self.step(i, r.t, "job.aclose")
                else:
                    self.step(i, r.t, "job.aclose", graceful=False)
            elif m == "job" and e == "shutdown":
                if given_up_at is not None and r.t == given_up_at:
                    continue  # the job's own answer to a session close given up on
                if lifecycle_close_at == r.t and d.get("reason") == LIFECYCLE_SHUTDOWN:
                    continue  # asked by the user's aclose(), a step already
                self.step(i, r.t, "job.shutdown", reason=str(d.get("reason", "")))
            elif m == "avatar":
                self._avatar_input(i, r, ending)
            elif m == "session_host" and e in REQUESTS:
                self._request(i, r)

"""The invariants checked on a scenario's run (``expect: invariants``): the job's view
(``observe.runtime_view``) after the start, after every step and every deadline the run
lets pass, checked as the explorer checks the real job (``checks.safety`` and
``checks.settled``, and each decision of the playout machine as it is made:
``playout.PlayoutJudge``), and ``checks.eventual`` at the end when no timer is left."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from livekit.agents import AgentSession

from agent_runtime.observe.trace import Tracer, TraceRecord
from agent_runtime.system.agent_job import AgentJob
from agent_runtime.testing.invariants.checks import (
    BY_NUMBER,
    LIVE_JOB,
    Finding,
    eventual,
    safety,
    settled,
)
from agent_runtime.testing.invariants.observe import Observed, Sent, runtime_view, session_state
from agent_runtime.testing.invariants.playout import PlayoutJudge


class InvariantWatch:
    """What a scenario's run shows of its job, and the first violation of each invariant."""

    def __init__(
        self,
        job: AgentJob,
        sessions: Mapping[str, AgentSession[Any]],
        records: list[TraceRecord],
        now: Callable[[], float],
        hung: Callable[[], bool] = lambda: False,
        tracer: Tracer | None = None,
    ) -> None:
        """``hung``: whether the primary session's close was told to hang (held);
        ``tracer``: the job's, for the playout machine's decisions to be judged."""
        self.job, self.sessions, self.records, self.now = job, sessions, records, now
        self.hung = hung
        self.observed = Observed()
        self.observed.watch_job(job)
        self.observed.watch_rpcs(job)
        self.violations: list[dict[str, Any]] = []
        self.judge: PlayoutJudge | None = None
        if tracer is not None and job.playout is not None:
            self.judge = PlayoutJudge(job)
            tracer.sinks.append(self.judge)

    def sent(self, request_id: str, caller: str) -> None:
        """A ``finalize_simulation`` the scenario's simulator end sent."""
        simulator = caller in self.job.job.simulators
        owed = simulator and self.job.job.state in LIVE_JOB
        self.observed.sent.append(Sent(request_id, simulator, owed))

    def replied(self, request_id: str, kind: str) -> None:
        self.observed.replies.setdefault(request_id, []).append(kind)

    def deletion(self) -> None:
        self.observed.deletions.append(self.job.job.state)

    def _session(self) -> str:
        return session_state(self.sessions["a"], hung=self.hung())

    def check(self, where: str, *, end: bool = False) -> None:
        """Check the job's view now (``where``: the step just done); ``end``: the run is
        over and no timer is left, so what must hold once every bound passed applies too."""
        names = {"A" if n == "a" else n: s for n, s in self.sessions.items()}
        view = runtime_view(
            self.job, self.observed, self.records, sessions=names, session=self._session()
        )
        found: list[Finding] = [*safety(view), *settled(view), *(eventual(view) if end else ())]
        if self.judge is not None:
            found += self.judge.findings
        for number, detail in sorted(found):
            if any(v["invariant"] == number for v in self.violations):
                continue
            inv = BY_NUMBER[number]
            self.violations.append(
                {"invariant": number, "name": inv.name, "t": self.now(), "after": where,
                 "detail": detail}
            )  # fmt: skip

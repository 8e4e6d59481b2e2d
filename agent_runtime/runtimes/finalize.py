"""``FinalizeAnswer``: the answer to the simulator's ``finalize_simulation``, driven by the
``finalize`` machine.

Owned by the job's session host, which forwards every well-formed finalize to it. The
agent's ``on_simulation_end`` runs as the task of ``answering``; its verdict is kept, so a
reply that could not be delivered, or that the simulator stopped waiting for, is sent again
when it asks again, without running it twice. See ``statemachines.finalize`` for the table.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from livekit.agents.simulation import SimulationContext, SimulationVerdict
from livekit.protocol import agent_simulation as sim_pb
from livekit.protocol.agent_pb import agent_session as agent_pb

from agent_runtime._messages import Reported
from agent_runtime.actor import Event, Output, effect_table
from agent_runtime.clock import AsyncioClock, Clock
from agent_runtime.observe.trace import Tracer
from agent_runtime.runtimes._base import Hear, MachineRuntime, released
from agent_runtime.runtimes.routing import Wiring
from agent_runtime.scheduler import Scheduler, after
from agent_runtime.sdk import livekit_compat as lk
from statemachines.finalize import FINALIZE

logger = logging.getLogger("agent_runtime.finalize")

FINALIZE_UNFINISHED = "on_simulation_end did not finish before the session host closed"
SimulationEndFn = Callable[[SimulationContext], Any]
SendFn = Callable[[agent_pb.AgentSessionMessage], Awaitable[None]]
FinalizeResult = agent_pb.SessionResponse.FinalizeSimulationResponse


@dataclass(frozen=True, slots=True)
class _Delivered:
    request_id: str
    verdict: dict[str, Any] | None


class FinalizeAnswer(MachineRuntime[str]):
    """One job's answer to ``finalize_simulation``. ``state_changed`` listeners go on
    ``actor`` (the session host forwards them).

    ``send`` puts a message on the job's session transport; every reply it makes is bounded
    by ``reply_timeout``. ``on_answered(verdict)`` is called once the verdict went out,
    and the declared links of ``report_answered`` fire on ``wiring`` (the job hears it).
    """

    def __init__(
        self,
        send: SendFn,
        *,
        simulation: SimulationContext | None,
        on_simulation_end: SimulationEndFn | None = None,
        on_answered: Callable[[dict[str, Any] | None], None] | None = None,
        reply_timeout: float = 3.0,
        clock: Clock | None = None,
        tracer: Tracer | None = None,
        scheduler: Scheduler | None = None,
        instance: str = "",
        wiring: Wiring | None = None,
        owner: Hear | None = None,
    ) -> None:
        super().__init__()
        self._send = send
        self._simulation = simulation
        self._on_simulation_end = on_simulation_end
        self._on_answered = on_answered
        # the verdict of on_simulation_end (and its error, if it failed), kept for a retry
        self._result: tuple[FinalizeResult, str] | None = None
        self._request: dict[str, Any] = {}  # the request being answered
        # every request the verdict being computed answers: the first, then each the
        # simulator sent again meanwhile
        self._waiting: list[str] = []
        self._delivered: _Delivered | None = None
        # the shared guard (statemachines.glue) reads this answer as its facts view
        self._run_machine(
            FINALIZE,
            _EFFECTS,
            instance=instance,
            clock=clock or AsyncioClock(),
            tracer=tracer,
            scheduler=scheduler,
            effect_timeout=reply_timeout,
            hear=owner,  # its owner (the host) hears the actor itself: nothing to add
            wiring=wiring,
            post=self._post,
        )

    @property
    def answered(self) -> bool:
        """The verdict reached the transport."""
        return self._delivered is not None

    @property
    def verdict(self) -> dict[str, Any] | None:
        """The agent's own verdict as delivered (``user_verdict``), or ``None``."""
        return self._delivered.verdict if self._delivered is not None else None

    def ask(self, data: Mapping[str, Any]) -> None:
        """A well-formed finalize: ``request_id``, ``provisional_success``,
        ``provisional_reason``."""
        self._post(Event("request", dict(data)))

    async def settled(self) -> None:
        """Wait until no answer is being computed or sent (the caller bounds the wait)."""
        await released(self.when_settled())

    def when_settled(self) -> asyncio.Future[None] | None:
        """``settled()`` as a future, or None when it is so now."""
        return self.actor.when_settled(_not_answering)

    async def aclose(self) -> None:
        await released(self.release())

    def release(self) -> asyncio.Future[None] | None:
        """``aclose()`` without its wait: a reply under way (bounded by ``reply_timeout``)
        ends first."""
        return after(self.actor.when_settled(), self.actor.release)

    @property
    def is_simulation(self) -> bool:
        """What the machine's guard reads (``statemachines.glue.FinalizeFacts``)."""
        return self._simulation is not None

    # -- effects -------------------------------------------------------------------------------

    def _fx_take_request(self, ev: Event) -> None:
        # an effect of the step that entered `answering`: it runs before the state's task
        # gets its first turn of the loop
        self._request = dict(ev.data)
        self._waiting = [str(ev.data.get("request_id", ""))]

    def _fx_await_verdict(self, ev: Event) -> None:
        self._waiting.append(str(ev.data.get("request_id", "")))

    async def _fx_compute_verdict(self, _ev: Event) -> Event:
        if self._result is None:
            await self._run_on_simulation_end(self._request)
        return Event("verdict_ready", {"request_id": self._request.get("request_id", "")})

    async def _run_on_simulation_end(self, data: Mapping[str, Any]) -> None:
        """Keep the verdict for the reply; a failure is kept as its error and raised."""
        sim = self._simulation
        assert sim is not None  # the simulation guard let the request in
        result = FinalizeResult()
        try:
            lk.begin_finalize(
                sim,
                SimulationVerdict(
                    success=bool(data.get("provisional_success", False)),
                    reason=str(data.get("provisional_reason", "")),
                ),
                sim_pb.SimulationRun(id=sim.simulation_run_id),
            )
            if self._on_simulation_end is not None:
                res = self._on_simulation_end(sim)
                if inspect.isawaitable(res):
                    await res
            if (uv := sim.user_verdict) is not None:
                result.user_verdict.success = uv.success
                result.user_verdict.reason = uv.reason
        except Exception as e:
            # the simulator still gets an answer: its own verdict stands, with the error.
            # Raised so the trace shows compute_verdict failed (its error event is
            # verdict_ready: the reply goes out as it would); logged here, once
            error = f"on_simulation_end failed: {type(e).__name__}: {e}"
            self.actor.report(logger, logging.ERROR, "%s", error, event="request", exc_info=e)
            self._result = (result, error)
            raise Reported(e) from e
        self._result = (result, "")

    async def _fx_send_verdict(self, ev: Event) -> Event:
        waiting, self._waiting = self._waiting, []
        delivered: str | None = None
        failure: Exception | None = None
        for rid in waiting:
            try:
                await self._send_verdict(rid)
            except Exception as e:
                failure = e
            else:
                delivered = rid if delivered is None else delivered
        if delivered is None:
            # the machine goes back to idle: a retry is answered with the same verdict
            logger.warning(
                "could not deliver the finalize_simulation reply: %s",
                failure,
                extra=self.actor.log_fields(ev.name),
            )
            assert failure is not None
            raise failure
        return Event("delivered", {"request_id": delivered, "verdict": self._kept_verdict()})

    async def _fx_resend_verdict(self, ev: Event) -> None:
        await self._send_verdict(str(ev.data.get("request_id", "")))

    async def _send_verdict(self, request_id: str) -> None:
        assert self._result is not None  # verdict_ready follows the computed verdict
        result, error = self._result
        resp = agent_pb.SessionResponse(
            request_id=request_id, error=error or None, finalize_simulation=result
        )
        await self._send(agent_pb.AgentSessionMessage(response=resp))

    def _kept_verdict(self) -> dict[str, Any] | None:
        assert self._result is not None
        result = self._result[0]
        if not result.HasField("user_verdict"):
            return None
        return {"success": result.user_verdict.success, "reason": result.user_verdict.reason}

    def _fx_report_answered(self, ev: Event) -> Output:
        verdict = ev.data.get("verdict")
        self._delivered = _Delivered(
            str(ev.data.get("request_id", "")),
            dict(verdict) if isinstance(verdict, Mapping) else None,
        )
        if self._on_answered is not None:
            try:
                self._on_answered(self._delivered.verdict)
            except Exception:
                # the user's callback: its failure is logged, the job still hears the answer
                logger.exception("on_finalize_answered failed", extra=self.actor.log_fields())
        return Output({"verdict": self._delivered.verdict})

    async def _fx_refuse_not_simulation(self, ev: Event) -> None:
        await self._error(ev, "this job is not a simulation")

    async def _fx_reply_unfinished(self, _ev: Event) -> None:
        # the answer was cut with its state: each request waiting for it gets this rather
        # than silence
        waiting, self._waiting = self._waiting, []
        failure: Exception | None = None
        for rid in waiting:
            try:
                await self._send_error(rid, FINALIZE_UNFINISHED)
            except Exception as e:  # the next request waiting is still told
                failure = e
        if failure is not None:
            raise failure

    async def _error(self, ev: Event, error: str) -> None:
        await self._send_error(str(ev.data.get("request_id", "")), error)

    async def _send_error(self, request_id: str, error: str) -> None:
        await self._send(
            agent_pb.AgentSessionMessage(
                response=agent_pb.SessionResponse(request_id=request_id, error=error)
            )
        )


# the finalize machine's handlers, shared by every instance (Handlers binds them)
_EFFECTS = effect_table(FinalizeAnswer, FINALIZE)


def _not_answering(state: str) -> bool:
    return state not in ("answering", "replying")

"""The job's close (``closing``'s task, ``run_close``): the steps of
``statemachines.system.TEARDOWN`` the job does itself (its session host, the room's
disconnect and deletion, the shutdown callbacks), what a step cut at its bound had not seen
happen, and the one WARNING when ``close_timeout`` cuts the whole."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from agent_runtime.actor import Event
from agent_runtime.clock import Clock
from agent_runtime.runtimes.shutdown_callbacks import ShutdownCallbacks
from agent_runtime.runtimes.teardown import Teardown, Work
from statemachines.system import TEARDOWN

if TYPE_CHECKING:
    from agent_runtime.runtimes.job import JobRuntime

logger = logging.getLogger("agent_runtime.job")  # the job's own lines


class JobClose:
    """``run_close`` for one job: ``callbacks`` are its shutdown callbacks;
    ``composed_works()``, the works of the steps its composer does (the session's, the
    avatar's), asked at the close."""

    __slots__ = ("_clock", "_close_timeout", "_composed_works", "_job", "_teardown", "callbacks")

    def __init__(
        self,
        job: JobRuntime,
        composed_works: Callable[[], Mapping[str, Work]] | None,
        *,
        close_timeout: float,
        clock: Clock,
    ) -> None:
        self._job = job
        self._close_timeout = close_timeout
        self._clock = clock
        self._composed_works = composed_works
        self.callbacks = ShutdownCallbacks()
        # run_close as it runs: what the log line says when the close bound cuts it
        self._teardown: Teardown | None = None

    def run(self, done: Event) -> asyncio.Future[Event]:
        """The steps, each within its share of ``close_timeout``; a step cut at its share
        never keeps the next from running. Each step's links (``LINKS``, run_close/STEP)
        fire as it begins. ``done`` once every step has ended."""
        job = self._job
        self._teardown = Teardown(
            TEARDOWN,
            close_timeout=self._close_timeout,
            clock=self._clock,
            log=logger,
            who=job.actor.where(),
            fields=job.actor.log_fields(),
            begin=self._begin_step,
            waiting_for=self.waiting_for,
        )
        works: dict[str, Work] = {
            "host": job.host.released_once_closed,
            "disconnect": job.disconnect_room,
            # delete_room_on_close covers every way the job ends (upstream deletes from the
            # session's close, which a job shutdown also causes), after the hold, never
            # before; a deletion asked for runs now (the step's links allowed it)
            "room": job.deletion.when_settled,
            "callbacks": self._run_callbacks,
        }
        if self._composed_works is not None:  # the composer's (the session, the avatar)
            works.update(self._composed_works())
        return self._teardown.run(works, done)

    def _begin_step(self, step: str) -> None:
        self._job.wiring.fire("job", "run_close", step=step)

    def waiting_for(self, step: str) -> str:
        """What a step cut at its bound had not seen happen (the log line says it)."""
        if step == "callbacks":
            return self.callbacks.waiting_for()
        return {
            "host": "the session host had not closed",
            "session": "the session had not closed",
            "avatar": "the avatar had not closed",
            "disconnect": "the room had not disconnected",
            "room": "the room deletion had not returned",
        }.get(step, f"its {step} step had not ended")

    def report_cut(self, ev: Event) -> None:
        job = self._job
        after = ev.data.get("after", self._close_timeout)
        td = self._teardown
        running = list(td.running) if td is not None else []
        parts = [self.waiting_for(step) for step in running]
        started = td is not None and ("callbacks" in running or "callbacks" in td.ended)
        if self.callbacks and not started:
            parts.append("the shutdown callbacks did not run")
        what = "; ".join(parts) or "its last step had ended"
        msg = "closing the job was cut off after %gs (close_timeout): %s"
        job.actor.report(logger, logging.WARNING, msg, after, what, event=ev.name)

    def _run_callbacks(self) -> Awaitable[None] | None:
        if not self.callbacks:
            return None
        return self.callbacks.run(self._job.reason, self._job.actor)

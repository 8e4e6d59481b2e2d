"""One scheduler per job: it steps every actor of the job, in a declared order.

An event posted to an actor goes into that actor's mailbox, and the actor is marked ready.
The scheduler then steps, to completion: each ready actor in turn handles its whole mailbox
(the events its own effects return included), and actors that become ready meanwhile are
stepped after it, in the order they became ready. Posted from outside a step (a room fact, a
timer, a user's call) the step comes in one call of the loop, after the poster returns, so
every machine one input reaches has it before any of them steps. That order is
causal (an event is handled after the step that posted it), and where one input reaches
several machines at once its poster posts them in ``statemachines.system.FOLLOW_ORDER``, so
the order is declared, never the event loop's ready queue (XState v5's actor system: ``send``
processes the mailbox to completion).

A step never awaits. An effect or a state's invoked work that has to be awaited is work the
scheduler owns (``own``): the actor's step has ended when it starts, and what it ends with
comes back through the actor as an event (XState's ``onDone``/``onError``). Posting from
inside a step only queues: no actor is ever stepped inside another's step.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Protocol, TypeVar

from agent_runtime.clock import Clock

T = TypeVar("T")

logger = logging.getLogger("agent_runtime.scheduler")


class Steppable(Protocol):
    """What the scheduler steps: an actor's mailbox, handled until it is empty or the actor
    waits on work of its own."""

    def step_mailbox(self) -> None: ...

    def log_fields(self, event: str = "") -> dict[str, Any]:
        """What a line about it carries (the log policy: its job's labels, ...)."""
        ...


class Scheduler:
    """Steps the actors of one job in a declared order (see the module's docstring).

    ``work`` counts the awaited effects and invoked tasks in flight: with nothing ready and
    no work, the job's actors are quiet until the next input."""

    __slots__ = ("_call", "_ready", "_stepping", "work")

    def __init__(self) -> None:
        # a list, drained by index (an empty deque is a 64-slot block, per job)
        self._ready: list[Steppable] = []
        self._stepping = False
        self._call: asyncio.Handle | None = None  # the one call that steps what is ready
        self.work = 0

    @property
    def quiet(self) -> bool:
        """Nothing to step and no work of an actor's running."""
        return not self._ready and not self.work

    def ready(self, actor: Steppable) -> None:
        """``actor`` has mail: it is stepped after the actors already ready, in this step
        of the scheduler or, posted from outside one, in the next (one call for everything
        an input posts: every machine a room fact reaches has it before any of them steps)."""
        self._ready.append(actor)
        if not self._stepping and self._call is None:
            self._call = asyncio.get_running_loop().call_soon(self.run)

    def run(self) -> None:
        """Step every ready actor, and those they make ready, until none is."""
        if self._stepping:
            return
        if self._call is not None:
            self._call.cancel()
            self._call = None
        self._stepping = True
        ready = self._ready
        i = 0
        try:
            while i < len(ready):
                actor = ready[i]
                i += 1
                try:
                    actor.step_mailbox()
                except Exception:
                    # the actor's failure, never the job's: the other actors go on
                    logger.exception("stepping %r failed", actor, extra=actor.log_fields())
        finally:
            del ready[:i]
            self._stepping = False

    def own(
        self,
        work: Awaitable[Any],
        ended: Callable[[asyncio.Future[Any]], None],
        *,
        name: str,
    ) -> asyncio.Future[Any]:
        """Run ``work`` (an effect's or an invoked task's awaitable) as the scheduler's;
        ``ended(future)`` is told how it ended, then the actors it made ready are stepped.
        A future is followed as it is (no task of its own), a coroutine gets one task."""
        if isinstance(work, asyncio.Future):
            fut: asyncio.Future[Any] = work
        elif asyncio.iscoroutine(work):
            fut = asyncio.get_running_loop().create_task(work, name=name)
        else:
            fut = asyncio.ensure_future(work)
        self.work += 1
        fut.add_done_callback(lambda f: self._ended(f, ended))
        return fut

    def _ended(
        self, fut: asyncio.Future[Any], ended: Callable[[asyncio.Future[Any]], None]
    ) -> None:
        self.work -= 1
        stepping, self._stepping = self._stepping, True
        try:
            ended(fut)
        except Exception:
            logger.exception("handling the end of %r failed", fut)
        finally:
            self._stepping = stepping
        self.run()


class Cuttable(asyncio.Future[T]):
    """A future that runs ``on_cut`` as it is cancelled, before it is: cutting a wait cuts
    the work it stands for at once, with no done-callback and no turn of the loop
    (``Task.cancel`` cancels the future its task awaits through this method)."""

    __slots__ = ("_on_cut",)

    def __init__(self, on_cut: Callable[[], object]) -> None:
        super().__init__(loop=asyncio.get_running_loop())
        self._on_cut: Callable[[], object] | None = on_cut

    def cancel(self, msg: Any = None) -> bool:
        cut, self._on_cut = self._on_cut, None
        if cut is not None and not self.done():
            try:
                cut()
            except Exception:
                logger.exception("cutting %r failed", self)
        return super().cancel(msg)


def when_all(futures: Collection[asyncio.Future[Any]], result: T) -> asyncio.Future[T]:
    """A future done with ``result`` once every one of ``futures`` has ended, however each
    ended (each failure retrieved: its owner reports it): waiting on work that already runs
    costs no task of its own."""
    done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    left = len(futures)

    def ended(work: asyncio.Future[Any]) -> None:
        nonlocal left
        if not work.cancelled():
            work.exception()
        left -= 1
        if left == 0 and not done.done():
            done.set_result(result)

    if not left:
        done.set_result(result)
    for work in futures:
        work.add_done_callback(ended)
    return done


def ending(*works: asyncio.Future[Any] | None) -> asyncio.Future[None] | None:
    """What is done once each of ``works`` still running has ended, however it ended, or
    None when none runs. Cutting the wait cancels none of them (each has its own owner, who
    reports its failure)."""
    running = [w for w in works if w is not None and not w.done()]
    return when_all(running, None) if running else None


def after(
    first: asyncio.Future[Any] | None, then: Callable[[], asyncio.Future[Any] | None]
) -> asyncio.Future[None] | None:
    """``then()`` once ``first`` has ended, however it ended (at once when ``first`` is None
    or done); returns what waits for what ``then`` left running, or None when nothing is
    left. Cancelling what it returns cuts the wait, and cancels ``first`` if it still
    runs; ``then`` runs all the same (a release runs whatever its wait was cut at). A
    sequence of waits without a task of its own."""
    if first is None or first.done():
        if first is not None and not first.cancelled():
            first.exception()  # retrieved: a failure is its owner's to report
        return then()
    out: asyncio.Future[None] = Cuttable(first.cancel)

    def go(f: asyncio.Future[Any]) -> None:
        if not f.cancelled():
            f.exception()
        try:
            rest = then()
        except Exception as e:
            if not out.done():
                out.set_exception(e)
            return
        if rest is None or rest.done():
            if rest is not None and not rest.cancelled():
                rest.exception()
            if not out.done():
                out.set_result(None)
        else:
            rest.add_done_callback(_ends(out, None))

    first.add_done_callback(go)
    return out


def within(work: asyncio.Future[Any], seconds: float, clock: Clock) -> asyncio.Future[None]:
    """A future done once ``work`` has ended or ``seconds`` have passed on ``clock``,
    whichever comes first; ``work`` is left running (its owner cuts it)."""

    def done() -> None:
        timer.cancel()
        if not out.done():
            out.set_result(None)

    timer = clock.call_later(seconds, done)
    out: asyncio.Future[None] = Cuttable(timer.cancel)  # cut: no timer left behind either
    work.add_done_callback(lambda _: done())
    return out


def relay(ending: asyncio.Future[Any], result: T) -> asyncio.Future[T]:
    """A future done with ``result`` once ``ending`` has ended, however it ended; cancelling
    it cancels ``ending`` (the work it stands for is cut with it)."""
    out: asyncio.Future[T] = Cuttable(ending.cancel)
    ending.add_done_callback(_ends(out, result))
    return out


def _ends(out: asyncio.Future[T], result: T) -> Callable[[asyncio.Future[Any]], None]:
    """The done-callback that ends ``out`` with ``result`` however the work it follows
    ended (its failure retrieved: the work's owner reports it)."""

    def ended(work: asyncio.Future[Any]) -> None:
        if not work.cancelled():
            work.exception()
        if not out.done():
            out.set_result(result)

    return ended

"""Ctrl-C during a fuzz, taken where it can stop the fuzz.

Python's own handler raises ``KeyboardInterrupt`` at whatever code runs when the signal
lands: inside a garbage collector's callback it is printed and dropped (the fuzz went on
for good), inside a run it cut the job's end short and was judged as the run's failure
(tasks left running), which hypothesis then found flaky. Here the first Ctrl-C is noted
and raised from a callback of the run's loop, or at the run's next step when no loop runs;
a second one is raised at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


class Interrupts:
    """How many Ctrl-C's the fuzz was given; ``check()`` raises at a safe point."""

    def __init__(self) -> None:
        self.asked = 0

    def check(self) -> None:
        if self.asked:
            raise KeyboardInterrupt

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.asked += 1
        if self.asked > 1:
            raise KeyboardInterrupt
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no run is under way: the next step raises it
        loop.call_soon_threadsafe(self.check)

    @contextlib.contextmanager
    def installed(self) -> Iterator[Interrupts]:
        """Take Ctrl-C meanwhile, where this thread may (the main one, whose handler is
        still Python's own); elsewhere it is left as it is."""
        ours = (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        )
        if ours:
            try:
                signal.signal(signal.SIGINT, self._on_signal)
            except ValueError:  # an interpreter that takes no handler
                ours = False
        try:
            yield self
        finally:
            if ours:
                signal.signal(signal.SIGINT, signal.default_int_handler)

"""What a timed region cost: CPU time of the running thread, and wall time beside it.

The published figures are CPU time: on an idle machine it equals wall time, and on a shared
one it leaves out the time the process sat preempted by others, which would otherwise land
on whichever contender happened to be running. Wall time is kept in the JSON.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Lap:
    cpu: float  # seconds of CPU time of this thread
    wall: float  # seconds of wall-clock time


class Stopwatch:
    """``sw = Stopwatch()`` starts it; ``sw.lap()`` is the cost since then."""

    __slots__ = ("_cpu0", "_wall0")

    def __init__(self) -> None:
        self._wall0 = time.perf_counter()
        self._cpu0 = time.thread_time()

    def lap(self) -> Lap:
        cpu = time.thread_time() - self._cpu0
        return Lap(cpu=cpu, wall=time.perf_counter() - self._wall0)

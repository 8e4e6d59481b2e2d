"""What a timed region cost: CPU time of the running thread, and wall time beside it.

The published figures are CPU time: on an idle machine it equals wall time, and on a shared
one it leaves out the time the process sat preempted by others, which would otherwise land
on whichever contender happened to be running. Wall time is kept in the JSON.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


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


class GcTimer:
    """CPU time spent inside the cyclic collector, and collections per generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._t0
            self.collections[info["generation"]] += 1

    def take(self) -> dict[str, Any]:
        out = {"gc_seconds": self.seconds, "gc_collections": list(self.collections)}
        self.seconds, self.collections = 0.0, [0, 0, 0]
        return out

"""What the caller of ``fuzz`` is told while it runs: a line through its ``progress`` (the
seed first, then one every ``progress_every`` real seconds), never the agent's failure."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from agent_runtime.observe.trace import describe

if TYPE_CHECKING:
    from agent_runtime.testing.fuzz.machine import Stats

logger = logging.getLogger("agent_runtime.fuzz")


class Progress:
    """The caller's ``progress``, called by the fuzz: output, never the agent's failure.
    Called inside a run, its error was taken for the agent's (hypothesis shrank it, then
    called the run flaky); its first error is one WARNING, and no more lines are sent."""

    def __init__(self, progress: Callable[[str], None] | None, every: float, examples: int) -> None:
        self._progress = progress
        self._every, self._examples = every, examples
        self._began = self._last = time.monotonic()

    def __call__(self, line: str) -> None:
        if self._progress is None:
            return
        try:
            self._progress(line)
        except Exception as e:
            self._progress = None
            logger.warning(
                "fuzz: the progress callback raised %s; no more progress lines", describe(e)
            )

    def on_example(self, s: Stats) -> None:
        """After each run: a line, once ``every`` seconds passed since the last."""
        now = time.monotonic()
        if self._progress is None or now - self._last < self._every:
            return
        self._last = now
        # hypothesis' count: draws, then, once something failed, its shrinking runs
        # (which --examples does not bound)
        if s.failed:
            self(
                f"fuzz: found a problem, shrinking it: {s.examples} runs, "
                f"{s.failed} of them failing, {now - self._began:.0f}s"
            )
        else:
            self(
                f"fuzz: {s.examples} runs (of {self._examples} to draw), "
                f"{len(s.paths)} distinct paths, {now - self._began:.0f}s"
            )


def print_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)

"""Reaction times on the bundled scenarios: part 4 of the benchmarks, not measured yet.

This is the hook the section plugs into: ``run`` is already registered in
``benchmarks.run.SECTIONS`` under "reactions", and everything it returns lands in the one
table and in the JSON. The intended rows, for each situation (avatar failure -> audio back
on the room; simulator leaves -> job closed; closing-reason disconnect -> session closed;
interrupt after the avatar left -> stall):

- ``Row("reactions", "<situation>: this runtime", <virtual seconds>, "s",
  text="<virtual s> (<wall us>/event)", how="<scenario file>, agent-runtime simulate")``
- ``Row("reactions", "<situation>: livekit-agents 1.8.9", None, "",
  text="never restored" | "up to session_end_timeout" | ..., how="<how it was obtained>")``
"""

from __future__ import annotations

from .config import Config
from .table import Row


def run(cfg: Config) -> list[Row]:
    return []

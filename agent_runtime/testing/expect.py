"""Checking a scenario's ``expect`` block against its result object."""

from __future__ import annotations

import math
from typing import Any

from .scenario import Expect


def _same(want: Any, got: Any) -> bool:
    if isinstance(want, bool) or isinstance(got, bool):
        return want is got if isinstance(want, bool) and isinstance(got, bool) else want == got
    if isinstance(want, int | float) and isinstance(got, int | float):
        return math.isclose(want, got, rel_tol=0, abs_tol=1e-6)
    if isinstance(want, dict) and isinstance(got, dict):
        # a fact object matches when every key the file names matches
        return all(k in got and _same(v, got[k]) for k, v in want.items())
    if isinstance(want, list) and isinstance(got, list):
        return len(want) == len(got) and all(_same(w, g) for w, g in zip(want, got, strict=True))
    return bool(want == got)


def check_expect(expect: Expect | None, result: dict[str, Any]) -> list[str]:
    """Every expectation that did not hold, as a readable line; empty when all held."""
    if expect is None:
        return []
    failures: list[str] = []
    finals: dict[str, str] = result.get("final_states", {})
    for machine, want in expect.final_states.items():
        got = finals.get(machine)
        if got != want:
            failures.append(f"final state of {machine}: expected {want!r}, got {got!r}")
    facts: dict[str, Any] = result.get("facts", {})
    for name, want in expect.facts.items():
        if name not in facts:
            failures.append(f"fact {name}: no such fact (known: {', '.join(sorted(facts))})")
        elif not _same(want, facts[name]):
            failures.append(f"fact {name}: expected {want!r}, got {facts[name]!r}")
    return failures

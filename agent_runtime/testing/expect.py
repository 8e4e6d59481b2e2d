"""Checking a scenario's ``expect`` block against its result object."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agent_runtime.testing.result import seconds_text
from agent_runtime.testing.scenario import Expect


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One expectation that did not hold: what (``final state of job``, ``fact verdict``),
    the value the file expects and the one the run produced (``known`` lists the fact names
    when the file names a fact that does not exist)."""

    what: str
    expected: Any
    got: Any
    known: tuple[str, ...] = ()
    message: str = ""  # the whole line, when it says more than expected/got

    def line(self) -> str:
        if self.message:
            return f"{self.what}: {self.message}"
        if self.known:
            return f"{self.what}: no such fact (known: {', '.join(self.known)})"
        return f"{self.what}: expected {self.expected!r}, got {self.got!r}"


def matches(want: Any, got: Any) -> bool:
    """Whether the observed value ``got`` meets the expected ``want``: numbers within 1e-6,
    booleans only as booleans, an object when every key ``want`` names matches."""
    if isinstance(want, bool) or isinstance(got, bool):
        return want is got if isinstance(want, bool) and isinstance(got, bool) else want == got
    if isinstance(want, int | float) and isinstance(got, int | float):
        return math.isclose(want, got, rel_tol=0, abs_tol=1e-6)
    if isinstance(want, dict) and isinstance(got, dict):
        # a fact object matches when every key the file names matches
        return all(k in got and matches(v, got[k]) for k, v in want.items())
    if isinstance(want, list) and isinstance(got, list):
        return len(want) == len(got) and all(matches(w, g) for w, g in zip(want, got, strict=True))
    return bool(want == got)


def mismatches(expect: Expect | None, result: dict[str, Any]) -> list[Mismatch]:
    """Every expectation that did not hold, in the file's order (final states, then facts)."""
    if expect is None:
        return []
    out: list[Mismatch] = []
    finals: dict[str, str] = result.get("final_states", {})
    for machine, want in expect.final_states.items():
        got = finals.get(machine)
        if got != want:
            out.append(Mismatch(f"final state of {machine}", want, got))
    facts: dict[str, Any] = result.get("facts", {})
    for name, want in expect.facts.items():
        if name not in facts:
            out.append(Mismatch(f"fact {name}", want, None, known=tuple(sorted(facts))))
        elif not matches(want, facts[name]):
            out.append(Mismatch(f"fact {name}", want, facts[name]))
    for v in result.get("facts", {}).get("invariant_violations") or ():
        if expect.checks_invariant(v["invariant"]):
            message = f"violated at t={seconds_text(v['t'])} after {v['after']}: {v['detail']}"
            out.append(Mismatch(f"invariant {v['invariant']} ({v['name']})", "holds", v, (),
                                message))  # fmt: skip
    return out


def check_expect(expect: Expect | None, result: dict[str, Any]) -> list[str]:
    """Every expectation that did not hold, as a readable line; empty when all held."""
    return [m.line() for m in mismatches(expect, result)]

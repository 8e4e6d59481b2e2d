"""A scenario's ``expect`` block: the machines' final states, the facts of the run's result
(each named, with a value of its kind) and the job's invariants to check."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from agent_runtime.runtimes.avatar import Route
from agent_runtime.testing.invariants.checks import BY_NUMBER
from agent_runtime.testing.scenario_steps import Strict
from statemachines.machines import MACHINES

InvariantNumber = Annotated[int, Field(strict=True)]


def _text(v: Any) -> bool:
    return isinstance(v, str)


def _seconds(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _object(v: Any) -> bool:
    return isinstance(v, dict)


def _or_null(kind: tuple[str, Callable[[Any], bool]]) -> tuple[str, Callable[[Any], bool]]:
    return f"{kind[0]} or null", lambda v: v is None or kind[1](v)


def _list_of(kind: tuple[str, Callable[[Any], bool]]) -> tuple[str, Callable[[Any], bool]]:
    return f"a list of {kind[0]}", lambda v: isinstance(v, list) and all(map(kind[1], v))


def _one_of(*values: str) -> tuple[str, Callable[[Any], bool]]:
    return " or ".join(values), lambda v: v in values


_TEXT, _SECONDS, _OBJECT = ("text", _text), ("seconds", _seconds), ("an object", _object)
_OBJECTS = _list_of(("objects", _object))
# the facts a run's result holds (``testing.result``): an ``expect`` block may name these
# only, each with a value of the fact's kind (what the check compares it with)
FACT_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "audio_output": _one_of(*get_args(Route)),  # where the agent's audio goes
    "rpcs_sent": _OBJECTS,
    "finalize_answered": ("true or false", lambda v: isinstance(v, bool)),
    "verdict": _or_null(_OBJECT),
    "room_deleted_at": _or_null(_SECONDS),
    "job_closed_at": _or_null(_SECONDS),
    "session_closed_at": _or_null(_SECONDS),
    "session_close_reason": _or_null(_TEXT),
    "attached_session": _or_null(_TEXT),
    "linked_participant": _or_null(_TEXT),
    "session_replies": _OBJECTS,
    "rpc_replies": _OBJECTS,
    "step_errors": _list_of(_TEXT),
    "agent_state": _TEXT,
    "agent_listening_at": _list_of(_SECONDS),
    "playout_done": _OBJECTS,
    "reprompts": _list_of(_SECONDS),
    "invariant_violations": _OBJECTS,  # only with an ``invariants`` entry
}
FACTS = tuple(FACT_KINDS)


class Expect(Strict):
    final_states: dict[str, str] = Field(default_factory=dict)
    facts: dict[str, Any] = Field(default_factory=dict)
    # the job's invariants (the ones the explorer checks, by number), checked after the
    # start, every step and every deadline, and at the end once no timer is left: "all",
    # or a list of their numbers
    invariants: Literal["all"] | tuple[InvariantNumber, ...] | None = None

    @field_validator("invariants", mode="before")
    @classmethod
    def _known_invariants(cls, v: Any) -> Any:
        if v is None or v == "all":
            return v
        if not isinstance(v, list | tuple) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in v
        ):
            raise PydanticCustomError(
                "invariants", "'all' or a list of invariant numbers, got {v}", {"v": repr(v)}
            )
        for number in v:
            if number not in BY_NUMBER:
                raise PydanticCustomError(
                    "unknown_invariant",
                    "no invariant {number} (invariants: {known})",
                    {"number": number, "known": ", ".join(map(str, sorted(BY_NUMBER)))},
                )
        return v

    def checks_invariant(self, number: int) -> bool:
        return self.invariants == "all" or (
            self.invariants is not None and number in self.invariants
        )

    @field_validator("facts")
    @classmethod
    def _known_facts(cls, v: dict[str, Any]) -> dict[str, Any]:
        # a misspelt fact is the file's error too, found before the run
        for name in v:
            if name not in FACTS:
                raise PydanticCustomError(
                    "unknown_fact",
                    "no fact {name} (facts: {known})",
                    {"name": repr(name), "known": ", ".join(FACTS)},
                )
        # a value of the wrong kind too: it ran, then failed ("expected 'soon', got None")
        for name, want in v.items():
            kind, fits = FACT_KINDS[name]
            if not fits(want):
                raise PydanticCustomError(
                    "fact_kind",
                    "{name} is {kind}, not {value}",
                    {"name": name, "kind": kind, "value": repr(want)},
                )
        return v

    @model_validator(mode="after")
    def _violations_checked(self) -> Expect:
        if "invariant_violations" in self.facts and self.invariants is None:
            raise PydanticCustomError(
                "unchecked",
                "fact invariant_violations is only there with an 'invariants' entry",
                {},
            )
        return self

    @field_validator("final_states")
    @classmethod
    def _known_states(cls, v: dict[str, str]) -> dict[str, str]:
        # a misspelt machine or state is the file's error, not an expectation that fails
        for machine, state in v.items():
            spec = MACHINES.get(machine)
            if spec is None:
                raise PydanticCustomError(
                    "unknown_machine",
                    "no machine {machine} (machines: {known})",
                    {"machine": repr(machine), "known": ", ".join(MACHINES)},
                )
            states = [st.name for st in spec.states]
            if state not in states:
                raise PydanticCustomError(
                    "unknown_state",
                    "{machine} has no state {state} (states: {known})",
                    {"machine": machine, "state": repr(state), "known": ", ".join(states)},
                )
        return v

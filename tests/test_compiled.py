"""``step`` checked against the ``transitions`` machine compiled from the same spec.

Two executors of one table: ``statemachines.step`` (a dict lookup and a loop over rows)
and ``transitions`` running the compiled machine (its conditions, internal transitions,
``after`` callbacks and ``MachineError``). They must agree on every cell under every
combination of guard values, and along long random event sequences; a single changed
cell on either side must show up as a disagreement at that cell.
"""

from __future__ import annotations

import gc
import weakref

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statemachines import MachineSpec, Row, SpecError, Step, UnknownEvent, UnknownState, step
from statemachines.compiled import (
    compile_machine,
    disagreements,
    each_disagreement,
    reference_step,
)
from statemachines.machines import MACHINES
from verification.mutation.cells import set_cell, set_dest, single_cell_mutants

# the two executors of one table agree whatever the table says
pytestmark = pytest.mark.snapshot


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_every_cell_under_every_guard_combination_agrees(name: str) -> None:
    found = disagreements(MACHINES[name])
    assert not found, "\n".join(map(str, found[:5]))


def test_the_cells_the_old_compilation_got_wrong_now_agree() -> None:
    """Ignore cells used not to be compiled: ``transitions`` raised MachineError where
    ``step`` ignores."""
    job = MACHINES["job"]
    assert reference_step(job, "serving", "finalize_answered") == Step(
        "ignore", "serving", "finalize_answered", "serving"
    )
    assert reference_step(job, "closed", "shutdown").outcome == "ignore"
    host = MACHINES["session_host"]
    assert reference_step(host, "closed", "attach").outcome == "reject"


def test_transitions_semantics_carry_each_kind_of_cell() -> None:
    """Guards in order, internal vs self-transition, effects in order, exclusive guards
    with none holding, reject as MachineError."""
    part = MACHINES["participant"]
    both = {"is_linked": True, "closing_reason": True, "grace_enabled": True}
    assert reference_step(part, "linked", "participant_disconnected", both).dest == "closing"
    grace = {"is_linked": True, "closing_reason": False, "grace_enabled": True}
    got = reference_step(part, "linked", "participant_disconnected", grace)
    assert got == step(part, "linked", "participant_disconnected", grace)
    assert got.dest == "grace"
    other = reference_step(part, "linked", "participant_disconnected", {"is_linked": False})
    assert (other.outcome, other.dest, other.internal) == ("transition", "linked", True)

    host = MACHINES["session_host"]
    # effects run as after callbacks, in the row's order
    swap = reference_step(host, "attached", "attach", {"is_current": False})
    assert (swap.internal, swap.effects) == (True, ("unsubscribe", "subscribe"))
    # a row whose dest is its own source leaves and re-enters (not internal)
    self_loop = set_dest(MACHINES["room_deletion"], "kept", "request", "kept")
    got = reference_step(self_loop, "kept", "request")
    assert (got.outcome, got.dest, got.internal, got.changed) == ("transition", "kept", False, True)


def test_unknown_names_raise_as_step_does() -> None:
    with pytest.raises(UnknownEvent, match="machine 'job' has no event 'explode'"):
        reference_step(MACHINES["job"], "serving", "explode")
    with pytest.raises(UnknownState, match="machine 'job' has no state 'limbo'"):
        reference_step(MACHINES["job"], "limbo", "shutdown")


def test_a_one_cell_divergence_is_caught_at_that_cell() -> None:
    """The ``transitions`` machine compiled from a spec with one cell changed, run beside
    the unchanged ``step`` (and the other way round), disagrees at that cell and nowhere
    else."""
    job = MACHINES["job"]
    changed = set_dest(job, "awaiting_finalize", "hold_timeout", "serving")
    for found in (disagreements(job, compiled=changed), disagreements(changed, compiled=job)):
        assert found
        assert {(d.state, d.event) for d in found} == {("awaiting_finalize", "hold_timeout")}
    ignored = set_cell(job, "serving", "finalize_answered", kind="reject")
    found = disagreements(job, compiled=ignored)  # once per value of the job's one guard
    assert len(found) == 2
    for d in found:
        assert (d.step.outcome, d.reference.outcome) == ("ignore", "reject")
        assert "(serving, finalize_answered)" in str(d)
    # a guard order swapped: same rows, different first match
    part = MACHINES["participant"]
    rows = [r for r in part.rows if (r.source, r.event) == ("grace", "participant_connected")]
    swapped = set_cell(
        part,
        "grace",
        "participant_connected",
        rows=[Row(source="grace", event="participant_connected", dest=None), rows[0]],
    )
    found = disagreements(part, compiled=swapped)
    assert {(d.state, d.event) for d in found} == {("grace", "participant_connected")}


# the avatar has the most mutants by far: its share is split so the workers share it out
_SHARDS = {"avatar": 3}


@pytest.mark.parametrize(
    ("name", "shard"),
    [(n, k) for n in sorted(MACHINES) for k in range(_SHARDS.get(n, 1))],
    ids=lambda v: str(v),
)
def test_every_single_cell_mutant_disagrees_at_its_cell(name: str, shard: int) -> None:
    """Every one-cell change of every machine (destination, internal, transition <->
    ignore <-> reject), valid spec or not, is told apart by the two executors."""
    spec = MACHINES[name]
    shards = _SHARDS.get(name, 1)
    count = 0
    for i, (label, mutant) in enumerate(single_cell_mutants(spec)):
        if i % shards != shard:
            continue
        state, event = _cell_of(label)
        assert next(each_disagreement(spec, compiled=mutant, cells=[(state, event)]), None), label
        count += 1
    assert count * shards > len(spec.state_names) * len(spec.events)


def _cell_of(label: str) -> tuple[str, str]:
    inside = label[label.index("(") + 1 : label.index(")")]
    state, event = inside.split(", ")
    return state, event


# -- long random sequences ---------------------------------------------------------------


@st.composite
def runs(draw: st.DrawFn) -> tuple[str, list[tuple[str, str | dict[str, bool]]]]:
    """A machine and a long sequence of actions: an event with guard values, or a jump
    to a state (a new instance starting there: final states end every run otherwise)."""
    name = draw(st.sampled_from(sorted(MACHINES)))
    spec = MACHINES[name]
    guard_values = st.fixed_dictionaries({g: st.booleans() for g in spec.guards})
    action = st.one_of(
        st.tuples(st.sampled_from(spec.events), guard_values),
        st.tuples(st.just("jump"), st.sampled_from(spec.state_names)),
    )
    return name, draw(st.lists(action, min_size=50, max_size=300))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(runs())
def test_random_sequences_agree_step_by_step(
    run: tuple[str, list[tuple[str, str | dict[str, bool]]]],
) -> None:
    name, actions = run
    spec = MACHINES[name]
    mine = ref = spec.initial
    for i, (what, arg) in enumerate(actions):
        if what == "jump":
            assert isinstance(arg, str)
            mine = ref = arg
            continue
        assert isinstance(arg, dict)
        a = step(spec, mine, what, arg)
        b = reference_step(spec, ref, what, arg)
        assert a == b, f"{name} step {i}: {what} in {mine}: step {a}, transitions {b}"
        mine, ref = a.dest, b.dest


# -- the compiled machine is cheap to keep -------------------------------------------------


def test_compiled_once_per_spec_and_let_go_with_it() -> None:
    spec = MACHINES["room_deletion"]
    assert compile_machine(spec) is compile_machine(spec)
    copy = MachineSpec.model_validate(spec.model_dump())
    assert compile_machine(copy) is not compile_machine(spec)
    assert reference_step(copy, "kept", "close").dest == "closed"
    gone = weakref.ref(copy)
    del copy
    gc.collect()
    assert gone() is None, "the compiled-machine cache keeps a spec alive"


def test_a_mutant_the_spec_model_refuses_still_compiles() -> None:
    """The mutation tool compiles copies the validator would refuse (it reports them)."""
    job = MACHINES["job"]
    # a final state that is left again
    broken = set_cell(
        job, "closed", "shutdown", rows=[Row(source="closed", event="shutdown", dest="serving")]
    )
    with pytest.raises(SpecError, match="final state 'closed' has a transition"):
        MachineSpec.model_validate(broken.model_dump())
    assert reference_step(broken, "closed", "shutdown").dest == "serving"

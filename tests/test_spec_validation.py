"""Each kind of broken table is refused when built, with a message naming the cell."""

from __future__ import annotations

from typing import Any

import pytest

from statemachines import Effect, MachineSpec, SpecError, State, StateTimeout, cells, row


def build(**over: Any) -> MachineSpec:
    base: dict[str, Any] = dict(
        name="door",
        initial="shut",
        states=(State(name="shut"), State(name="open"), State(name="gone", final=True)),
        events=("push", "pull", "burn"),
        guards=("locked",),
        effects=(Effect(name="creak"),),
        rows=(
            *row("shut", "push", "open", effects=["creak"]),
            *row("open", "pull", "shut"),
            *row(["shut", "open"], "burn", "gone"),
        ),
        ignore=(*cells("open", "push"), *cells("gone", ["push", "pull", "burn"])),
        reject=(*cells("shut", "pull"),),
    )
    base.update(over)
    return MachineSpec(**base)


def test_a_complete_table_builds() -> None:
    spec = build()
    assert spec.cell_kind("shut", "pull") == "reject"
    assert spec.cell_kind("open", "push") == "ignore"
    assert spec.cell_kind("shut", "push") == "transition"


def test_undeclared_cell_is_named() -> None:
    with pytest.raises(SpecError, match=r"machine 'door': cell \(shut, pull\) is not declared"):
        build(reject=())


def test_unreachable_state_is_named() -> None:
    states = (
        State(name="shut"),
        State(name="open"),
        State(name="gone", final=True),
        State(name="attic"),
    )
    extra = cells("attic", ["push", "pull"]) + cells("attic", "burn")
    with pytest.raises(SpecError, match="state 'attic' is unreachable from 'shut'"):
        build(
            states=states,
            ignore=(*cells("open", "push"), *cells("gone", ["push", "pull", "burn"]), *extra[:2]),
            rows=(
                *row("shut", "push", "open"),
                *row("open", "pull", "shut"),
                *row(["shut", "open", "attic"], "burn", "gone"),
            ),
        )


def test_dead_end_is_named() -> None:
    with pytest.raises(SpecError, match="state 'open' is not final and has no transition out"):
        build(
            rows=(*row("shut", "push", "open"), *row("shut", "burn", "gone")),
            ignore=(
                *cells("open", ["push", "pull", "burn"]),
                *cells("gone", ["push", "pull", "burn"]),
            ),
        )


def test_duplicate_rows_are_named() -> None:
    with pytest.raises(SpecError, match=r"cell \(open, pull\) has duplicate rows"):
        build(
            rows=(
                *row("shut", "push", "open"),
                *row("open", "pull", "shut"),
                *row("open", "pull", "gone"),
                *row(["shut", "open"], "burn", "gone"),
            )
        )


def test_cell_declared_twice_is_named() -> None:
    with pytest.raises(SpecError, match=r"cell \(shut, pull\) is declared twice"):
        build(
            ignore=(
                *cells("open", "push"),
                *cells("shut", "pull"),
                *cells("gone", ["push", "pull", "burn"]),
            )
        )


def test_unguarded_row_shadowing_is_refused() -> None:
    with pytest.raises(SpecError, match=r"cell \(shut, push\): an unguarded row shadows"):
        build(
            rows=(
                *row("shut", "push", "open"),
                *row("shut", "push", "gone", guards=["locked"]),
                *row("open", "pull", "shut"),
                *row(["shut", "open"], "burn", "gone"),
            )
        )


def test_guarded_rows_need_a_fallback_or_exclusive_guards() -> None:
    rows = (
        *row("shut", "push", "open", guards=["locked"]),
        *row("open", "pull", "shut"),
        *row(["shut", "open"], "burn", "gone"),
    )
    with pytest.raises(SpecError, match=r"cell \(shut, push\): guarded rows need"):
        build(rows=rows)
    assert build(rows=rows, exclusive_guards=(("locked",),)).cell_kind("shut", "push") == (
        "transition"
    )


def test_unknown_guard_and_effect_are_named() -> None:
    with pytest.raises(SpecError, match=r"row \(shut, push\) uses unknown guard 'nope'"):
        build(
            rows=(
                *row("shut", "push", "open", guards=["nope"]),
                *row("shut", "push", "open"),
                *row("open", "pull", "shut"),
                *row(["shut", "open"], "burn", "gone"),
            )
        )
    with pytest.raises(SpecError, match=r"row \(shut, push\) uses unknown effect 'bang'"):
        build(
            rows=(
                *row("shut", "push", "open", effects=["bang"]),
                *row("open", "pull", "shut"),
                *row(["shut", "open"], "burn", "gone"),
            )
        )


def test_unknown_names_in_rows_and_cells() -> None:
    with pytest.raises(SpecError, match="uses unknown event 'kick'"):
        build(rows=(*row("shut", "kick", "open"),))
    with pytest.raises(SpecError, match="leads to unknown state 'roof'"):
        build(rows=(*row("shut", "push", "roof"),))
    with pytest.raises(SpecError, match="names unknown state 'roof'"):
        build(ignore=(*cells("roof", "push"),))


def test_final_state_accepts_only_ignore_or_reject() -> None:
    with pytest.raises(SpecError, match="final state 'gone' has a transition on 'push'"):
        build(
            rows=(
                *row("shut", "push", "open"),
                *row("open", "pull", "shut"),
                *row(["shut", "open"], "burn", "gone"),
                *row("gone", "push", "shut"),
            ),
            ignore=(*cells("open", "push"), *cells("gone", ["pull", "burn"])),
        )


def test_timeout_and_invoke_must_be_declared() -> None:
    with pytest.raises(SpecError, match="times out with undeclared event 'tick'"):
        build(
            states=(
                State(name="shut", timeout=StateTimeout(event="tick", setting="t", default=1)),
                State(name="open"),
                State(name="gone", final=True),
            )
        )
    with pytest.raises(SpecError, match="invokes unknown effect 'hum'"):
        build(
            states=(
                State(name="shut", invoke=("hum",)),
                State(name="open"),
                State(name="gone", final=True),
            )
        )


def test_initial_and_effect_error_events_must_exist() -> None:
    with pytest.raises(SpecError, match="initial state 'ajar' is not a declared state"):
        build(initial="ajar")
    with pytest.raises(SpecError, match="effect 'creak' raises undeclared event 'oops'"):
        build(effects=(Effect(name="creak", error_event="oops"),))


def test_duplicate_declarations_are_refused() -> None:
    with pytest.raises(SpecError, match="event 'push' is declared twice"):
        build(events=("push", "pull", "burn", "push"))

"""One test per (machine, state, event) cell, pinned by golden tables.

``tests/tables/NAME.json`` holds every cell of machine NAME as reviewed: its kind and, for a
transition, its rows in order (dest, guards, effects; dest null = internal). Each cell test
checks, against that golden cell rather than against the spec itself:

* the spec declares the same cell;
* the pure ``step`` decides as the golden rows say, for every combination of the cell's
  guard values (the first row whose guards all hold wins; ignore/reject cells never move).

(The compiled ``transitions`` machine is checked against ``step`` by running both, in
``test_compiled.py``.)

So changing a cell (a destination, a guard, an effect, transition <-> ignore <-> reject)
fails the test named ``machine-state-event``. After an intended change to a machine,
regenerate the golden tables and review their diff with the spec change:

    python3 dev.py golden        # rewrites tests/tables/*.json
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agent_runtime.tools.drawing import cell_table, describe_cell
from statemachines import MachineSpec, Row, SpecError, step
from statemachines.machines import MACHINES
from statemachines.spec import Cell

# the golden tables: any cell change fails here by construction
pytestmark = pytest.mark.snapshot

TABLES = Path(__file__).parent / "tables"
GOLDEN: dict[str, Any] = {p.stem: json.loads(p.read_text()) for p in sorted(TABLES.glob("*.json"))}
UPDATE = "if the change is intended, run `python3 dev.py golden` and review the diff"


def _cell_ids() -> list[Any]:
    """Every cell of the specs and of the golden tables (a cell only one side has fails)."""
    params: list[Any] = []
    for name in [*MACHINES, *(n for n in GOLDEN if n not in MACHINES)]:
        seen: dict[tuple[str, str], None] = {}
        sources = [GOLDEN.get(name)]
        if name in MACHINES:
            sources.append(cell_table(MACHINES[name]))
        for table in sources:
            if table is None:
                continue
            for state, events in table["cells"].items():
                for event in events:
                    seen[(state, event)] = None
        params += [pytest.param(name, s, e, id=f"{name}-{s}-{e}") for s, e in seen]
    return params


def _text(cell: Any) -> str:
    return "; ".join(describe_cell(cell)) if cell is not None else "nothing (no such cell)"


def _expected_step(cell: Any, state: str, values: dict[str, bool]) -> tuple[Any, ...]:
    """(outcome, dest, effects, internal) the golden cell prescribes for these guard values."""
    if cell["kind"] != "transition":
        return (cell["kind"], state, (), False)
    for r in cell["rows"]:
        if all(values[g] for g in r["guards"]):
            internal = r["dest"] is None
            return ("transition", state if internal else r["dest"], tuple(r["effects"]), internal)
    return ("ignore", state, (), False)  # only with exclusive guards, none holding


def check_cell(spec: MachineSpec, golden: Any, state: str, event: str) -> None:
    """Assert one cell of ``spec`` against its golden table; the message names the cell."""
    where = f"cell {spec.name}-{state}-{event}"
    want = golden["cells"].get(state, {}).get(event)
    got = cell_table(spec)["cells"].get(state, {}).get(event)
    assert got == want, (
        f"{where}: the spec says {_text(got)}; tests/tables/{spec.name}.json says "
        f"{_text(want)}; {UPDATE}"
    )
    assert want is not None

    guards = sorted({g for r in want.get("rows", []) for g in r["guards"]})
    for combo in itertools.product((False, True), repeat=len(guards)):
        values = dict(zip(guards, combo, strict=True))
        st = step(spec, state, event, values)
        assert (st.outcome, st.dest, st.effects, st.internal) == _expected_step(
            want, state, values
        ), f"{where}: step with guards {values} gave {st}"


@pytest.mark.parametrize(("machine", "state", "event"), _cell_ids())
def test_cell(machine: str, state: str, event: str) -> None:
    assert machine in MACHINES, (
        f"tests/tables/{machine}.json pins a machine the code no longer has; {UPDATE}"
    )
    assert machine in GOLDEN, f"machine {machine!r} has no tests/tables/{machine}.json; {UPDATE}"
    check_cell(MACHINES[machine], GOLDEN[machine], state, event)


@pytest.mark.parametrize("machine", MACHINES)
def test_golden_table_pins_the_initial_state(machine: str) -> None:
    assert machine in GOLDEN, f"machine {machine!r} has no tests/tables/{machine}.json; {UPDATE}"
    assert MACHINES[machine].initial == GOLDEN[machine]["initial"], UPDATE


@pytest.mark.parametrize("machine", MACHINES)
def test_table_is_total(machine: str) -> None:
    spec = MACHINES[machine]
    declared = Counter(
        [*{(r.source, r.event) for r in spec.rows}]
        + [(c.state, c.event) for c in (*spec.ignore, *spec.reject)]
    )
    cells = {(s, e) for s in spec.state_names for e in spec.events}
    assert set(declared) == cells, f"undeclared or unknown cells: {set(declared) ^ cells}"
    twice = [c for c, n in declared.items() if n > 1]
    assert not twice, f"cells declared more than once: {twice}"


# -- the tests above catch every single-cell change ---------------------------------------


def _mutants(spec: MachineSpec) -> list[tuple[str, str, dict[str, list[Any]]]]:
    """(state, event, changed table) for every single-cell change: each other destination
    (or internal) of each row, and the cell turned into each other kind."""
    out: list[tuple[str, str, dict[str, list[Any]]]] = []
    for s in spec.state_names:
        for e in spec.events:
            kind = spec.cell_kind(s, e)
            rows = [r for r in spec.rows if (r.source, r.event) == (s, e)]
            base: dict[str, list[Any]] = {
                "rows": [r for r in spec.rows if (r.source, r.event) != (s, e)],
                "ignore": [c for c in spec.ignore if (c.state, c.event) != (s, e)],
                "reject": [c for c in spec.reject if (c.state, c.event) != (s, e)],
            }

            def changed(**extra: list[Any]) -> dict[str, list[Any]]:
                return {k: [*v, *extra.get(k, [])] for k, v in base.items()}  # noqa: B023

            for k in ("ignore", "reject"):
                if k != kind:
                    out.append((s, e, changed(**{k: [Cell(state=s, event=e)]})))
            if kind != "transition":
                out.append((s, e, changed(rows=[Row(source=s, event=e, dest=s)])))
            for i, r in enumerate(rows):
                for dest in (None, *spec.state_names):
                    if dest != r.dest:
                        moved = [*rows[:i], r.model_copy(update={"dest": dest}), *rows[i + 1 :]]
                        out.append((s, e, changed(rows=moved)))
    return out


@pytest.mark.parametrize("machine", MACHINES)
def test_every_single_cell_change_fails_a_cell_test(machine: str) -> None:
    spec = MACHINES[machine]
    fields = spec.model_dump(exclude={"rows", "ignore", "reject"})
    built = 0
    for state, event, table in _mutants(spec):
        try:
            mutant = MachineSpec(**fields, **{k: tuple(v) for k, v in table.items()})
        except SpecError:
            continue  # an invalid spec fails at import, before any test
        built += 1
        with pytest.raises(AssertionError, match=f"cell {machine}-{state}-{event}"):
            check_cell(mutant, GOLDEN[machine], state, event)
    assert built > 0

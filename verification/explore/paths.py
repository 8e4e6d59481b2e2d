"""Path coverage plans: from a machine's initial state, paths that reach every state and
take every transition row at least once.

Shortest paths, extended: from where the current path stands, the shortest way to a row
not taken yet is appended; when no such row can be reached from there (a final state),
a new path starts from the initial state. A row that can never be taken (no path leads to
its state, or an earlier row of its cell always wins) and a state no row leads to are
reported as ``CoverageError``.

Pure: the plans are data, driven through the real actor by the tests.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from statemachines import MachineSpec, Row


class CoverageError(ValueError):
    """Part of a machine cannot be reached; the message names each part."""


@dataclass(frozen=True)
class PathStep:
    row: Row
    # the event is the source state's own timeout: the test lets time pass for it
    by_timeout: bool

    @property
    def dest(self) -> str:
        return self.row.dest if self.row.dest is not None else self.row.source

    def __str__(self) -> str:
        guards = f" [{', '.join(self.row.guards)}]" if self.row.guards else ""
        how = " (timeout)" if self.by_timeout else ""
        return f"{self.row.source} --{self.row.event}{guards}{how}--> {self.dest}"


def shadowed(spec: MachineSpec, r: Row) -> Row | None:
    """An earlier row of ``r``'s cell that is taken whenever ``r``'s guards hold."""
    for other in spec.rows:
        if other is r:
            return None
        if (
            other.source == r.source
            and other.event == r.event
            and set(other.guards) <= set(r.guards)
        ):
            return other
    return None


def cover(spec: MachineSpec) -> list[list[PathStep]]:
    """Paths from ``spec.initial`` that together take every row and reach every state."""
    rows = list(spec.rows)
    problems: list[str] = []
    takeable: list[int] = []
    for k, r in enumerate(rows):
        earlier = shadowed(spec, r)
        if earlier is not None:
            problems.append(
                f"row {_name(r)} is never taken: the earlier row guarded by "
                f"{list(earlier.guards) or 'nothing'} wins whenever its guards hold"
            )
        else:
            takeable.append(k)
    out_of: dict[str, list[int]] = {}
    for k in takeable:
        out_of.setdefault(rows[k].source, []).append(k)

    def dest(k: int) -> str:
        r = rows[k]
        return r.dest if r.dest is not None else r.source

    reachable = {spec.initial}
    frontier = [spec.initial]
    while frontier:
        s = frontier.pop()
        for k in out_of.get(s, []):
            if dest(k) not in reachable:
                reachable.add(dest(k))
                frontier.append(dest(k))
    for st in spec.state_names:
        if st not in reachable:
            problems.append(f"state {st!r} is unreachable from {spec.initial!r}")
    for k in takeable:
        if rows[k].source not in reachable:
            problems.append(f"row {_name(rows[k])} starts from an unreachable state")
    if problems:
        raise CoverageError(f"machine {spec.name!r}: " + "; ".join(problems))

    todo = set(takeable)
    paths: list[list[PathStep]] = []
    while todo:
        path: list[PathStep] = []
        at = spec.initial
        armed = _arms(spec, at)
        while True:
            way = _shortest_to_untaken(spec, rows, out_of, at, todo)
            if way is None:
                break
            for k in way:
                r = rows[k]
                timeout = spec.state(r.source).timeout
                by_timeout = armed and timeout is not None and timeout.event == r.event
                path.append(PathStep(r, by_timeout))
                todo.discard(k)
                if r.dest is not None:  # a state entered (again) arms its timer
                    armed = _arms(spec, r.dest)
                elif by_timeout:
                    armed = False  # fired, and an internal row does not re-arm it
                at = dest(k)
        if not path:  # cannot happen after the reachability check; never loop on it
            raise CoverageError(f"machine {spec.name!r}: rows left untaken: {sorted(todo)}")
        paths.append(path)
    return paths


def _arms(spec: MachineSpec, state: str) -> bool:
    return spec.state(state).timeout is not None


def _shortest_to_untaken(
    spec: MachineSpec, rows: list[Row], out_of: dict[str, list[int]], at: str, todo: set[int]
) -> list[int] | None:
    """The fewest rows from ``at`` whose last one is not taken yet (breadth first)."""
    back: dict[str, tuple[str, int] | None] = {at: None}
    queue = deque([at])
    while queue:
        s = queue.popleft()
        for k in out_of.get(s, []):
            if k in todo:
                way = [k]
                cur = s
                while back[cur] is not None:
                    prev = back[cur]
                    assert prev is not None
                    cur, via = prev
                    way.append(via)
                way.reverse()
                return way
        for k in out_of.get(s, []):
            r = rows[k]
            d = r.dest if r.dest is not None else r.source
            if d not in back:
                back[d] = (s, k)
                queue.append(d)
    return None


def _name(r: Row) -> str:
    guards = f" [{', '.join(r.guards)}]" if r.guards else ""
    return f"({r.source}, {r.event}){guards}"

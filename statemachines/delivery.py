"""How a room fact and an effect's outcome reach the machines of one job, written once.

The runtime (``agent_runtime.runtimes.routing``: each machine's room follower, the job's
``Wiring``) delivers through these functions, and the diagrams and the mutation tool read
them: which machines hear a fact
and in which order (``statemachines.system.FOLLOW_ORDER``), which of a machine's routes a
fact fires (``statemachines.routing.ROUTES``, conditions from
``statemachines.glue.ROOM_CONDITIONS``), and which declared links an effect posts
(``statemachines.links.LINKS``, with their flags). Pure: nothing here posts anything.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping

from .glue import ROOM_CONDITIONS, Fact, RoomFacts
from .links import Link
from .routing import ROUTES, Route, routes_for
from .system import FOLLOW_ORDER

LinkKey = tuple[str, str, str]  # (source machine, its effect, its task's step or "")


def follow_rank(machine: str) -> int:
    """Where ``machine`` hears a room fact among a job's machines: in ``FOLLOW_ORDER``,
    then every other machine (in the order they subscribed)."""
    return FOLLOW_ORDER.index(machine) if machine in FOLLOW_ORDER else len(FOLLOW_ORDER)


# every machine some route names, in the order they hear a fact (stable: ROUTES order after
# FOLLOW_ORDER)
FOLLOWERS: tuple[str, ...] = tuple(
    sorted(dict.fromkeys(r.machine for r in ROUTES), key=follow_rank)
)


@functools.cache
def routes_by_fact(machine: str) -> Mapping[str, tuple[Route, ...]]:
    """``machine``'s routes grouped by fact name: built once, shared by every job."""
    by_fact: dict[str, list[Route]] = {}
    for r in routes_for(machine):
        by_fact.setdefault(r.fact, []).append(r)
    return {fact: tuple(rs) for fact, rs in by_fact.items()}


def routes_fired(routes: Iterable[Route], room: RoomFacts, fact: Fact) -> list[Route]:
    """Of ``routes`` (one machine's, naming this fact), those whose conditions all hold on
    ``room``: what that machine knew of the room just before the fact."""
    return [r for r in routes if all(ROOM_CONDITIONS[c](room, fact) for c in r.when)]


def index_links(links: Iterable[Link]) -> dict[LinkKey, tuple[Link, ...]]:
    """The links by what fires them, in declaration order."""
    index: dict[LinkKey, tuple[Link, ...]] = {}
    for k in links:
        key = (k.source, k.on, k.step)
        index[key] = (*index.get(key, ()), k)
    return index


def links_fired(
    index: Mapping[LinkKey, tuple[Link, ...]],
    key: LinkKey,
    job_flags: Mapping[str, bool],
) -> Iterator[Link]:
    """The links of ``key`` whose flags all hold in the job's ``job_flags`` (a flag the job
    does not set is off)."""
    for link in index.get(key, ()):
        if all(job_flags.get(f, False) for f in link.when):
            yield link

"""Mutants of the system between the machines, not of a table cell: a link fired before its
effect, a teardown's steps swapped, a watch, report, link or room route removed, the order
the machines follow the room reversed, a step's share or its ``after`` dropped.

The system is data (``statemachines.links.LINKS``, ``statemachines.routing.ROUTES``,
``statemachines.system``'s ``WATCHES``, ``REPORTS``, ``FOLLOW_ORDER``, ``TEARDOWN``,
``RELEASE``) that the runtime reads where it was imported, and as the default of a few
parameters (``Wiring(links=LINKS)``, ``watched(watches=WATCHES)``,
``hear_reports(reports=REPORTS)``).
``applied`` puts a changed declaration wherever the original object is read, by identity,
as ``swap.swapped`` does for a spec, and puts it back after; a change of how links are
delivered patches the one delivery function instead. ``Touches`` records, per test, which
parts of the system it reached (a link posted, a watch fired, a route fired, a follower
subscribed, a report delivered, a teardown step begun or cut): a mutant is judged by the
tests that reach what it changes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from verification.mutation.swap import _namespaces

Touch = str  # "link S.ON[/STEP]->T.EV", "watch S->T.EV", "report S.R->T.EV",
# "route FACT->M.EV", "follow M", "step DECL.NAME", "cut DECL.NAME" (DECL: TEARDOWN or RELEASE)


@dataclass(frozen=True)
class SystemMutant:
    name: str  # its key: short, stable, no spaces
    what: str  # the change, in a line
    touches: tuple[Touch, ...]  # a test that reached any of these (prefixes) is selected
    replace: tuple[tuple[object, object], ...] = ()  # original -> changed declaration
    patch: Callable[[], AbstractContextManager[Any]] | None = None  # a delivery changed
    min_followers: int = 0  # selected only where this many machines follow the room

    def selects(self, touched: frozenset[Touch] | set[Touch]) -> bool:
        if self.min_followers:
            return sum(t.startswith("follow ") for t in touched) >= self.min_followers
        return any(t.startswith(self.touches) for t in touched)


# -- putting a changed declaration where the runtime reads it -------------------------------


def _functions(namespace: dict[str, Any], modules: set[str]) -> Iterator[Any]:
    """The project's functions in ``namespace``: its own, and its classes' methods."""
    for value in list(namespace.values()):
        if getattr(value, "__module__", None) not in modules:
            continue
        if inspect.isfunction(value):
            yield value
        elif inspect.isclass(value):
            for attr in list(vars(value).values()):
                fn = getattr(attr, "__func__", attr)  # staticmethod, classmethod
                if inspect.isfunction(fn):
                    yield fn


def replace_everywhere(old: object, new: object) -> int:
    """Put ``new`` wherever a loaded project module holds ``old``: a module attribute, or
    the default of a function's parameter (read at call time, unlike the module's name)."""
    count = 0
    namespaces = _namespaces()
    modules = {str(ns.get("__name__")) for ns in namespaces}
    seen: set[int] = set()
    for namespace in namespaces:
        for name, value in list(namespace.items()):
            if value is old:
                namespace[name] = new
                count += 1
        for fn in _functions(namespace, modules):
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            if fn.__defaults__ and any(d is old for d in fn.__defaults__):
                fn.__defaults__ = tuple(new if d is old else d for d in fn.__defaults__)
                count += 1
            kw = fn.__kwdefaults__
            if kw:
                for k, d in kw.items():
                    if d is old:
                        kw[k] = new
                        count += 1
    return count


def _clear_caches() -> None:
    # a machine's routes by fact are cached once per process: built again from ROUTES
    from statemachines.delivery import routes_by_fact

    routes_by_fact.cache_clear()


@contextmanager
def applied(m: SystemMutant) -> Iterator[int]:
    """``m`` in force for the duration; yields how many places took the change."""
    done: list[tuple[object, object]] = []
    places = 0
    try:
        with ExitStack() as stack:
            for old, new in m.replace:
                places += replace_everywhere(old, new)
                done.append((old, new))
            _clear_caches()
            if m.patch is not None:
                stack.enter_context(m.patch())
                places += 1
            yield places
    finally:
        for old, new in reversed(done):
            replace_everywhere(new, old)
        _clear_caches()


# -- the mutants -----------------------------------------------------------------------------


@contextmanager
def _links_before_effects() -> Iterator[None]:
    """Every effect's links fire as its step begins, before the effect runs, with the data
    of the event that triggered it; its success (its ``Output``) fires nothing."""
    from agent_runtime._perform import Performer

    run_now, done, task_done, start_task = (
        Performer._run_effects_now,
        Performer._effect_done,
        Performer._task_succeeded,
        Performer._start_task,
    )

    def fire_first(actor: Any, names: Any, data: Any) -> None:
        if actor._outputs is not None:
            for name in names:
                if name in actor._linked:
                    actor._outputs.fire(actor.spec.name, name, data)

    def run_effects_now(self: Any, st: Any, event: Any, tracing: bool, start: int = 0) -> Any:
        if start == 0 and st.outcome == "transition":  # later calls resume the same step
            fire_first(self, st.effects, event.data)
        return run_now(self, st, event, tracing, start)

    def silenced(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            outputs, self._outputs = self._outputs, None
            try:
                return original(self, *args, **kwargs)
            finally:
                self._outputs = outputs

        return call

    def start(self: Any, name: str, gen: int, by: str = "") -> None:
        fire_first(self, (name,), {})
        start_task(self, name, gen, by)

    Performer._run_effects_now = run_effects_now  # type: ignore[method-assign]
    Performer._effect_done = silenced(done)  # type: ignore[method-assign]
    Performer._task_succeeded = silenced(task_done)  # type: ignore[method-assign]
    Performer._start_task = start  # type: ignore[method-assign]
    try:
        yield
    finally:
        Performer._run_effects_now = run_now  # type: ignore[method-assign]
        Performer._effect_done = done  # type: ignore[method-assign]
        Performer._task_succeeded = task_done  # type: ignore[method-assign]
        Performer._start_task = start_task  # type: ignore[method-assign]


def _link_key(k: Any) -> Touch:
    step = f"/{k.step}" if k.step else ""
    return f"link {k.source}.{k.on}{step}->{k.target}.{k.event}"


def _report_key(r: Any) -> Touch:
    return f"report {r.source}.{r.report}->{r.target}.{r.event}"


def _steps_changed(steps: tuple[Any, ...], **changes: dict[str, Any]) -> tuple[Any, ...]:
    """``steps`` with the fields of the named ones changed (``_reordered`` puts each step
    after the ones it now comes after, as the teardown's check wants)."""
    return tuple(s.model_copy(update=changes.get(s.name, {})) for s in steps)


def _reordered(steps: tuple[Any, ...], order: tuple[str, ...]) -> tuple[Any, ...]:
    by_name = {s.name: s for s in steps}
    return tuple(by_name[n] for n in order)


def system_mutants() -> list[SystemMutant]:
    """The system mutants, in a fixed order (their names are their keys). Built from the
    declarations as they are now: call it with no mutant applied."""
    from statemachines import delivery
    from statemachines.links import LINKS
    from statemachines.routing import ROUTES
    from statemachines.system import FOLLOW_ORDER, RELEASE, REPORTS, TEARDOWN, WATCHES

    out: list[SystemMutant] = [
        SystemMutant(
            "links-before-effects",
            "every effect's links fire before the effect runs, with the triggering event's "
            "data instead of the effect's Output",
            tuple(_link_key(k) for k in LINKS if not k.step),
            patch=_links_before_effects,
        ),
    ]
    # the job's close: the avatar's step before the session's (each keeps its share)
    swapped = _steps_changed(
        TEARDOWN,
        avatar={"after": ("host",)},
        session={"after": ("avatar",)},
        disconnect={"after": ("session",)},
    )
    out.append(
        SystemMutant(
            "teardown-avatar-before-session",
            "TEARDOWN's session and avatar steps swapped: the avatar closes before the session",
            ("step TEARDOWN.",),
            replace=(
                (
                    TEARDOWN,
                    _reordered(
                        swapped, ("host", "avatar", "session", "disconnect", "room", "callbacks")
                    ),
                ),
            ),
        )
    )
    followers = ("session", "playout", "participant", "avatar")
    release = _steps_changed(
        RELEASE,
        **{n: {"after": ("starts",)} for n in followers},
        job={"after": followers},
        let_go={"after": ("job",)},
    )
    out.append(
        SystemMutant(
            "release-followers-before-job",
            "RELEASE's order swapped: the followers are released before the job machine closes",
            ("step RELEASE.",),
            replace=((RELEASE, _reordered(release, ("starts", *followers, "job", "let_go"))),),
        )
    )
    out.append(
        SystemMutant(
            "teardown-session-unbounded",
            "TEARDOWN's session step keeps no share: a session whose close hangs holds the "
            "avatar's step (and the rest) until the whole close is cut",
            ("cut TEARDOWN.session",),
            replace=((TEARDOWN, _steps_changed(TEARDOWN, session={"timed_by": "job"})),),
        )
    )
    out.append(
        SystemMutant(
            "teardown-disconnect-no-after",
            "TEARDOWN's disconnect step loses its after: the room disconnects as the host "
            "step begins, before the session and the avatar close",
            ("step TEARDOWN.",),
            replace=(
                (
                    TEARDOWN,
                    _reordered(
                        _steps_changed(
                            TEARDOWN,
                            disconnect={"after": ()},
                            room={"after": ("avatar", "disconnect")},
                        ),
                        ("host", "disconnect", "session", "avatar", "room", "callbacks"),
                    ),
                ),
            ),
        )
    )
    for w in WATCHES:
        key = f"watch {w.source}->{w.target}.{w.event}"
        out.append(
            SystemMutant(
                f"watch-removed:{w.source}->{w.target}.{w.event}",
                f"the watch {w.source} -> {w.target}.{w.event} removed ({w.note})",
                (key,),
                replace=((WATCHES, tuple(x for x in WATCHES if x is not w)),),
            )
        )
    for r in REPORTS:
        key = _report_key(r)
        out.append(
            SystemMutant(
                f"report-removed:{key.removeprefix('report ')}",
                f"the report {key.removeprefix('report ')} removed ({r.note})",
                (key,),
                replace=((REPORTS, tuple(x for x in REPORTS if x is not r)),),
            )
        )
    chosen = (
        ("session_host", "report_session_closed", "", "job"),
        ("playout", "finish_playout", "", "avatar"),
        ("agent_job", "ask_abort", "", "job"),
        ("participant", "report_close_timed_out", "", "job"),
        ("finalize", "report_answered", "", "job"),
        ("job", "run_close", "avatar", "avatar"),
        ("session", "report_own_closed", "", "participant"),
    )
    for source, on, step, target in chosen:
        (link,) = [
            k for k in LINKS if (k.source, k.on, k.step, k.target) == (source, on, step, target)
        ]
        key = _link_key(link)
        out.append(
            SystemMutant(
                f"link-removed:{key.removeprefix('link ')}",
                f"the link {key.removeprefix('link ')} removed",
                (key,),
                replace=((LINKS, tuple(k for k in LINKS if k is not link)),),
            )
        )
    reversed_order = tuple(reversed(FOLLOW_ORDER))
    rank = {m: i for i, m in enumerate(reversed_order)}
    out.append(
        SystemMutant(
            "follow-order-reversed",
            f"FOLLOW_ORDER reversed ({', '.join(reversed_order)}): the participant hears a "
            "room fact first, the job last",
            (),
            replace=(
                (FOLLOW_ORDER, reversed_order),
                (
                    delivery.FOLLOWERS,
                    tuple(sorted(delivery.FOLLOWERS, key=lambda m: rank.get(m, len(rank)))),
                ),
            ),
            min_followers=2,
        )
    )
    for fact, machine, event in (
        ("participant_left", "job", "simulator_left"),
        ("participant_left", "avatar", "avatar_left"),
        ("room_disconnected", "job", "room_disconnected"),
        ("participant_joined", "participant", "participant_connected"),
    ):
        (route,) = [r for r in ROUTES if (r.fact, r.machine, r.event) == (fact, machine, event)]
        key = f"route {fact}->{machine}.{event}"
        out.append(
            SystemMutant(
                f"route-removed:{fact}->{machine}.{event}",
                f"the room route {fact} -> {machine}.{event} removed",
                (key,),
                replace=((ROUTES, tuple(r for r in ROUTES if r is not route)),),
            )
        )
    return out


def by_name(names: list[str] | None = None) -> list[SystemMutant]:
    every = system_mutants()
    if names is None:
        return every
    known = {m.name: m for m in every}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"no system mutant {unknown[0]!r}; mutants: {', '.join(known)}")
    return [known[n] for n in names]


# -- what a test reaches of the system -------------------------------------------------------


class Touches:
    """The parts of the system reached while installed (``touched``): the runtime's
    delivery functions wrapped where the runtime calls them."""

    def __init__(self) -> None:
        self.touched: set[Touch] = set()

    @contextmanager
    def installed(self) -> Iterator[Touches]:
        import agent_runtime.runtimes.routing as routing
        import agent_runtime.system.job_system as job_system
        from agent_runtime.runtimes.teardown import Teardown
        from statemachines import system

        touched = self.touched
        # the names the runtime calls them by, looked up at each call
        links_fired, routes_fired = vars(routing)["links_fired"], vars(routing)["routes_fired"]
        follow_rank, watched = vars(routing)["follow_rank"], vars(job_system)["watched"]
        deliver_report = vars(routing)["deliver_report"]
        begin, cut = Teardown._begin_step, Teardown._cut

        def decl(td: Teardown) -> str:
            return "TEARDOWN" if td.steps is system.TEARDOWN else "RELEASE"

        def links(*args: Any) -> Iterator[Any]:
            for k in links_fired(*args):
                touched.add(_link_key(k))
                yield k

        def routes(rs: Any, room: Any, fact: Any) -> list[Any]:
            fired: list[Any] = routes_fired(rs, room, fact)
            touched.update(f"route {r.fact}->{r.machine}.{r.event}" for r in fired)
            return fired

        def rank(machine: str) -> int:
            touched.add(f"follow {machine}")
            return int(follow_rank(machine))

        def watches(source: str, from_state: str, to_state: str, target: str) -> Any:
            events = watched(source, from_state, to_state, target)
            touched.update(f"watch {source}->{target}.{e}" for e in events)
            return events

        def reported(report: Any, handler: Any, post: Any, payload: Any) -> None:
            touched.add(_report_key(report))
            deliver_report(report, handler, post, payload)

        def begin_step(td: Teardown, step: Any, work: Any) -> Any:
            touched.add(f"step {decl(td)}.{step.name}")
            return begin(td, step, work)

        def cut_step(td: Teardown, step: Any) -> None:
            touched.add(f"cut {decl(td)}.{step.name}")
            cut(td, step)

        wrapped = (
            (routing, "links_fired", links, links_fired),
            (routing, "routes_fired", routes, routes_fired),
            (routing, "follow_rank", rank, follow_rank),
            (job_system, "watched", watches, watched),
            (routing, "deliver_report", reported, deliver_report),
            (Teardown, "_begin_step", begin_step, begin),
            (Teardown, "_cut", cut_step, cut),
        )
        for owner, name, wrapper, _ in wrapped:
            setattr(owner, name, wrapper)
        try:
            yield self
        finally:
            for owner, name, _, original in wrapped:
                setattr(owner, name, original)

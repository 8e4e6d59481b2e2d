"""The runtime's emitter passes every listener exactly the arguments livekit's would.

``Emitter`` reads a listener's arity from its code instead of ``inspect.signature``; a
listener that got one argument more or fewer would break a user's callback, so each kind of
callable is checked against ``rtc.EventEmitter`` itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

import pydantic
import pytest
from livekit import rtc

from agent_runtime.emitter import Emitter, Listener, positional_arity

CALLS: list[Any] = []


class _Listener:
    def method(self, a: Any) -> None:
        CALLS.append(("method", a))

    def varargs(self, *args: Any) -> None:
        CALLS.append(("varargs", args))

    @staticmethod
    def static(a: Any, b: Any) -> None:
        CALLS.append(("static", a, b))

    @classmethod
    def klass(cls, a: Any) -> None:
        CALLS.append(("klass", a))

    def __call__(self, a: Any, b: Any = None) -> None:
        CALLS.append(("call", a, b))


def _logged(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


def _two(a: Any, b: Any) -> None:
    CALLS.append(("two", a, b))


def _none() -> None:
    CALLS.append(("none",))


def _keyword_only(a: Any, *, b: Any = 1) -> None:
    CALLS.append(("kw", a, b))


def _defaults(a: Any, b: Any = 2, c: Any = 3, d: Any = 4) -> None:
    CALLS.append(("defaults", a, b, c, d))


@_logged
def _decorated_one(a: Any) -> None:
    CALLS.append(("decorated", a))


L = _Listener()
LISTENERS: dict[str, Callable[..., Any]] = {
    "function of two": _two,
    "function of none": _none,
    "keyword-only after one": _keyword_only,
    "defaults beyond the arguments": _defaults,
    "lambda of one": lambda a: CALLS.append(("lambda", a)),
    "bound method": L.method,
    "bound method with *args": L.varargs,
    "staticmethod": L.static,
    "classmethod": L.klass,
    "callable object": L,
    "partial": functools.partial(_two, "fixed"),
    "decorated (functools.wraps: the wrapped signature counts)": _decorated_one,
    "builtin method": CALLS.append,
}


def _calls(emitter_cls: type[rtc.EventEmitter[str]], fn: Callable[..., Any]) -> list[Any]:
    CALLS.clear()
    em = emitter_cls()
    em.on("ev", fn)
    em.emit("ev", 1, 2, 3)
    return list(CALLS)


@pytest.mark.parametrize("name", sorted(LISTENERS))
def test_each_listener_gets_what_livekit_would_give_it(name: str) -> None:
    fn = LISTENERS[name]
    theirs = _calls(rtc.EventEmitter, fn)
    assert theirs  # the listener ran
    assert _calls(Emitter, fn) == theirs


@pytest.mark.parametrize("name", sorted(LISTENERS))
def test_a_listener_on_livekit_s_emitter_gets_what_the_bare_callable_would(name: str) -> None:
    # Listener is what the runtime registers on livekit's own emitters (the session's)
    fn = LISTENERS[name]
    assert _calls(rtc.EventEmitter, Listener(fn)) == _calls(rtc.EventEmitter, fn)


def test_livekit_s_emit_reads_a_listener_s_signature_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import inspect

    built: list[Any] = []
    real = inspect._signature_from_function  # type: ignore[attr-defined]

    def counting(cls: Any, func: Any, *args: Any, **kw: Any) -> inspect.Signature:
        built.append(func)
        return real(cls, func, *args, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(inspect, "_signature_from_function", counting)
    method = _Listener().method
    em: rtc.EventEmitter[str] = rtc.EventEmitter()
    em.on("ev", method)
    em.emit("ev", 1)
    assert len(built) == 1  # livekit's emit builds a bare method's signature each time
    em.off("ev", method)
    built.clear()
    listener = Listener(method)
    em.on("ev", listener)
    em.emit("ev", 1, 2)
    assert built == []  # this one's is read as it is
    em.off("ev", listener)
    CALLS.clear()
    em.emit("ev", 3)
    assert CALLS == []  # the instance registered is the one taken back


@pytest.mark.parametrize("name", sorted(LISTENERS))
def test_the_arity_read_from_code_is_the_signature_s(name: str) -> None:
    import inspect

    fn = LISTENERS[name]
    params = inspect.signature(fn).parameters.values()
    want = (
        None
        if any(p.kind == p.VAR_POSITIONAL for p in params)
        else sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    )
    assert positional_arity(fn) == want


@pytest.mark.parametrize(
    "error",
    [RuntimeError("boom"), TypeError("bad"), asyncio.CancelledError()],
    ids=["exception", "type-error", "cancelled"],
)
def test_whatever_a_listener_raises_is_logged_once_and_the_listener_removed(
    caplog: pytest.LogCaptureFixture, error: BaseException
) -> None:
    """Unlike livekit's (which lets a TypeError through to the emitter): a listener is
    observation, and the runtime's machines emit from inside their steps."""
    em: Emitter[str] = Emitter()
    later: list[str] = []
    calls: list[int] = []

    def fails(x: int) -> None:
        calls.append(x)
        raise error

    em.on("ev", fails)
    em.on("ev", lambda _: later.append("ran"))
    with caplog.at_level(logging.ERROR, logger="agent_runtime.emitter"):
        em.emit("ev", 1)
        em.emit("ev", 2)
    assert later == ["ran", "ran"]  # a failing listener does not keep the others from hearing
    assert calls == [1]  # removed at its first failure
    logged = [r for r in caplog.records if "a ev listener failed" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR
    assert type(error).__name__ in logged[0].getMessage()


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
def test_ctrl_c_or_exit_inside_a_listener_ends_the_program_and_keeps_the_listener(
    error: type[BaseException],
) -> None:
    """A Ctrl-C that lands while a listener runs is the user's, not the listener's failure:
    swallowing it kept ``agent-runtime simulate`` running (exit 1, not 130)."""
    em: Emitter[str] = Emitter()
    calls: list[int] = []

    def interrupted(x: int) -> None:
        calls.append(x)
        raise error

    em.on("ev", interrupted)
    with pytest.raises(error):
        em.emit("ev", 1)
    with pytest.raises(error):
        em.emit("ev", 2)
    assert calls == [1, 2]


def test_once_and_off_behave_as_livekit_s() -> None:
    em: Emitter[str] = Emitter()
    got: list[int] = []
    em.once("ev", got.append)
    em.emit("ev", 1)
    em.emit("ev", 2)

    def keep(x: int) -> None:
        got.append(x * 10)

    em.on("ev", keep)
    em.emit("ev", 3)
    em.off("ev", keep)
    em.emit("ev", 4)
    assert got == [1, 30]


def test_an_async_listener_is_refused_as_livekit_refuses_it() -> None:
    async def handler(_: Any) -> None:
        pass

    for cls in (rtc.EventEmitter, Emitter):
        em = cls()
        with pytest.raises(ValueError, match="async callback"):
            em.on("ev", handler)
        with pytest.raises(ValueError, match="async callback"):
            em.on("ev")(handler)
        em.emit("ev", 1)  # nothing was registered


def test_registration_order_duplicates_and_decorators_match_livekit() -> None:
    def run(cls: type[rtc.EventEmitter[str]]) -> list[Any]:
        got: list[Any] = []
        em = cls()

        def a(x: Any) -> None:
            got.append(("a", x))

        @em.on("ev")
        def b(x: Any) -> None:
            got.append(("b", x))

        @em.once("ev")
        def c(x: Any) -> None:
            got.append(("c", x))

        em.on("ev", a)
        em.on("ev", b)  # already there: neither twice nor moved
        em.emit("ev", 1)
        em.off("ev", b)
        em.off("ev", b)  # unknown now: nothing happens
        em.off("never", a)
        em.emit("ev", 2)
        em.off("ev", a)
        em.emit("ev", 3)
        em.on("ev", b)
        em.emit("ev", 4)
        return got

    assert run(Emitter) == run(rtc.EventEmitter)
    assert run(Emitter) == [("b", 1), ("c", 1), ("a", 1), ("a", 2), ("b", 4)]


def test_a_listener_added_or_removed_during_emit_waits_for_the_next_one() -> None:
    def run(cls: type[rtc.EventEmitter[str]]) -> list[str]:
        got: list[str] = []
        em = cls()

        def late(_: Any) -> None:
            got.append("late")

        def second(_: Any) -> None:
            got.append("second")

        def first(_: Any) -> None:
            got.append("first")
            em.on("ev", late)
            em.off("ev", second)

        em.on("ev", first)
        em.on("ev", second)
        em.emit("ev", 1)
        em.emit("ev", 2)
        return got

    assert run(Emitter) == run(rtc.EventEmitter) == ["first", "second", "first", "late"]


def test_emitters_that_start_without_listeners_never_share_one() -> None:
    # (an emitter holds no dict of its own until its first listener: the empty one it
    # starts with must never be written through)
    first, second, third = Emitter[str](), Emitter[str](), Emitter[str]()
    heard: list[str] = []
    first.on("x", lambda v: heard.append(f"first {v}"))
    first.once("y", lambda v: heard.append(f"first once {v}"))
    second.off("x", print)  # an off on an emitter nobody listened to changes nothing
    second.emit("x", 1)
    third.emit("y", 2)
    assert heard == []
    first.emit("x", 3)
    first.emit("y", 4)
    first.emit("y", 5)
    assert heard == ["first 3", "first once 4"]
    third.on("x", lambda v: heard.append(f"third {v}"))
    second.emit("x", 6)
    third.emit("x", 7)
    assert heard[2:] == ["third 7"]


class _ModelListener(pydantic.BaseModel):
    """A user's listener that is a pydantic model: its class's ``__signature__`` is the
    model's constructor (fields ``a`` and ``b``, keyword-only), not its ``__call__``."""

    model_config = pydantic.ConfigDict(frozen=True)  # hashable: livekit keeps a set
    a: int = 0
    b: int = 0

    def __call__(self, payload: Any) -> None:
        CALLS.append(("model", payload))


def test_a_callable_pydantic_model_listener_gets_what_livekit_would_give_it() -> None:
    fn = _ModelListener()
    theirs = _calls(rtc.EventEmitter, fn)
    assert theirs == [("model", 1)]
    assert _calls(Emitter, fn) == theirs

"""The fixtures of the tests that build a whole job: a virtual clock, an in-memory room
connected locally (named by the test module's ``ROOM``), a fake livekit job context over it,
livekit's tracer exporting to memory. A module's own fixture of the same name takes
precedence. And, for every test, the check that no task's failure was left unread."""

from __future__ import annotations

import ast
import asyncio
import gc
import os
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from livekit.agents import telemetry
from livekit.agents.job import JobContext
from livekit.agents.testing import fake_job_context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_runtime.sdk import asyncio_compat as aio
from agent_runtime.testing.clock import VirtualClock
from agent_runtime.testing.inmemory import InMemoryRoom

_parse = ast.parse


def _parse_without_collector(*args: Any, **kwargs: Any) -> Any:
    # on CPython 3.11 a parse nested in another breaks the outer one with "SystemError: AST
    # constructor recursion depth mismatch" (gh-106905, never fixed there). A collection in
    # the middle of a parse runs earlier tests' finalizers, and one that imports a module
    # nests pytest's assertion rewrite (a parse) inside it. Seen in test_fuzz under load,
    # from pytest's rewrite of a module imported mid-test and from hypothesis' getsource
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _parse(*args, **kwargs)
    finally:
        if enabled:
            gc.enable()


ast.parse = _parse_without_collector


def pytest_collection_finish(session: pytest.Session) -> None:
    # the modules and the collected tests live as long as the run: frozen, the collector
    # leaves them out of every full collection (one walked them all, about as long as a
    # property example takes); what a test builds is collected as before. Hypothesis is
    # imported first: its plugins' register_random looks for the random's referrers
    # through the collector, which no longer sees a frozen one
    import hypothesis  # noqa: F401

    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def no_module_left_from_a_tmp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A module a test loaded from a pytest temporary folder (an agent file the CLI
    fuzzed) is unloaded after it, and ``sys.path`` is put back: left, a temporary
    ``support.py`` hid the package ``tests/support`` from a later test in the process."""
    path = list(sys.path)
    before = set(sys.modules)
    yield
    sys.path[:] = path
    base = os.path.join(tmp_path_factory.getbasetemp(), "")
    for name in set(sys.modules) - before:
        # read from the module's own namespace: a lazy module's __getattr__ may import
        file = getattr(sys.modules[name], "__dict__", {}).get("__file__")
        if isinstance(file, str) and file.startswith(base):
            del sys.modules[name]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
async def room(clock: VirtualClock, request: pytest.FixtureRequest) -> InMemoryRoom:
    room = InMemoryRoom(name=getattr(request.module, "ROOM", "room"), clock=clock)
    room.connect_locally()
    return room


@pytest.fixture
async def ctx(room: InMemoryRoom) -> AsyncIterator[JobContext]:
    with fake_job_context(room=room) as ctx:
        yield ctx
        ctx._tempdir.cleanup()  # upstream's job cleanup would; a fake job does not


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """livekit-agents' tracer with an SDK provider exporting to memory, for the test only."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    before = telemetry.tracer._tracer_provider
    telemetry.tracer.set_provider(provider)
    try:
        yield exporter
    finally:
        telemetry.tracer.set_provider(before)


# -- no task's failure left unread -------------------------------------------------------------

# livekit's own tasks that livekit itself leaves failed and unread, with or without the
# runtime (its coroutine's qualified name, in livekit-agents' own files), and why
LIVEKIT_LEAVES_UNREAD = {
    # a plugin avatar's wait for its participant: fails once the room disconnects before
    # the avatar published its video. AvatarSession.aclose() silences it (its cancel marks
    # a failed task read), but a plugin whose own aclose() hangs and never reaches the
    # base class's (tests/test_faults.py's _CloseHangs, _SlowClose) leaves it unread; as
    # livekit's own shutdown callback does without the runtime
    "AvatarSession._wait_avatar_join",
    # a data-stream avatar sink's wait for its avatar: fails once the room disconnects
    # before the avatar came (livekit logs it, its log_exceptions); livekit awaits it only
    # from capture_frame, so a sink that captured nothing leaves it unread, with or without
    # the runtime (the explorer's walks, in the exhaustive tier)
    "DataStreamAudioOutput._start_task",
    # a speech's task (say(), a reply) whose audio output failed under it (the room gone
    # while a data-stream sink waited for its avatar, a TTS stream that broke): livekit
    # logs it and ends the speech; its handle does not carry the failure, nothing reads it
    "AgentActivity._create_speech_task.<locals>._context_aware_coro",
}

_made: list[asyncio.Task[Any]] | None = None  # the failed tasks of the running test
_create_task = asyncio.BaseEventLoop.create_task


def _noted_if_failed(task: asyncio.Task[Any]) -> None:
    if _made is not None and not task.cancelled() and aio.peek_exception(task) is not None:
        # those read since let go: a failed task holds its traceback's frames (a fuzz
        # test's every run), and a test may count on what they hold being collected
        _made[:] = [t for t in _made if not aio.exception_retrieved(t)]
        _made.append(task)


def _create_task_noted(self: Any, coro: Any, **kw: Any) -> Any:
    # every loop's tasks (a virtual-time one, the kit's own, a test's asyncio.run) but only
    # the test's thread's: another thread's loop is the test's subject, not its fixture's
    task = _create_task(self, coro, **kw)
    if _made is not None and threading.get_ident() == _main_thread:
        task.add_done_callback(_noted_if_failed)
    return task


_main_thread = threading.get_ident()
asyncio.BaseEventLoop.create_task = _create_task_noted  # type: ignore[method-assign]


def _livekits_own(task: asyncio.Task[Any]) -> bool:
    coro = task.get_coro()
    code = getattr(coro, "cr_code", None)
    return (
        getattr(coro, "__qualname__", None) in LIVEKIT_LEAVES_UNREAD
        and code is not None
        and "/livekit/agents/" in code.co_filename.replace("\\", "/")
    )


@pytest.fixture(autouse=True)
def no_task_failure_left_unread() -> Iterator[None]:
    """Every task made during the test (the runtime's, the kit's, livekit's, the test's)
    that failed had its failure read by the end of the test (a livekit task of
    ``LIVEKIT_LEAVES_UNREAD`` aside). One left unread is reported by asyncio ("Task
    exception was never retrieved") whenever it is collected: after the whole run, or in
    the middle of a later test, far from the task that failed. A failed task is held until
    the test's end, until its failure is read (a task that has not failed is not)."""
    global _made
    _made = made = []
    try:
        yield
    finally:
        _made = None
    unread = [
        f"{t.get_name()} ({getattr(t.get_coro(), '__qualname__', '?')}): {aio.peek_exception(t)!r}"
        for t in made
        if not aio.exception_retrieved(t) and not _livekits_own(t)
    ]
    assert unread == [], "a task's failure was left unread"

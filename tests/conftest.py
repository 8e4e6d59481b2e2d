"""The fixtures of the tests that build a whole job: a virtual clock, an in-memory room
connected locally (named by the test module's ``ROOM``), a fake livekit job context over it,
livekit's tracer exporting to memory. A module's own fixture of the same name takes
precedence."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterator

import pytest
from livekit.agents import telemetry
from livekit.agents.job import JobContext
from livekit.agents.testing import fake_job_context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_runtime.testing.clock import VirtualClock
from agent_runtime.testing.inmemory import InMemoryRoom


def pytest_collection_finish(session: pytest.Session) -> None:
    # the modules and the collected tests live as long as the run: frozen, the collector
    # leaves them out of every full collection (one walked them all, about as long as a
    # property example takes); what a test builds is collected as before. Hypothesis is
    # imported first: its plugins' register_random looks for the random's referrers
    # through the collector, which no longer sees a frozen one
    import hypothesis  # noqa: F401

    gc.collect()
    gc.freeze()


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

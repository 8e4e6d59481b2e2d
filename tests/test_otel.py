"""OpenTelemetry output of a job (``OtelSink``), read through the OTel SDK's in-memory span
exporter and metric reader.

Real: livekit-agents' own tracer (``livekit.agents.telemetry.tracer``) given an SDK tracer
provider as an agent would (``tracer.set_provider``, what ``telemetry.set_tracer_provider``
does), the SDK's ``MeterProvider`` and ``InMemoryMetricReader``, the scenario runner's
``AgentJob`` with real ``AgentSession``s (their own ``agent_session`` spans). Faked as
everywhere: the room's server side (in-memory room).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from livekit.agents import AgentSession, telemetry
from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry.metrics._internal import _ProxyMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_runtime import AgentJob, injected
from agent_runtime.observe.otel import OtelSink, held_states
from agent_runtime.testing.inmemory import InMemoryRoom
from statemachines.machines import MACHINES
from statemachines.spec import MachineSpec, State, StateTimeout, cells, row
from tests.support.scenario_job import scenario_job

SCENARIOS = Path(__file__).resolve().parents[1] / "examples" / "scenarios"


def scenario(name: str) -> str:
    return (SCENARIOS / name).read_text(encoding="utf-8")


@pytest.fixture
def metrics() -> tuple[MeterProvider, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    return MeterProvider(metric_readers=[reader]), reader


def points(reader: InMemoryMetricReader, name: str) -> list[tuple[dict[str, Any], Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    return [
        (dict(p.attributes or {}), p)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.data.data_points
    ]


def transition_events(span: ReadableSpan) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == "fsm.transition"]


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


async def run_in_job_span(text: str, sink: OtelSink) -> None:
    """The scenario inside a ``job_entrypoint`` span, as livekit runs an entrypoint."""
    with telemetry.tracer.start_as_current_span("job_entrypoint"), injected(otel=sink):
        async with scenario_job(text):
            pass


async def test_each_transition_is_an_event_on_the_job_or_session_span_and_the_hold_a_span(
    spans: InMemorySpanExporter, metrics: tuple[MeterProvider, InMemoryMetricReader]
) -> None:
    provider, reader = metrics
    await run_in_job_span(
        scenario("sim_hangup_then_finalize.yaml"), OtelSink(meter_provider=provider)
    )
    (job_span,) = named(spans, "job_entrypoint")
    (session_span,) = named(spans, "agent_session")
    assert session_span.parent is not None and session_span.parent.span_id == (
        job_span.context.span_id
    )
    # while the session runs, its span takes the machines' transitions
    on_session = transition_events(session_span)
    assert {
        "fsm.machine": "session_host",
        "fsm.event": "attach",
        "fsm.source": "detached",
        "fsm.dest": "attached",
    }.items() <= on_session[0].items()
    assert any(e["fsm.machine"] == "participant" and e["fsm.dest"] == "linked" for e in on_session)
    # after it ended, the job's span takes them: the verdict ends the hold at t=14
    on_job = transition_events(job_span)
    (answered,) = [e for e in on_job if e["fsm.event"] == "finalize_answered"]
    assert {
        "fsm.machine": "job",
        "fsm.source": "awaiting_finalize",
        "fsm.dest": "closing",
        "fsm.t": 14.0,
    }.items() <= answered.items()
    assert not any(e["fsm.t"] == 14.0 for e in on_session)
    # the guard the job consulted to hold is on the event
    (hold,) = [e for e in on_session + on_job if e["fsm.dest"] == "awaiting_finalize"]
    assert hold["fsm.guard.hold_needed"] is True and hold["fsm.event"] == "session_closed"

    (held,) = named(spans, "job.awaiting_finalize")
    assert held.attributes is not None
    assert held.attributes["fsm.entered_by"] == "session_closed"
    assert held.attributes["fsm.outcome.event"] == "finalize_answered"
    assert held.attributes["fsm.outcome.dest"] == "closing"
    assert held.attributes["fsm.duration"] == 4.0  # t=10 to t=14 on the job's clock
    assert held.context.trace_id == job_span.context.trace_id
    (closing,) = named(spans, "job.closing")
    assert closing.attributes is not None
    assert (closing.attributes["fsm.outcome.event"], closing.attributes["fsm.outcome.dest"]) == (
        "close_done",
        "closed",
    )

    counted = {
        (a["fsm.machine"], a["fsm.event"], a["fsm.source"], a["fsm.dest"]): p.value
        for a, p in points(reader, "fsm.transitions")
    }
    assert counted[("job", "finalize_answered", "awaiting_finalize", "closing")] == 1
    assert counted[("session_host", "attach", "detached", "attached")] == 1
    (hold_time,) = [
        p
        for a, p in points(reader, "fsm.state.duration")
        if (a["fsm.machine"], a["fsm.state"]) == ("job", "awaiting_finalize")
    ]
    assert (hold_time.count, hold_time.sum) == (1, 4.0)


@pytest.mark.parametrize(
    ("file", "span", "outcome", "seconds"),
    [
        ("avatar_never_joins_session_first.yaml", "avatar.routing", ("join_timeout", "failed"), 5),
        ("avatar_start_error.yaml", "avatar.starting", ("start_error", "failed"), 0),
        (
            "user_drops_and_rejoins.yaml",
            "participant.grace",
            ("participant_connected", "linked"),
            3,
        ),
    ],
)
async def test_a_state_that_takes_time_is_a_span_ended_by_its_outcome(
    spans: InMemorySpanExporter,
    metrics: tuple[MeterProvider, InMemoryMetricReader],
    file: str,
    span: str,
    outcome: tuple[str, str],
    seconds: float,
) -> None:
    provider, reader = metrics
    await run_in_job_span(scenario(file), OtelSink(meter_provider=provider))
    (held,) = named(spans, span)
    assert held.attributes is not None
    assert (held.attributes["fsm.outcome.event"], held.attributes["fsm.outcome.dest"]) == outcome
    assert held.attributes["fsm.duration"] == seconds
    machine, state = span.split(".")
    (recorded,) = [
        p
        for a, p in points(reader, "fsm.state.duration")
        if (a["fsm.machine"], a["fsm.state"], a["fsm.outcome.event"])
        == (machine, state, outcome[0])
    ]
    assert recorded.sum == seconds
    if machine == "avatar":  # restores by cause: what sent the avatar to failed
        causes = {
            a["fsm.event"]: p.value
            for a, p in points(reader, "fsm.transitions")
            if a["fsm.machine"] == "avatar" and a["fsm.dest"] == "failed"
        }
        assert causes == {outcome[0]: 1}


def test_the_states_that_take_time_are_read_from_the_specs() -> None:
    held = held_states()
    assert {
        ("job", "awaiting_finalize"),
        ("job", "closing"),
        ("avatar", "routing"),
        ("participant", "grace"),
    } <= held
    assert not {("job", "serving"), ("avatar", "joined"), ("participant", "linked")} & held
    # a machine of someone else's: its timed state is one too, with no list to update
    spec = MachineSpec(
        name="door",
        initial="shut",
        states=(
            State(name="shut"),
            State(name="ajar", timeout=StateTimeout(event="tick", setting="s", default=1)),
        ),
        events=("push", "tick"),
        rows=(*row("shut", "push", "ajar"), *row("ajar", "tick", "shut")),
        ignore=(*cells("shut", "tick"), *cells("ajar", "push")),
    )
    assert held_states({**MACHINES, "door": spec}) - held == {("door", "ajar")}


class CountingTracer(trace_api.Tracer):
    """livekit's tracer, counting the spans asked of it."""

    def __init__(self) -> None:
        self.started = 0

    def start_span(self, *args: Any, **kwargs: Any) -> trace_api.Span:
        self.started += 1
        return telemetry.tracer.start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover
        raise AssertionError("the sink never makes its spans current")


@pytest.mark.parametrize("sdk", [False, True], ids=["no SDK", "SDK"])
async def test_without_an_sdk_nothing_is_built(
    monkeypatch: pytest.MonkeyPatch, spans: InMemorySpanExporter, sdk: bool
) -> None:
    """No OTel SDK: the job's spans are non-recording and the global meter provider is OTel's
    default proxy. Then the sink asks for no span, adds no event, makes no meter, though it
    sees every record (the same run with an SDK, as a control, does all of that)."""
    if not sdk:
        telemetry.tracer.set_provider(trace_api.NoOpTracerProvider())
    assert isinstance(metrics_api.get_meter_provider(), _ProxyMeterProvider)
    meters: list[str] = []
    real_get_meter = _ProxyMeterProvider.get_meter

    def get_meter(self: _ProxyMeterProvider, name: str, *args: Any, **kwargs: Any) -> Any:
        meters.append(name)
        return real_get_meter(self, name, *args, **kwargs)

    monkeypatch.setattr(_ProxyMeterProvider, "get_meter", get_meter)
    events: list[str] = []
    real_add_event = trace_api.NonRecordingSpan.add_event

    def add_event(self: trace_api.NonRecordingSpan, name: str, *a: Any, **k: Any) -> None:
        if name.startswith("fsm."):
            events.append(name)
        real_add_event(self, name, *a, **k)

    monkeypatch.setattr(trace_api.NonRecordingSpan, "add_event", add_event)
    counting = CountingTracer()
    sink = OtelSink(tracer=counting, meter_provider=None if not sdk else MeterProvider())
    seen: list[str] = []
    real_write = sink.write

    def write(record: Any) -> None:
        seen.append(f"{record.kind}:{record.machine}:{record.dest}")
        real_write(record)

    monkeypatch.setattr(sink, "write", write)
    await run_in_job_span(scenario("sim_hangup_then_finalize.yaml"), sink)

    assert "transition:job:awaiting_finalize" in seen  # installed, and given every record
    fsm_spans = [s for s in spans.get_finished_spans() if s.name.startswith("job.")]
    if sdk:
        assert counting.started >= 2 and len(fsm_spans) == 2
        assert sink._instruments is not None
    else:
        assert counting.started == 0  # no span object asked for, none to record
        assert events == [] and meters == []  # no event on a non-recording span, no meter
        assert sink._instruments is None and sink._held == {}
        assert spans.get_finished_spans() == ()


async def test_a_failing_exporter_changes_nothing_the_machines_do(
    spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(CountingTracer):
        def start_span(self, *args: Any, **kwargs: Any) -> trace_api.Span:
            raise RuntimeError("exporter down")

    sink = OtelSink(tracer=Broken())
    with telemetry.tracer.start_as_current_span("job_entrypoint"), injected(otel=sink):
        async with scenario_job(scenario("sim_hangup_then_finalize.yaml")) as (sim, _):
            assert sim.agent_job.states["job"] == "closed"
            assert sim.agent_job.verdict == {
                "success": False,
                "reason": "the agent vetoes this run",
            }
    failures = [r for r in caplog.records if "OpenTelemetry output failed" in r.message]
    assert len(failures) == 1  # said once, then the sink stands aside


async def test_the_otel_option() -> None:
    room = InMemoryRoom(name="otel-room")
    session: AgentSession[Any] = AgentSession()
    with pytest.raises(TypeError, match="otel must be True, False or an OtelSink, not str"):
        AgentJob(room=room, session=session, otel="yes")  # type: ignore[arg-type]
    off = AgentJob(room=room, session=session, otel=False)
    assert off.otel is None and off.tracer is None  # nothing traced: no record is built
    on = AgentJob(room=room, session=session)
    assert on.otel is not None and on.tracer is not None and on.otel in on.tracer.sinks
    await off.aclose(graceful=False)
    await on.aclose(graceful=False)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tracer": 5}, "OtelSink: tracer must be an OpenTelemetry Tracer, not int"),
        (
            {"meter_provider": "x"},
            "OtelSink: meter_provider must be an OpenTelemetry MeterProvider, not str",
        ),
        ({"parent": 3}, "OtelSink: parent must be callable, not int"),
    ],
)
def test_an_otel_sink_refuses_parts_of_the_wrong_type_naming_them(
    options: dict[str, Any], message: str
) -> None:
    # a tracer of 5 was taken, and the job's OTel output went off at its first record
    # (one WARNING) for a typo in its construction
    with pytest.raises(TypeError) as e:
        OtelSink(**options)
    assert str(e.value) == message

"""The trace as OpenTelemetry, through livekit-agents' own tracer.

``OtelSink`` is a trace sink (``Tracer(OtelSink())``; ``AgentJob`` installs one unless told
``otel=False``). For each record it is given:

- a transition is an event (``fsm.transition``: machine, instance, event, source, dest,
  effects, and each guard consulted as ``fsm.guard.NAME``) on the job's current span: the
  attached session's ``agent_session`` while one runs, else the span that was current when
  the job was built (``job_entrypoint`` inside a livekit job); a failed effect is an event
  (``fsm.effect_failed``) there too;
- a state that takes time is a span of its own (``job.awaiting_finalize``,
  ``avatar.routing``, ...), ended by the transition out of it with that transition's event and
  next state as its outcome. Which states take time is read from the specs: a state with a
  timeout or a state task (``invoke``);
- metrics: ``fsm.transitions`` counts transitions by machine, event, source and dest (the
  avatar's restores by cause are ``machine=avatar, dest=failed`` by ``event``);
  ``fsm.state.duration`` is a histogram of the time spent in those states, on the job's
  clock (the simulation holds are ``machine=job, state=awaiting_finalize``).

Nothing is built unless something records it: span work only while the job's span is
recording (no OTel SDK: livekit's spans are non-recording, so this sink starts no span and
adds no event), metric instruments only once a meter provider other than OTel's default
no-op one is in place.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api

# what get_meter_provider() answers until a provider is set; no public alias for it (the
# same import livekit-agents' telemetry makes, stable in the opentelemetry-api it pins)
from opentelemetry.environment_variables import OTEL_PYTHON_METER_PROVIDER
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.metrics._internal import _ProxyMeterProvider

from agent_runtime.observe.trace import TraceRecord, describe
from statemachines import MachineSpec
from statemachines.machines import MACHINES

logger = logging.getLogger("agent_runtime.otel")

ParentFn = Callable[[], otel_context.Context | None]
_NO_SDK = (metrics_api.NoOpMeterProvider, _ProxyMeterProvider)

# seconds: a state lasts from a few milliseconds (avatar routing to a quick join) to the
# 300 s simulation hold
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0)


def held_states(machines: Mapping[str, MachineSpec] = MACHINES) -> frozenset[tuple[str, str]]:
    """(machine, state) of every state that takes time: one with a timeout or a state task."""
    if machines is MACHINES:
        return _held_states_of_machines()
    return _held_states(machines)


@functools.cache
def _held_states_of_machines() -> frozenset[tuple[str, str]]:
    return _held_states(MACHINES)  # one set for every job


def _held_states(machines: Mapping[str, MachineSpec]) -> frozenset[tuple[str, str]]:
    return frozenset(
        (m.name, s.name)
        for m in machines.values()
        for s in m.states
        if s.timeout is not None or s.invoke
    )


# the OTel API builds its provider from this variable on first use
_PROVIDER_FROM_ENV = OTEL_PYTHON_METER_PROVIDER in os.environ


def _meter_provider_set() -> bool:
    """Whether a global meter provider is (or will be) in place: asked on every record with
    nothing recording, so it reads the API's global rather than the environment each time."""
    return metrics_internal._METER_PROVIDER is not None or _PROVIDER_FROM_ENV


@dataclass(slots=True)
class _Held:
    span: trace_api.Span | None  # None when the job's span was not recording at entry
    entered: float  # on the job's clock


class _Instruments:
    def __init__(self, meter: metrics_api.Meter) -> None:
        self.transitions = meter.create_counter(
            "fsm.transitions",
            unit="{transition}",
            description="transitions of the job's state machines, by machine, event, source, dest",
        )
        self.duration = meter.create_histogram(
            "fsm.state.duration",
            unit="s",
            description="time spent in a state that takes time (a timeout or a state task)",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )


class OtelSink:
    """Trace records as OTel span events, spans of the states that take time, and metrics.

    ``tracer`` defaults to livekit-agents' tracer (``livekit.agents.telemetry.tracer``, set
    with ``telemetry.set_tracer_provider``), ``meter_provider`` to OTel's global one.
    ``parent`` returns the context whose span takes the events and parents the state spans;
    without it, the context current when a record is written (``AgentJob`` sets it). One
    per job: it holds the spans of the states the job's machines are in.
    """

    def __init__(
        self,
        *,
        tracer: trace_api.Tracer | None = None,
        meter_provider: metrics_api.MeterProvider | None = None,
        parent: ParentFn | None = None,
        machines: Mapping[str, MachineSpec] = MACHINES,
    ) -> None:
        # checked here: a part of the wrong type turned the job's OTel output off at its
        # first record, far from the typo
        for name, value, method, kind in (
            ("tracer", tracer, "start_span", "an OpenTelemetry Tracer"),
            ("meter_provider", meter_provider, "get_meter", "an OpenTelemetry MeterProvider"),
            ("parent", parent, "__call__", "callable"),
        ):
            if value is not None and not callable(getattr(value, method, None)):
                raise TypeError(f"OtelSink: {name} must be {kind}, not {type(value).__name__}")
        if tracer is None:
            from livekit.agents.telemetry import tracer as livekit_tracer

            tracer = livekit_tracer
        self._tracer = tracer
        self._meter_provider = meter_provider
        self.parent = parent
        self._held_states = held_states(machines)
        self._held: dict[tuple[str, str], _Held] = {}
        self._instruments: _Instruments | None = None
        self._quiet: otel_context.Context | None = None  # a parent whose span does not record
        self._failed = False

    # -- the sink -----------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Whether a record written now could record anything: a state span is open, a
        meter provider is set, or the job's span is recording. With no OTel SDK none is, and
        the actors build no records for this sink."""
        if self._failed:
            return False
        try:
            return bool(self._held) or self._metrics() is not None or self._target() is not None
        except (Exception, asyncio.CancelledError) as e:
            self._fail(e)
            return False

    def write(self, record: TraceRecord) -> None:
        if self._failed or (record.kind != "transition" and record.kind != "effect"):
            return
        try:
            self._write(record)
        except (Exception, asyncio.CancelledError) as e:
            self._fail(e)

    def _fail(self, error: BaseException) -> None:
        # recording is observation: whatever an exporter, the SDK or parent() raises never
        # reaches the machines; a lost trace is a WARNING (the log policy), logged once
        self._failed = True
        logger.warning(
            "OpenTelemetry output failed (%s); the job goes on without it",
            describe(error),
            exc_info=error,
        )

    def close(self) -> None:
        """End the spans of states the job never left (it was stopped where it was)."""
        held, self._held = self._held, {}
        for h in held.values():
            if h.span is not None:
                h.span.set_attribute("fsm.outcome", "abandoned")
                h.span.end()

    # -- the work -----------------------------------------------------------------------------
    def _write(self, record: TraceRecord) -> None:
        if record.kind == "effect":
            if record.outcome in ("ok", "cancelled"):
                return
            target = self._target()
            if target is not None:
                target.add_event(
                    "fsm.effect_failed",
                    {
                        "fsm.machine": record.machine,
                        "fsm.instance": record.instance,
                        "fsm.effect": record.effect,
                        "fsm.outcome": record.outcome,
                        "fsm.detail": record.detail,
                    },
                )
            return
        changed = record.dest != record.source
        key = (record.machine, record.instance)
        held = (record.machine, record.source) in self._held_states
        enters = changed and (record.machine, record.dest) in self._held_states
        instruments = self._metrics()
        target = self._target()
        if target is None and instruments is None and not self._held:
            return  # nothing records: build nothing
        if target is not None:
            attrs: dict[str, Any] = {
                "fsm.machine": record.machine,
                "fsm.instance": record.instance,
                "fsm.event": record.event,
                "fsm.source": record.source,
                "fsm.dest": record.dest,
                "fsm.t": record.t,
            }
            if record.effects:
                attrs["fsm.effects"] = list(record.effects)
            for name, value in record.guards.items():
                attrs[f"fsm.guard.{name}"] = value
            target.add_event("fsm.transition", attrs)
        if instruments is not None:
            instruments.transitions.add(
                1,
                {
                    "fsm.machine": record.machine,
                    "fsm.event": record.event,
                    "fsm.source": record.source,
                    "fsm.dest": record.dest,
                },
            )
        if changed and held:
            ended = self._held.pop(key, None)
            if ended is not None:
                seconds = max(0.0, record.t - ended.entered)
                if ended.span is not None:
                    ended.span.set_attributes(
                        {
                            "fsm.outcome.event": record.event,
                            "fsm.outcome.dest": record.dest,
                            "fsm.duration": seconds,
                        }
                    )
                    ended.span.end()
                if instruments is not None:
                    instruments.duration.record(
                        seconds,
                        {
                            "fsm.machine": record.machine,
                            "fsm.state": record.source,
                            "fsm.outcome.event": record.event,
                            "fsm.outcome.dest": record.dest,
                        },
                    )
        if enters and (target is not None or instruments is not None):
            span = None
            if target is not None:
                span = self._tracer.start_span(
                    f"{record.machine}.{record.dest}",
                    context=trace_api.set_span_in_context(target),
                    attributes={
                        "fsm.machine": record.machine,
                        "fsm.instance": record.instance,
                        "fsm.state": record.dest,
                        "fsm.entered_by": record.event,
                        "fsm.t": record.t,
                    },
                )
            self._held[key] = _Held(span, record.t)

    def _target(self) -> trace_api.Span | None:
        """The job's span, when it is recording."""
        ctx = self.parent() if self.parent is not None else None
        if ctx is not None and ctx is self._quiet:
            return None
        span = trace_api.get_current_span(ctx)
        if span.is_recording():
            return span
        # a span that does not record never will (no SDK, or ended): asked again only when
        # the parent context changes
        self._quiet = ctx
        return None

    def _metrics(self) -> _Instruments | None:
        if self._instruments is None:
            if self._meter_provider is None and not _meter_provider_set():
                return None  # no SDK: no meter, no instruments
            provider = self._meter_provider or metrics_api.get_meter_provider()
            if isinstance(provider, _NO_SDK):
                return None
            self._instruments = _Instruments(provider.get_meter("agent_runtime"))
        return self._instruments

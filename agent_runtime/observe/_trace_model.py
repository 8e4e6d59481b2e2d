"""What a trace line must be, as a pydantic model: apart from ``trace.py`` so that the
actor, which imports the trace, does not import pydantic; only reading a trace does."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent_runtime.observe.trace import RecordKind


class RecordModel(BaseModel):
    """``TraceRecord`` as ``JsonlSink`` writes it; strict: a trace is read back exactly."""

    model_config = ConfigDict(extra="forbid", strict=True)

    t: float = Field(ge=0, allow_inf_nan=False)  # seconds since the clock's start
    kind: RecordKind
    machine: str
    instance: str
    event: str = ""
    source: str = ""
    dest: str = ""
    effects: list[str] = Field(default_factory=list)
    guards: dict[str, bool] = Field(default_factory=dict)
    data: dict[str, Any] = Field(default_factory=dict)
    effect: str = ""
    outcome: str = ""
    detail: str = ""

"""What a fuzz (or a replay) found: the report, and the scenario file a failure is written
to (never over another file)."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from agent_runtime.testing.fuzz.properties import Problem
from agent_runtime.testing.result import seconds_text


class FuzzReport(BaseModel):
    """What a fuzz (or a replay) found."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    seed: int | None
    examples: int
    paths: int
    seconds: float
    problems: list[str] = Field(default_factory=list)
    details: list[str] = Field(default_factory=list)
    scenario: dict[str, Any] | None = None
    written: str | None = None
    kept: str | None = None  # another file at the name, left as it was
    write_error: str | None = None  # why the scenario file could not be written
    skipped: list[str] = Field(default_factory=list)  # replay: steps the world refused
    logs: list[str] = Field(default_factory=list)  # the failing run's log (runlog.py)
    # the failing run passed when it ran again: the scenario is that run, not shrunk
    flaky: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        head = (
            f"{self.examples} example(s) run, {self.paths} distinct path(s), "
            f"{self.seconds:.1f}s" + (f", seed {self.seed}" if self.seed is not None else "")
        )
        skipped = [f"  step refused (it changed nothing): {s}" for s in self.skipped]
        if self.ok:
            return "\n".join([f"{head}: nothing found", *skipped])
        lines = [f"{head}: a property failed", *(f"  {p}" for p in self.problems), *skipped]
        if self.flaky:
            lines.append(
                "  the same run passed when it ran again: the agent depends on more than the "
                "run (state kept between jobs, the wall clock, the network)"
            )
        if self.scenario is not None:
            lines.append("  the failing run:" if self.flaky else "  the shortest sequence found:")
            lines += [f"    {_step_line(s)}" for s in self.scenario["steps"]]
        if self.logs:
            lines.append("  the run's log (the job's and livekit's records):")
            lines += [f"    {line}" for line in self.logs]
        if self.written:
            lines.append(f"  written to {self.written} (replay: --replay {self.written})")
        if self.kept:
            lines.append(f"  {self.kept} was there already, another file: left as it was")
        if self.write_error:
            lines.append(f"  not written: {self.write_error}")
        return "\n".join(lines)


def fill_report(
    report: FuzzReport,
    problems: list[Problem],
    scenario: dict[str, Any] | None,
    seed: int | None,
    label: str | None = None,
) -> None:
    """Put ``problems`` in ``report``, and a shrunk failure's ``scenario`` (fuzz's, not a
    replay's) named by its first problem's property."""
    report.problems = [str(p) for p in problems]
    report.details = [p.detail for p in problems if p.detail]
    if scenario is not None:
        what = problems[0]
        report.scenario = {
            "name": f"fuzz: {what.prop}",
            "description": f"found by agent-runtime fuzz of {label} (seed {seed}), shrunk: "
            + what.message,
            **scenario,
        }


def write_scenario(scenario: dict[str, Any], out: Path, name: str) -> tuple[Path, Path | None]:
    """Write ``scenario`` to ``out/NAME.yaml`` without ever replacing a file: one there
    already with the same text is the file written; one with other text (another agent's
    failure, a file of the user's) is left as it was and the scenario goes to the first free
    ``NAME-2.yaml``, ``NAME-3.yaml``, ... Returns the path written and the one stepped
    round (``None`` when none); raises ``OSError``."""
    out.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(scenario, sort_keys=False, width=100)
    first = out / f"{name}.yaml"
    for n in range(1, 1000):
        path = first if n == 1 else out / f"{name}-{n}.yaml"
        try:
            fh = path.open("x", encoding="utf-8")  # made here, or FileExistsError
        except FileExistsError:
            if _holds(path, text):
                return path, None if n == 1 else first
            continue
        try:
            with fh:
                fh.write(text)
        except OSError:  # no half-written scenario left behind
            path.unlink(missing_ok=True)
            raise
        return path, None if n == 1 else first
    raise FileExistsError(errno.EEXIST, f"{first} and 998 numbered after it exist")


def _holds(path: Path, text: str) -> bool:
    try:
        return path.read_text(encoding="utf-8") == text
    except (OSError, UnicodeDecodeError):  # a directory, unreadable: not this scenario
        return False


def _step_line(step: dict[str, Any]) -> str:
    rest = ", ".join(f"{k}={v!r}" for k, v in step.items() if k not in ("at", "event"))
    return f"t={seconds_text(step['at'])} {step['event']}" + (f" ({rest})" if rest else "")

"""``agent-runtime simulate [FILE|DIR ...] [--json] [--trace OUT.jsonl] [--html PAGE.html]``.

Exit 0 when every expectation held, 1 when one failed, 2 on an error: an invalid scenario
file, a trace that cannot be written, a run that failed. An error is one line on stderr
naming the file; with ``--json`` it is also ``{"ok": false, "file": ..., "error": ...}`` on
stdout, so stdout is always JSON. ``--html`` draws the run's timeline page; a trace or a page
that fails while written is exit 2 too, the run reported with ``trace_error`` or
``html_error`` in its JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent_runtime.testing.expect import check_expect
from agent_runtime.testing.result import seconds_text
from agent_runtime.testing.scenario import Scenario, ScenarioError, load_scenario
from agent_runtime.tools.output import project_dir, same_file, unwritable

DEFAULT_DIR = Path("examples/scenarios")

logger = logging.getLogger("agent_runtime.tools.simulate")


class _Refused(Exception):
    """An error the command answers with exit 2: ``file`` and the one-line message."""

    def __init__(self, file: str | None, message: str, *, prefix: str = "agent-runtime simulate"):
        super().__init__(message)
        self.file = file
        self.prefix = prefix


def _default_dir() -> Path:
    """Where ``simulate`` with no FILE looks: ``examples/scenarios`` in the current
    directory, else in the clone this package runs from. An installed copy has none beside
    it: the wheel holds no scenarios."""
    found = project_dir(DEFAULT_DIR, __file__)
    if found is not None:
        return found
    raise _Refused(
        None,
        f"no scenario given, and no {DEFAULT_DIR.as_posix()}/ directory here to run by "
        "default: name a scenario file, or a directory of them",
    )


def _files(args: argparse.Namespace) -> list[Path]:
    """Each FILE, and each DIR's ``*.yaml`` in name order; the bundled ones by default."""
    if not args.files:
        args.files = [_default_dir()]
    out: list[Path] = []
    for f in map(Path, args.files):
        if f.is_dir():
            found = sorted(p for p in f.glob("*.yaml") if not p.is_dir())
            if not found:
                raise _Refused(str(f), f"{f}: a directory with no *.yaml file in it" + _yml(f),
                               prefix="invalid scenario")  # fmt: skip
            out += found
        else:
            out.append(f)
    return out


def _yml(directory: Path) -> str:
    """What a directory with no *.yaml holds that was meant, perhaps: its *.yml files (a
    directory runs its *.yaml, as the pytest plugin collects them)."""
    yml = sorted(p.name for p in directory.glob("*.yml") if not p.is_dir())
    if not yml:
        return ""
    names = ", ".join(yml[:3]) + (f" and {len(yml) - 3} more" if len(yml) > 3 else "")
    return f" ({names}: a directory runs its *.yaml only; name a .yml file to run it)"


def _fail(args: argparse.Namespace, e: _Refused) -> int:
    print(f"{e.prefix}: {e}", file=sys.stderr)
    if args.json:
        print(json.dumps({"ok": False, "file": e.file, "error": str(e)}))
    return 2


def _json(value: Any) -> str:
    """Strict JSON (never ``Infinity`` or ``NaN``): a non-finite number becomes a string."""
    try:
        return json.dumps(value, indent=2, sort_keys=True, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), indent=2, sort_keys=True, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _fact(value: Any) -> str:
    """A fact as JSON writes it, but a time (``session_closed_at``) in plain seconds."""
    return seconds_text(value) if isinstance(value, float) else json.dumps(value)


def _summary(path: Path, scenario: Scenario, result: dict[str, Any], failures: list[str]) -> str:
    facts = result["facts"]
    status = "ok" if not failures else "FAILED"
    if scenario.expect is None:
        status = "ran (no expect block)"
    lines = [f"{scenario.name}  [{path.name}]  {status}"]
    lines.append(
        "  final: " + ", ".join(f"{m}={s}" for m, s in sorted(result["final_states"].items()))
    )
    keys = (
        "audio_output",
        "finalize_answered",
        "verdict",
        "session_closed_at",
        "room_deleted_at",
        "job_closed_at",
    )
    lines.append("  facts: " + ", ".join(f"{k}={_fact(facts.get(k))}" for k in keys))
    if facts.get("rpcs_sent"):
        rpcs = ", ".join(
            f"{r['method']}->{r['destination']}:{r['outcome']}@{seconds_text(r['t'])}"
            for r in facts["rpcs_sent"]
        )
        lines.append(f"  rpcs:  {rpcs}")
    # a step the runtime refused changed nothing; it is a fact of the run (an expect block
    # may pin it), never silent
    lines += [f"  step refused: {e}" for e in facts.get("step_errors") or []]
    lines += [f"  expect failed: {f}" for f in failures]
    return "\n".join(lines)


def _check_outputs(args: argparse.Namespace, files: list[Path]) -> None:
    """Every option checked before anything runs: a run is not made only to be lost, and no
    output may overwrite an input."""
    if not files:
        raise _Refused(None, "no scenario files found")
    html = getattr(args, "html", None)
    for option, given, says in (
        ("--html", html, "draws"),
        ("--trace", args.trace, "records"),
        ("--json", args.json, "prints the result object of"),
    ):
        if given and len(files) != 1:
            found = f" ({len(files)} scenario files found)" if len(files) != len(args.files) else ""
            raise _Refused(None, f"{option} {says} exactly one FILE{found}")
    if html == "-":  # the timeline's own -o - is stdout; here the run's report is there
        raise _Refused(None, "--html -: the run's report goes to stdout; name a file for the page")
    outputs = [
        (o, p, w) for o, p, w in (("--trace", args.trace, "trace"), ("--html", html, "page")) if p
    ]
    for option, path, what in outputs:
        for f in files:
            if same_file(path, f):
                raise _Refused(
                    path, f"{option} {path} is the scenario file {f}; it would be overwritten"
                )
        why = unwritable(path)
        if why is not None:
            # the trace's words are the ones its open() says when the run makes it
            raise _Refused(
                path,
                f"{path}: cannot write the {what}"
                + (f": {why}" if what == "trace" else f" ({why})"),
            )
    if args.trace and html and same_file(args.trace, html):
        raise _Refused(
            html, f"--trace and --html name the same file {html}; one would overwrite the other"
        )


def run(args: argparse.Namespace) -> int:
    try:
        files = _files(args)
        _check_outputs(args, files)
        args.files = [str(f) for f in files]
        if getattr(args, "html", None):
            from agent_runtime.tools.commands.timeline import (
                simulate_then_draw,  # the page is drawn from the run's trace
            )

            return simulate_then_draw(args, _run)
        return _run(args)
    except _Refused as e:
        return _fail(args, e)


def _run(args: argparse.Namespace) -> int:
    from agent_runtime.testing.clock import run as on_virtual_time
    from agent_runtime.testing.runner import (
        run_scenario,  # imports livekit.agents: only when simulating
    )

    files = [Path(f) for f in args.files]  # resolved and checked by run()
    scenarios: list[tuple[Path, Scenario]] = []
    for f in files:
        try:
            scenarios.append((f, load_scenario(f)))
        except ScenarioError as e:
            raise _Refused(str(f), str(e), prefix="invalid scenario") from None
    if args.trace is not None:
        try:
            Path(args.trace).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # checked before the run: only a race gets here
            raise _Refused(
                args.trace, f"{args.trace}: cannot write the trace: {e.strerror or e}"
            ) from None
    failed = output_failed = False
    for path, scenario in scenarios:
        try:
            with _trace_warnings_off():
                result = on_virtual_time(run_scenario(scenario, trace_path=args.trace))
        except OSError as e:
            if args.trace is None or e.filename is None or str(e.filename) != str(args.trace):
                raise _Refused(str(path), f"{path}: the run failed: {_one_line(e)}") from e
            raise _Refused(
                args.trace, f"{args.trace}: cannot write the trace: {e.strerror or e}"
            ) from None
        except Exception as e:  # a bug, but still one line and exit 2, never a traceback
            logger.debug("the run of %s failed", path, exc_info=True)
            raise _Refused(str(path), f"{path}: the run failed: {_one_line(e)}") from None
        failures = check_expect(scenario.expect, result)
        result["expect"] = (
            None if scenario.expect is None else {"held": not failures, "failures": failures}
        )
        failed = failed or bool(failures)
        page_error = _page(args, path, result)
        if page_error is not None:
            result["html_error"] = page_error  # the run's report says the page is missing
        if args.json:
            print(_json(result))
        else:
            print(_summary(path, scenario, result, failures))
        if page_error is not None:
            print(f"agent-runtime simulate: {page_error}", file=sys.stderr)
            output_failed = True
        elif getattr(args, "html", None) and not result.get("trace_error"):
            print(f"wrote {args.html}", file=sys.stderr)
        if result.get("trace_error"):
            # the run is reported as it happened; the trace it asked for is incomplete
            print(
                f"agent-runtime simulate: {args.trace}: the trace could not be written "
                f"({result['trace_error']}); it stops before the failed record",
                file=sys.stderr,
            )
            output_failed = True
    if not args.json:
        checked = sum(1 for _, s in scenarios if s.expect is not None)
        if checked:
            outcome = f"{checked} with expectations: {'some failed' if failed else 'all held'}"
        else:  # nothing was checked, so nothing is said to have held
            outcome = "no expectations to check"
        print(f"\n{len(scenarios)} scenario(s) run, {outcome}")
    return 2 if output_failed else 1 if failed else 0


def _page(args: argparse.Namespace, path: Path, result: dict[str, Any]) -> str | None:
    """``--html``'s page drawn from the run's trace: None, or why it could not be (a trace
    that failed is not drawn: its own line says so)."""
    if not getattr(args, "html", None) or result.get("trace_error"):
        return None
    from agent_runtime.tools.commands.timeline import simulated_page

    return simulated_page(args, str(path))


@contextlib.contextmanager
def _trace_warnings_off() -> Iterator[None]:
    """A trace that fails is reported below in the command's own one line, not twice."""
    log = logging.getLogger("agent_runtime.trace")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())

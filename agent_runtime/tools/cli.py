"""``agent-runtime``: simulate scenarios, replay traces, draw, diff and export the machines,
fuzz an agent.

Each command's module is imported only when that command runs, so ``diagrams`` and
``table`` never pay for ``livekit.agents``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn

from agent_runtime import __version__
from agent_runtime.sdk.native_exit import release_at_exit
from agent_runtime.tools.output import OutputGone, discard, guard


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its usage errors in one line (as every error of the CLI); the
    usage itself is for ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="agent-runtime",
        description="Explicit state machines for LiveKit agents: scenarios, traces, diagrams.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim = sub.add_parser(
        "simulate",
        help="run scenario files on the embedded in-memory room and a virtual clock",
        description="Run scenarios through the real runtime (no server, no keys). A DIR "
        "runs its *.yaml in name order; with no FILE, ./examples/scenarios/ (else, when the "
        "package runs from a clone of the project, the clone's). Exit 0 when every "
        "expectation held, 1 when one failed, 2 on an error (one line on stderr; with --json "
        'also {"ok": false, "file": ..., "error": ...} on stdout).',
    )
    sim.add_argument("files", nargs="*", metavar="FILE|DIR")
    sim.add_argument("--json", action="store_true", help="print the result object as JSON")
    sim.add_argument("--trace", metavar="OUT.jsonl", help="write the JSONL trace here")
    sim.add_argument("--html", metavar="PAGE.html", help="draw the run's timeline page here")
    sim.set_defaults(module="agent_runtime.tools.commands.simulate")

    rep = sub.add_parser(
        "replay",
        help="replay a JSONL trace through the machines and report the first divergence",
        description="Replay every decision of a JSONL trace through the machines: exit 0 "
        "when all agree, 1 at the first divergence, 2 when the trace cannot be replayed. "
        "Jobs one after the other in one trace are replayed each from the initial states; "
        "jobs that ran at once into one trace are refused.",
    )
    rep.add_argument("trace", metavar="TRACE.jsonl")
    rep.add_argument("--json", action="store_true", help="print the result as JSON")
    rep.set_defaults(module="agent_runtime.tools.commands.replay")

    rec = sub.add_parser(
        "record",
        help="write the scenario that reproduces a trace (an incident becomes a test)",
        description="Rebuild a scenario file from a JSONL trace (a production trace from "
        "AgentJob(trace_path=...) or simulate --trace): the steps from the events the "
        "machines handled, the config they reveal, an expect block with the final states. "
        "What the trace cannot tell is written in the file as comments. Exit 0 written, 1 "
        "when --check finds the run differs from the trace, 2 on an error (one line).",
    )
    rec.add_argument("trace", metavar="TRACE.jsonl")
    rec.add_argument("-o", "--out", metavar="OUT.yaml", help="write here (default, or -: stdout)")
    rec.add_argument("--name", help="the scenario's name (default: from the trace's file name)")
    rec.add_argument(
        "--check",
        action="store_true",
        help="run the scenario and check every machine ends as in the trace, by the same "
        "transitions",
    )
    rec.set_defaults(module="agent_runtime.tools.commands.record")

    wat = sub.add_parser(
        "watch",
        help="follow a JSONL trace as it grows: each machine's state and the last transitions",
        description="Follow a production trace as it is written. On a terminal the view is "
        "redrawn in place; otherwise each transition is one appended line. Ctrl-C stops. "
        "A trace not written yet (nor its directory) is waited for, as tail -F does; a "
        "directory, a path under a file or a FIFO is refused (exit 2).",
    )
    wat.add_argument("trace", metavar="TRACE.jsonl")
    wat.add_argument(
        "--once",
        action="store_true",
        help="print the current view and exit (a trace not written yet is an error)",
    )
    wat.add_argument(
        "--interval",
        type=float,
        default=0.25,
        metavar="S",
        help="seconds between reads (above 0, at most 3600; default 0.25)",
    )
    wat.add_argument(
        "--last", type=int, default=12, metavar="N", help="transitions shown (1 or more)"
    )
    wat.set_defaults(module="agent_runtime.tools.commands.watch")

    tim = sub.add_parser(
        "timeline",
        help="draw a trace as one self-contained HTML page (diagrams, lanes, a scrubber)",
    )
    tim.add_argument("trace", metavar="TRACE.jsonl")
    tim.add_argument("-o", "--out", required=True, metavar="PAGE.html", help="- for stdout")
    tim.add_argument("--title", help="the page's title (default: the trace's file name)")
    tim.set_defaults(module="agent_runtime.tools.commands.timeline")

    dia = sub.add_parser(
        "diagrams",
        help="write Mermaid, DOT, SVG and Markdown tables",
        description="Write (or check) the machines' diagrams. Without --out: ./diagrams/, "
        "else, when the package runs from a clone of the project, the clone's (made here "
        "when there is neither).",
    )
    dia.add_argument(
        "--out", metavar="DIR", help="the directory (default: the project's diagrams/)"
    )
    dia.add_argument(
        "--check", action="store_true", help="exit 1 naming each file that is out of date"
    )
    dia.set_defaults(module="agent_runtime.tools.commands.diagrams")

    tab = sub.add_parser("table", help="print one machine's state x event table")
    tab.add_argument("machine")
    tab.set_defaults(module="agent_runtime.tools.commands.table")

    xpo = sub.add_parser(
        "export",
        help="write the machines as XState v5 modules (createMachine, Stately's editor)",
        description="Write each machine as an ES module calling XState v5's "
        "setup().createMachine(): every cell in `on` (ignore and reject cells explicit), "
        "guards as named guards, state timeouts as `after` with the settings' defaults as "
        "named delays, state tasks as `invoke`, effects as named actions. Guards, actions "
        "and actors are stubs to replace with machine.provide(). Name a MACHINE to print "
        "its module, or give --out DIR to write them all (modules one after another are "
        "not one module).",
    )
    xpo.add_argument("format", choices=["xstate"], help="the target (xstate: XState v5)")
    xpo.add_argument(
        "machine",
        nargs="?",
        metavar="MACHINE",
        help="the machine whose module is printed (with --out: the only one written)",
    )
    xpo.add_argument(
        "--out",
        metavar="DIR",
        help="write DIR/NAME.js for every machine (MACHINE's only, if named)",
    )
    xpo.set_defaults(module="agent_runtime.tools.commands.export")

    fz = sub.add_parser(
        "fuzz",
        help="fuzz an agent's lifecycle: hypothesis-drawn orders of what can happen to a job",
        description="Run the agent's own rtc_session entrypoint (MODULE:SERVER, MODULE a "
        "module name or a .py file) against sequences of what can happen to a job "
        "(participants joining, leaving with every reason, rejoining; the avatar late, "
        "absent, failing, dropping, silent; the simulator's finalize, strangers, room "
        "deletion; speech, interruptions; aclose/abort; time passing), drawn and shrunk by "
        "hypothesis, on the in-memory room and a virtual clock. Checks that the agent stays "
        "audible, the verdict is answered once and only to the simulator, the job ends "
        "within its bounds, nothing is left running, no exception escapes the agent's code, "
        "and every --check. Exit 0 nothing found, 1 a property failed (also on --replay), "
        "2 a usage error (one line on stderr).",
    )
    fz.add_argument("agent", metavar="MODULE:SERVER")
    fz.add_argument("--examples", metavar="N", help="runs to draw (1-100000; default 1000)")
    fz.add_argument("--seed", default=None, metavar="S", help="the seed (0-4294967295)")
    fz.add_argument("--steps", metavar="N", help="steps per run, at most (1-100; default 25)")
    fz.add_argument("--out", metavar="DIR", help="write the shrunk failure here as a scenario")
    fz.add_argument("--replay", metavar="FILE", help="run this scenario file again instead")
    fz.add_argument(
        "--check",
        action="append",
        metavar="MODULE:FUNCTION",
        help="a property of your own: FUNCTION(outcome) raises or returns False (repeatable)",
    )
    fz.add_argument("--no-avatar", action="store_true", help="no avatar stands in for the plugin")
    fz.add_argument("--no-simulation", action="store_true", help="a plain job, no simulator")
    fz.add_argument(
        "--logs",
        action="store_true",
        help="every run's log as it comes (INFO and above on stderr, unless the agent sets up "
        "logging itself), rather than only the failing run's, in its report",
    )
    fz.set_defaults(module="agent_runtime.tools.commands.fuzz")

    dif = sub.add_parser(
        "diff",
        help="cells added, removed or changed since a git revision",
        description="The machine cells added, removed or changed since a git revision, "
        "compared with the working tree, each with where its diagram draws it. Exit 0 "
        "when no cell changed, 1 when one did, 2 on an error (one line).",
    )
    dif.add_argument("rev", metavar="REV", help="a git revision (main, HEAD~1, a commit id)")
    dif.set_defaults(module="agent_runtime.tools.commands.diff")
    return p


# the exit codes every command shares, besides its own 0, 1 and 2
EXIT_STDOUT_FAILED = 2  # stdout could not be written (a full disk): an error like any other
EXIT_BROKEN_PIPE = 141  # the reader of stdout left (`| head`): 128 + SIGPIPE, as a shell's
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Whatever the command, the end of its output is handled here: a
    reader of stdout that leaves stops it quietly (exit 141), a stdout that cannot be
    written (a full disk) is one line on stderr (exit 2), Ctrl-C is one line "interrupted"
    (exit 130); never a traceback."""
    stdout = sys.stdout
    sys.stdout = guard(stdout)
    prog = "agent-runtime"
    try:
        args, extra = _parser().parse_known_args(argv)
        prog = f"agent-runtime {args.command}"
        if extra:  # named by the command they were given to, not the top level
            print(f"{prog}: unrecognized arguments: {' '.join(extra)} (see {prog} --help)",
                  file=sys.stderr)  # fmt: skip
            return 2
        code = _run(args)
        sys.stdout.flush()  # a failure to write what is buffered is the command's too
        return code
    except OutputGone as e:
        discard(stdout)
        if e.broken_pipe:
            return EXIT_BROKEN_PIPE
        print(f"{prog}: cannot write to stdout ({e.error.strerror or e.error})", file=sys.stderr)
        return EXIT_STDOUT_FAILED
    except KeyboardInterrupt:
        # what the cut run left unawaited or pending is collected as the process exits (when
        # is the collector's choice, its exit hooks included): not news
        warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
        logging.getLogger("asyncio").addFilter(_not_a_pending_task)
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        sys.stdout = stdout
        release_at_exit()  # a job's RoomIO used livekit's native runtime: see native_exit


def _not_a_pending_task(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Task was destroyed but it is pending")


# what the tools extra brings that a command may import as it loads, by import name
TOOLS_EXTRA = {"yaml": "PyYAML", "hypothesis": "hypothesis"}


def _run(args: argparse.Namespace) -> int:
    try:
        module = importlib.import_module(args.module)
    except ModuleNotFoundError as e:
        if e.name not in TOOLS_EXTRA:
            raise
        print(
            f"agent-runtime {args.command}: needs {TOOLS_EXTRA[e.name]}; install the project's "
            "tools extra (from a clone: pip install '.[tools]')",
            file=sys.stderr,
        )
        return 2
    code: int = module.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())

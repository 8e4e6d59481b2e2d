"""``agent-runtime export xstate``: every machine, run in XState itself (node), agrees with
``statemachines.step`` on every cell and guard combination, on every state timeout, on
every state task that fails (its error event) and on seeded random sequences: the same
state after each step, the same effects run (a reject cell runs the ``reject`` action, an
ignore cell nothing), the state's tasks started and stopped exactly when the runtime
leaves and enters a state, the state timer armed exactly when the runtime's would be.

XState runs in node from tests/js/xstate (its package-lock pins the version; ``npm ci``
installs it on first use). Without node on PATH these tests are skipped, saying so.
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import subprocess
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_runtime.tools.cli import main
from agent_runtime.tools.xstate import machine_config
from statemachines.machines import MACHINES
from statemachines.spec import MachineSpec
from statemachines.step import step

ROOT = Path(__file__).resolve().parents[1]
JS = ROOT / "tests" / "js" / "xstate"
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(
    NODE is None,
    reason="node is not on PATH: the exported machines are checked in XState under Node.js",
)

# an event (None: the state timer fires; "!TASK": the state task TASK fails), guard values
Move = tuple[str | None, dict[str, bool]]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every machine written by the CLI into a directory where node finds ``xstate``."""
    assert NODE is not None
    if not (JS / "node_modules" / "xstate" / "package.json").is_file():
        npm = shutil.which("npm")
        assert npm is not None, "npm is needed to install xstate into tests/js/xstate"
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=JS,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, f"npm ci in {JS} failed:\n{done.stdout}{done.stderr}"
    out = tmp_path_factory.mktemp("xstate")
    (out / "package.json").write_text('{"type": "module"}\n')
    (out / "node_modules").symlink_to(JS / "node_modules", target_is_directory=True)
    assert main(["export", "xstate", "--out", str(out)]) == 0
    return out


def run_in_xstate(module: Path, runs: list[list[Move]]) -> list[list[dict[str, Any]]]:
    assert NODE is not None
    request = {
        "module": str(module),
        "runs": [[{"event": e, "guards": g} for e, g in run] for run in runs],
    }
    done = subprocess.run(
        [NODE, str(JS / "run.mjs")],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result: list[list[dict[str, Any]]] = json.loads(done.stdout)
    return result


def cell_guards(spec: MachineSpec, state: str, event: str) -> list[str]:
    names: list[str] = []
    for r in spec.rows:
        if r.source == state and r.event == event:
            names += [g for g in r.guards if g not in names]
    return names


def assignments(names: list[str]) -> Iterator[dict[str, bool]]:
    for values in itertools.product((False, True), repeat=len(names)):
        yield dict(zip(names, values, strict=True))


def paths(spec: MachineSpec) -> dict[str, list[Move]]:
    """A shortest sequence of events (with the guard values it needs) to every state."""
    found: dict[str, list[Move]] = {spec.initial: []}
    queue = deque([spec.initial])
    while queue:
        state = queue.popleft()
        for event in spec.events:
            for guards in assignments(cell_guards(spec, state, event)):
                dest = step(spec, state, event, guards).dest
                if dest not in found:
                    found[dest] = [*found[state], (event, guards)]
                    queue.append(dest)
    return found


class Expected:
    """What the runtime does, step by step, as ``step`` and the spec say."""

    def __init__(self, spec: MachineSpec) -> None:
        self.spec = spec
        self.state = spec.initial
        self.armed = spec.state(self.state).timeout is not None
        self.tasks = list(spec.state(self.state).invoke)  # the state tasks still running

    def start(self) -> dict[str, Any]:
        st = self.spec.state(self.state)
        return self._obs(actions=[], started=list(st.invoke), stopped=[], armed=self.timer_ms())

    def timer_ms(self) -> list[float]:
        timeout = self.spec.state(self.state).timeout
        if not self.armed or timeout is None:
            return []
        return [timeout.default * 1000]  # the setting's default, in XState's milliseconds

    def _obs(self, **kw: Any) -> dict[str, Any]:
        final = self.spec.state(self.state).final
        return {"state": self.state, "done": final, "timers": self.timer_ms(), **kw}

    def move(self, event: str | None, guards: dict[str, bool]) -> dict[str, Any]:
        src = self.spec.state(self.state)
        if src.final:  # XState stops a machine in a final state: nothing runs any more
            return self._obs(actions=[], started=[], stopped=[], armed=[], cancelled=0)
        timer = event is None
        if event is None:
            assert src.timeout is not None and self.armed
            event = src.timeout.event
        elif event.startswith("!"):  # a task that fails is over; its error event is decided
            task = event[1:]
            self.tasks.remove(task)
            failed = self.spec.effect(task).error_event
            assert failed is not None
            event = failed
        s = step(self.spec, self.state, event, guards)
        actions = list(s.effects) if s.outcome == "transition" else []
        if s.outcome == "reject":
            actions = ["reject"]
        started: list[str] = []
        stopped: list[str] = []
        # leaving cancels a timer still pending; entering arms the new state's
        cancelled = 0
        if timer:  # the timer that fired is spent: staying does not arm it again
            self.armed = False
        if s.changed:
            dest = self.spec.state(s.dest)
            stopped, started = self.tasks, list(dest.invoke)
            self.tasks = list(dest.invoke)
            cancelled = int(self.armed)
            self.armed = dest.timeout is not None
        self.state = s.dest
        armed = self.timer_ms() if s.changed else []
        return self._obs(
            actions=actions, started=started, stopped=stopped, armed=armed, cancelled=cancelled
        )

    def run(self, moves: list[Move]) -> list[dict[str, Any]]:
        return [self.start(), *(self.move(event, guards) for event, guards in moves)]


def failing_tasks(spec: MachineSpec, tasks: list[str]) -> list[str]:
    """The running tasks whose failure the spec turns into an event."""
    return [t for t in tasks if spec.effect(t).error_event is not None]


def compare(spec: MachineSpec, runs: list[list[Move]], got: list[list[dict[str, Any]]]) -> None:
    assert len(got) == len(runs)
    for moves, observed in zip(runs, got, strict=True):
        expected = Expected(spec).run(moves)
        for i, (want, seen) in enumerate(zip(expected, observed, strict=True)):
            seen_cmp = {k: seen[k] for k in want}
            if seen_cmp != want or seen["errors"] or seen.get("fired") is False:
                shown = [("<timer>" if e is None else e, g) for e, g in moves[:i]]
                pytest.fail(
                    f"machine {spec.name!r}: XState and step differ after {shown}\n"
                    f"  step:   {want}\n  XState: {seen}"
                )


MACHINE_NAMES = list(MACHINES)  # every machine there is, whichever are added later


@needs_node
@pytest.mark.parametrize("name", MACHINE_NAMES)
def test_every_cell_guard_combination_and_timeout(name: str, exported: Path) -> None:
    spec = MACHINES[name]
    to = paths(spec)
    assert set(to) == set(spec.state_names)
    runs: list[list[Move]] = []
    for state in spec.state_names:
        for event in spec.events:
            for guards in assignments(cell_guards(spec, state, event)):
                runs.append([*to[state], (event, guards)])
        timeout = spec.state(state).timeout
        if timeout is not None:
            for guards in assignments(cell_guards(spec, state, timeout.event)):
                runs.append([*to[state], (None, guards)])
        for task in failing_tasks(spec, list(spec.state(state).invoke)):
            error = spec.effect(task).error_event
            assert error is not None
            for guards in assignments(cell_guards(spec, state, error)):
                runs.append([*to[state], (f"!{task}", guards)])
    compare(spec, runs, run_in_xstate(exported / f"{name}.js", runs))


@needs_node
@pytest.mark.parametrize("name", MACHINE_NAMES)
def test_random_sequences(name: str, exported: Path) -> None:
    spec = MACHINES[name]
    rng = random.Random(f"xstate-{name}")
    runs: list[list[Move]] = []
    for _ in range(300):
        model = Expected(spec)
        moves: list[Move] = []
        for _ in range(rng.randint(1, 30)):
            guards = {g: rng.random() < 0.5 for g in spec.guards}
            timer = model.armed and rng.random() < 0.25
            failing = failing_tasks(spec, model.tasks)
            event = None if timer else rng.choice(spec.events)
            if failing and rng.random() < 0.15:
                event = "!" + rng.choice(failing)
            move: Move = (event, guards)
            moves.append(move)
            model.move(*move)
            if spec.state(model.state).final:
                break
        runs.append(moves)
    compare(spec, runs, run_in_xstate(exported / f"{name}.js", runs))


@pytest.mark.parametrize("name", MACHINE_NAMES)
def test_every_cell_is_explicit(name: str) -> None:
    spec = MACHINES[name]
    config = machine_config(spec)
    assert config["initial"] == spec.initial
    assert list(config["states"]) == list(spec.state_names)
    for st in spec.states:
        node = config["states"][st.name]
        assert list(node["on"]) == list(spec.events), st.name
        assert (node.get("type") == "final") == st.final
        assert [i["src"] for i in node.get("invoke", [])] == list(st.invoke)
        if st.timeout is not None:
            assert list(node["after"]) == [st.timeout.setting]


def test_export_one_machine_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    name = next(iter(MACHINES))
    assert main(["export", "xstate", name]) == 0
    text = capsys.readouterr().out
    assert "setup({" in text and f'id: "{name}"' in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["export", "xstate", "robot"], "unknown machine 'robot'; machines: "),
        (["export", "xstate"], "name a MACHINE to print its module, or give --out DIR"),
    ],
)
def test_export_bad_input_is_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_the_help_says_what_a_bare_export_does(capsys: pytest.CaptureFixture[str]) -> None:
    """The help said MACHINE "(default: all)" and --out "(default: stdout)", and a bare
    `export xstate` refused both: it names what it needs, and the help says so too."""
    with pytest.raises(SystemExit) as exc:
        main(["export", "xstate", "--help"])
    assert exc.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert main(["export", "xstate"]) == 2
    refusal = capsys.readouterr().err.removeprefix("agent-runtime export: ").strip()
    assert refusal == "name a MACHINE to print its module, or give --out DIR to write them all"
    assert refusal[0].upper() + refusal[1:] in help_text
    assert "default: all" not in help_text and "default: stdout" not in help_text


def test_export_out_must_be_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["export", "xstate", "--out", str(f)]) == 2
    assert capsys.readouterr().err == f"agent-runtime export: {f}: not a directory\n"
    assert f.read_text() == "x"

// Runs one machine module written by `agent-runtime export xstate` in XState, for
// tests/test_export_xstate.py: stdin {"module": PATH, "runs": [[STEP, ...], ...]} where a
// STEP is {"event": NAME | null, "guards": {NAME: bool}} (null: fire the pending state
// timer; "!TASK": the state task TASK fails); stdout, per run, what XState did: the start,
// then one observation per step.
// Guards, actions and actors are replaced by recorders; time is a virtual clock.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { createActor, fromCallback } from "xstate";

const request = JSON.parse(readFileSync(0, "utf8"));
const exported = await import(pathToFileURL(request.module).href);
const base = exported.default;

function virtualClock(log) {
  const timers = new Map();
  let next = 1;
  return {
    timers,
    setTimeout(fn, ms) {
      const id = next++;
      timers.set(id, { fn, ms });
      log.armed.push(ms);
      return id;
    },
    clearTimeout(id) {
      if (timers.delete(id)) log.cancelled.push(id);
    },
    fire() {
      // the one pending state timer (a second one would be a bug the test names)
      const [id, t] = [...timers.entries()][0] ?? [];
      if (id === undefined) return false;
      timers.delete(id);
      t.fn();
      return true;
    },
  };
}

function runOne(steps) {
  const log = { actions: [], started: [], stopped: [], armed: [], cancelled: [] };
  let current = {};
  const impl = base.implementations;
  const machine = base.provide({
    guards: Object.fromEntries(
      Object.keys(impl.guards).map((g) => [g, () => current[g] === true]),
    ),
    actions: Object.fromEntries(
      Object.keys(impl.actions).map((a) => [a, () => log.actions.push(a)]),
    ),
    actors: Object.fromEntries(
      Object.keys(impl.actors).map((a) => [
        a,
        fromCallback(({ receive }) => {
          log.started.push(a);
          // a task fails when the test says so: its actor errors, as a raising task would
          receive((e) => {
            if (e.type === "fail") throw new Error(`${a} failed`);
          });
          return () => log.stopped.push(a);
        }),
      ]),
    ),
  });
  const clock = virtualClock(log);
  const actor = createActor(machine, { clock });
  const errors = [];
  actor.subscribe({ error: (e) => errors.push(String(e)) });
  const observe = (extra) => {
    const snap = actor.getSnapshot();
    const obs = {
      state: snap.value,
      done: snap.status === "done",
      actions: log.actions.splice(0),
      started: log.started.splice(0),
      stopped: log.stopped.splice(0),
      timers: [...clock.timers.values()].map((t) => t.ms),
      armed: log.armed.splice(0),
      cancelled: log.cancelled.splice(0).length,
      errors: errors.splice(0),
      ...extra,
    };
    return obs;
  };
  actor.start();
  const out = [observe({})];
  for (const step of steps) {
    current = step.guards ?? {};
    if (step.event === null) {
      const fired = clock.fire();
      out.push(observe({ fired }));
    } else if (step.event.startsWith("!")) {
      const task = actor.getSnapshot().children[step.event.slice(1)];
      if (task !== undefined) task.send({ type: "fail" });
      out.push(observe({ fired: task !== undefined }));
    } else {
      actor.send({ type: step.event });
      out.push(observe({}));
    }
  }
  actor.stop();
  return out;
}

process.stdout.write(JSON.stringify(request.runs.map(runOne)));

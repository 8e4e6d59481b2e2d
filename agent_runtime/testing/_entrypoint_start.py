"""Waiting for an entrypoint to start its job, as livekit's job runner waits (it goes on
once the job runs: the entrypoint may keep running), and what the run says when the
entrypoint does not: it stalled, or it built no ``AgentJob``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from agent_runtime.system.agent_job import AgentJob
from agent_runtime.testing._entrypoint_run import Run, still_starting
from agent_runtime.testing.clock import settle


class NoAgentJob(RuntimeError):
    """The entrypoint ended without building an ``AgentJob`` for its job context: it
    returned (``cut`` false), or the job's end cancelled it first (``cut``)."""

    def __init__(self, message: str, *, cut: bool = False) -> None:
        super().__init__(message)
        self.cut = cut


class EntrypointStalled(TimeoutError):
    """The entrypoint neither started its job nor ended within the wait."""


async def started_job(
    run: Run,
    entry: asyncio.Task[Any],
    start_timeout: float,
    on_failure: Callable[[asyncio.Task[Any]], None],
) -> AgentJob:
    """The job ``run``'s entrypoint (the task ``entry``) built, once it started it or
    ended, within ``start_timeout``; its failure by then is raised, and one after it goes
    to ``on_failure`` (a failure of the agent's code). ``run.job`` is the job even when
    its start stalled."""
    watch, process = run.watch, run.process
    await asyncio.wait({entry, watch.started}, timeout=start_timeout, return_when="FIRST_COMPLETED")
    # an entrypoint the job's end cut (livekit cancels it 15 s in) has no failure of its
    # own; one its own code cancelled is the test's, as any failure of its code
    cut = entry.done() and entry.cancelled() and process.begun
    if entry.done() and not cut:
        await entry  # its failure is the test's, with its traceback
    elif not entry.done():
        # what it fails with from here on is the test's too, as a failure of its code
        entry.add_done_callback(on_failure)
    await settle()  # the entrypoint runs on until it waits (its code after the start)
    job = watch.job or AgentJob.for_job(run.ctx)
    if job is None and not entry.done():
        raise EntrypointStalled(
            f"the entrypoint has neither built its AgentJob nor ended after "
            f"{start_timeout:g}s: it waits for something that has not happened"
        )
    if job is None and cut:
        raise NoAgentJob(
            "the entrypoint was cancelled before it built an AgentJob (livekit cancels "
            "it 15 s into the job's end)",
            cut=True,
        )
    if job is None:
        raise NoAgentJob(
            "the entrypoint built no AgentJob: call AgentJob.from_job_context(ctx, "
            'session=...) in it and start the job there (the testing guide, "Your entrypoint '
            'under test")'
        )
    run.job = job
    if not watch.started.done() and not entry.done():
        raise EntrypointStalled(
            f"the entrypoint has not started its job after {start_timeout:g}s (the job "
            f"is {job.lifecycle}{still_starting(job)}): it waits for something that "
            "has not happened"
        )
    return job

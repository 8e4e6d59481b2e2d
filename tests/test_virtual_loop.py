"""``VirtualTimeLoop``: the SDK's own timers (``asyncio.sleep``, ``wait_for``, ``call_later``
on the loop) run on virtual time, so a run depends on its inputs, never on how fast the
machine is. Each test runs its own loop through ``clock.run``."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import sys
import threading
import warnings

import pytest
from livekit.agents.voice.speech_handle import INTERRUPTION_TIMEOUT

from agent_runtime.testing.clock import UPTIME, VirtualClock, VirtualTimeLoop, run
from verification.explore.config import CONFIGS
from verification.explore.real import run as explore_run


def _loop() -> VirtualTimeLoop:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop)
    return loop


def test_a_wait_with_nothing_else_to_run_jumps_to_the_next_timer() -> None:
    async def main() -> tuple[float, float, bool, float]:
        loop = _loop()
        await asyncio.sleep(3600)
        slept = loop.time()
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.sleep(10), 5)
        except TimeoutError:
            timed_out = True
        return slept - UPTIME, loop.time() - UPTIME, timed_out, loop.jumped

    assert run(main()) == (3600.0, 3605.0, True, 3605.0)


def test_time_stands_still_while_a_thread_works_for_the_loop() -> None:
    data = bytes(20_000_000)

    async def main() -> str:
        # the thread's answer comes before a bound of one virtual second: without the
        # loop waiting for it, that bound would fire at once, the thread still hashing
        # (hashlib lets the loop's thread run meanwhile)
        work = asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())
        return await asyncio.wait_for(work, 1.0)

    assert run(main()) == hashlib.sha256(data).hexdigest()


def test_the_loops_timers_fire_in_order_as_a_virtual_clock_advances() -> None:
    async def main() -> list[tuple[str, float, float]]:
        loop, clock = _loop(), VirtualClock()
        fired: list[tuple[str, float, float]] = []

        def fire(who: str) -> None:
            fired.append((who, loop.time(), clock.now()))

        loop.call_later(2, lambda: fire("loop"))
        loop.call_later(3, lambda: fire("loop, same time"))
        loop.call_later(9, lambda: fire("loop, later"))
        clock.call_later(1, lambda: fire("clock"))
        clock.call_later(3, lambda: fire("clock"))
        await clock.advance(5)
        assert loop.time() == 5.0 and loop.jumped == 0.0  # moved by the clock, not idle
        return fired

    # one time for both: the job's timers and the SDK's interleave as they would for real
    # (at the same instant, the job's first); from 0, so that the loop's times are the
    # clock's exactly (from UPTIME, 1.2 s on is 1.2000000000000455)
    assert run(main(), start=0.0) == [
        ("clock", 1.0, 1.0),
        ("loop", 2.0, 2.0),
        ("clock", 3.0, 3.0),
        ("loop, same time", 3.0, 3.0),
    ]


def test_a_clock_timer_a_loop_timer_arms_fires_at_its_time_within_one_advance() -> None:
    """A speech the loop paces ends at 1.2 and the job then waits 5 s on its clock: that
    timer fired at the advance's end (12), not at 6.2, as it was armed while the clock was
    already on its way past it (a re-prompt on room audio came late)."""

    async def main() -> list[tuple[str, float, float]]:
        loop, clock = _loop(), VirtualClock()
        fired: list[tuple[str, float, float]] = []

        def fire(who: str) -> None:
            fired.append((who, loop.time(), clock.now()))

        def speech_ended() -> None:
            fire("loop")
            clock.call_later(5, lambda: fire("clock, armed by the loop"))
            clock.call_later(0, lambda: fire("clock, at once"))

        loop.call_later(1.2, speech_ended)
        loop.call_later(8, lambda: fire("loop, later"))
        await clock.advance(12)
        assert clock.now() == 12.0
        return fired

    assert run(main(), start=0.0) == [
        ("loop", 1.2, 1.2),
        ("clock, at once", 1.2, 1.2),
        ("clock, armed by the loop", 6.2, 6.2),
        ("loop, later", 8.0, 8.0),
    ]


@pytest.mark.virtual_time
async def test_a_test_marked_virtual_time_runs_the_sdks_timers_with_its_clock(
    virtual_clock: VirtualClock,
) -> None:
    # the testing kit's pytest plugin gives the marked test a VirtualTimeLoop
    _loop()
    woke: list[float] = []

    async def sdk_timer() -> None:  # as livekit bounds a speech's interruption
        await asyncio.sleep(INTERRUPTION_TIMEOUT)
        woke.append(virtual_clock.now())

    task = asyncio.create_task(sdk_timer())
    await virtual_clock.advance(INTERRUPTION_TIMEOUT - 1)
    assert woke == []
    await virtual_clock.advance(2)
    assert woke == [INTERRUPTION_TIMEOUT]
    await task


def test_a_reply_the_avatar_left_mid_capture_ends_with_the_room_s_playout_not_livekit_s_bound() -> (
    None
):
    # the agent speaks, the avatar leaves while the reply is being captured, the session
    # is closed: its close waits for the speech's end. The reply goes on at the room's
    # output and ends with it; the runtime once ended its segment as an orphan at the
    # route's swap, and the speech then waited out livekit's own interruption timer (5 s,
    # "speech not done in time after interruption"), which the explorer counted as idle
    # time on the virtual loop. The run replays the same either way.
    path = [
        "avatar_start",
        "plugin_routed",
        "plugin_returns",
        "avatar_joins",
        "avatar_video",
        "user_joins",
        "user_speaks",
        "interrupt",
        "agent_says",
        "avatar_leaves",
        "close_a",
        "a_closed",
    ]
    one = explore_run(CONFIGS["watchdog"], path, inputs="playout", check_eventual=False)
    two = explore_run(CONFIGS["watchdog"], path, inputs="playout", check_eventual=False)
    assert one.violation is None
    assert one.idle_seconds == 0.0  # not INTERRUPTION_TIMEOUT
    assert one.snapshots == two.snapshots and one.enabled == two.enabled


def test_time_stands_still_while_a_subprocess_may_answer() -> None:
    async def main() -> bytes:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "import sys; sys.stdout.write(sys.stdin.read())",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(proc.communicate(b"echoed"), 1.0)
        return out

    assert run(main()) == b"echoed"


def test_a_hung_thread_still_meets_its_bound() -> None:
    release = threading.Event()

    async def main() -> bool:
        try:
            # the thread waits for ever; its bound is real time then, not skipped nor stuck
            await asyncio.wait_for(asyncio.to_thread(release.wait), 0.05)
        except TimeoutError:
            return True
        finally:
            release.set()
        return False

    assert run(main())


def test_a_timer_far_from_zero_still_fires() -> None:
    # where time() + the clock's resolution is time() itself, a timer landed on exactly
    # would never be due
    async def main() -> float:
        await asyncio.sleep(0.1)
        await asyncio.sleep(2e7)
        return asyncio.get_running_loop().time()

    assert run(main(), start=1.7e9) >= 1.7e9 + 2e7


def test_an_open_socket_makes_time_pass_at_real_speed() -> None:
    async def main() -> tuple[float, float]:
        loop = _loop()
        ours, theirs = socket.socketpair()
        loop.add_reader(ours, lambda: None)  # the world may write to it any time
        try:
            await asyncio.sleep(0.01)
        finally:
            loop.remove_reader(ours)
            ours.close()
            theirs.close()
        jumped_with_the_socket = loop.jumped
        await asyncio.sleep(60)  # closed: nothing can answer, the loop jumps again
        return jumped_with_the_socket, loop.jumped

    assert run(main()) == (0.0, 60.0)


def test_a_child_process_that_never_started_holds_no_time_back() -> None:
    async def main() -> tuple[int, float]:
        loop = _loop()
        with pytest.raises(FileNotFoundError):
            await asyncio.create_subprocess_exec("/nonexistent/agent-runtime-test")
        await asyncio.sleep(3600)
        return loop.threads, loop.jumped

    assert run(main()) == (0, 3600.0)


def test_closing_the_loop_waits_for_its_executors_threads_for_real() -> None:
    # Python 3.12+ joins the default executor's threads within a bound on the loop's
    # time as the loop closes: that wait is the world's, not a jump past the bound
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for _ in range(5):
            assert run(asyncio.to_thread(lambda: 7)) == 7


@pytest.mark.parametrize("where", ["_make_self_pipe", "__init__"])
def test_a_loop_cut_half_built_by_ctrl_c_says_nothing_when_collected(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Ctrl-C while a run builds its loop: the KeyboardInterrupt goes up as it is, and the
    half-built loop is collected silently (its close found no self-pipe: the CLI's
    one-line "interrupted" was followed by an AttributeError)."""
    import gc
    from asyncio import selector_events

    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(selector_events.BaseSelectorEventLoop, where, interrupted)
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(KeyboardInterrupt):
        VirtualTimeLoop()
    gc.collect()
    assert unraisable == []


@pytest.mark.parametrize("count", [1, 2], ids=["ctrl-c", "ctrl-c twice"])
def test_ctrl_c_landing_as_the_run_starts_is_a_keyboard_interrupt(
    monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    """A Ctrl-C whose handler runs right as the run installs it (the signal came while the
    run was being set up) cancels the run's task and comes out as ``KeyboardInterrupt``,
    the CLI's exit 130. With ``asyncio.Runner.run`` it came out as a ``CancelledError``
    traceback: the Runner counts interrupts from after installing its handler (seen once in
    CI: ``simulate`` interrupted between two scenarios)."""
    import signal

    install = signal.signal
    started: list[bool] = []

    def install_then_interrupted(signum: int, handler: object) -> object:
        previous = install(signum, handler)  # type: ignore[arg-type]
        if (
            signum == signal.SIGINT
            and callable(handler)
            and handler is not signal.default_int_handler
        ):
            for _ in range(count):
                handler(signal.SIGINT, None)
        return previous

    async def main() -> None:
        started.append(True)

    monkeypatch.setattr(signal, "signal", install_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(main())
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert started == []  # cancelled before its first step


@pytest.mark.parametrize(
    "later", [None, 50.0, 20.0], ids=["alone", "one due after", "one due on the way"]
)
def test_a_clock_timer_a_loop_timer_cancels_on_the_way_never_fires(later: float | None) -> None:
    """A clock timer (a grace period, a hold) cancelled by a loop timer due before it (a
    plugin's retry sleep ending, its start failing) in the middle of one ``advance``: it
    does not fire, and the clock's next timer fires at its own time. The advance raised an
    ``IndexError`` inside the kit, or fired the next timer at the cancelled one's time
    (one due at 50 fired at 10)."""

    async def main() -> tuple[list[tuple[str, float]], float]:
        clock = VirtualClock()
        fired: list[tuple[str, float]] = []
        cancelled = clock.call_later(10, lambda: fired.append(("cancelled", clock.now())))
        if later is not None:
            clock.call_later(later, lambda: fired.append(("next", clock.now())))
        asyncio.get_running_loop().call_later(5, cancelled.cancel)
        await clock.advance(30)
        return fired, clock.now()

    fired, now = run(main())
    assert now == 30.0
    assert fired == ([("next", later)] if later is not None and later <= 30 else [])

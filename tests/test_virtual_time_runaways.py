"""What ran away on virtual time, and stays bounded now.

A trial ran the published liveavatar plugin (its websocket faked) under the kit: the test
never ended, at 100% CPU, its memory past 12 GB, and Ctrl-C did not stop it. The loop's
time started at 0, and livekit's ``utils.aio.interval`` takes a last tick at 0 for "never
ticked": every tick after a first one at 0 returned at once, so liveavatar's keep-alive
looped without once yielding to the loop (nothing else ran, virtual time stood at 0, no
bound could fire). Every test here is bounded on the old code too: the spin is counted and
cut (``_cut_a_spinning_keep_alive``) or ends by itself.

Real: livekit's interval, the liveavatar plugin as published, livekit's fake job context,
``AgentSession``, the runtime. Faked, because they need a server: the provider's HTTP API
and websocket (``aiohttp.ClientSession._request``/``_ws_connect``), the room.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import socket
import threading
import time
from typing import Any

import aiohttp
import pytest
from livekit.agents import Agent, AgentServer, AgentSession, APIConnectOptions, JobContext, utils
from livekit.plugins import liveavatar

from agent_runtime import AgentJob, on_session_end
from agent_runtime.testing.clock import (
    UPTIME,
    VirtualClock,
    VirtualTimeLoop,
    VirtualTimeStalled,
    run,
    settle,
)
from agent_runtime.testing.entrypoint import EntrypointRunner, EntrypointStalled
from agent_runtime.testing.inmemory import InMemoryRoom

KEEP_ALIVE = "session.keep_alive"
AVATAR = "liveavatar-avatar-agent"


def _loop() -> VirtualTimeLoop:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop)
    return loop


# -- the loop's first instant ------------------------------------------------------------------


async def _three_ticks() -> list[float]:
    loop = _loop()
    began = loop.time()
    ticks = utils.aio.interval(60)
    at: list[float] = []
    for _ in range(3):  # three, whatever they wait: bounded on the old code too
        await ticks.tick()
        at.append(loop.time() - began)
    return at


def test_livekits_interval_ticks_every_interval_from_the_loops_first_instant() -> None:
    # from 0 it waited for nothing: [0.0, 0.0, 0.0]
    assert run(_three_ticks()) == [0.0, 60.0, 120.0]


@pytest.mark.virtual_time
async def test_a_marked_tests_loop_starts_where_a_real_one_could() -> None:
    assert _loop().time() == UPTIME > 0
    assert await _three_ticks() == [0.0, 60.0, 120.0]


# -- liveavatar, its provider faked --------------------------------------------------------------


class _Socket:
    """liveavatar's websocket: says ``connected``, records what the plugin sends and when."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self.sent: list[tuple[float, str]] = []
        self.inbox: utils.aio.Chan[aiohttp.WSMessage] = utils.aio.Chan()
        connected = {"type": "session.state_updated", "state": "connected"}
        self.inbox.send_nowait(
            aiohttp.WSMessage(aiohttp.WSMsgType.TEXT, json.dumps(connected), None)
        )

    async def send_json(self, data: dict[str, Any], **_: Any) -> None:
        self.sent.append((self._clock.now(), str(data.get("type"))))

    async def receive(self, *_: Any) -> aiohttp.WSMessage:
        try:
            return await self.inbox.recv()
        except utils.aio.ChanClosed:
            return aiohttp.WSMessage(aiohttp.WSMsgType.CLOSED, None, None)

    async def close(self, **_: Any) -> bool:
        self.inbox.close()
        return True


class _Answer:
    status, ok, reason = 200, True, "OK"
    content_type = "application/json"
    headers = {"Content-Type": "application/json"}

    def __init__(self, body: dict[str, Any]) -> None:
        self._text = json.dumps(body)

    async def text(self, *_: Any, **__: Any) -> str:
        return self._text

    async def json(self, *_: Any, **__: Any) -> Any:
        return json.loads(self._text)

    def raise_for_status(self) -> None:
        return None

    def release(self) -> None:
        return None

    async def __aenter__(self) -> _Answer:
        return self

    async def __aexit__(self, *_: Any) -> None:
        return None


def _fake_provider(monkeypatch: pytest.MonkeyPatch, clock: VirtualClock) -> list[_Socket]:
    sockets: list[_Socket] = []
    session = {"session_id": "s-1", "session_token": "t", "ws_url": "wss://ws.invalid/ws"}

    async def request(_s: Any, method: str, url: Any, **_: Any) -> _Answer:
        return _Answer({"code": 100, "data": session})

    async def ws_connect(_s: Any, url: Any = None, **_: Any) -> _Socket:
        sockets.append(_Socket(clock))
        return sockets[-1]

    def no_network(host: Any, *_: Any, **__: Any) -> Any:
        raise OSError(f"no network in these tests (looked up {host!r})")

    monkeypatch.setattr(aiohttp.ClientSession, "_request", request)
    monkeypatch.setattr(aiohttp.ClientSession, "_ws_connect", ws_connect)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setenv("LIVEKIT_URL", "wss://env.invalid")
    monkeypatch.setenv("LIVEKIT_API_KEY", "test-key")
    monkeypatch.setenv("LIVEKIT_API_SECRET", "test-secret-" + "x" * 32)
    return sockets


def _cut_a_spinning_keep_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old code's spin, cut: a keep-alive queued at an instant that already had 10
    raises in the plugin's keep-alive task (which ends it), instead of queueing for ever."""
    send = liveavatar.AvatarSession.send_event
    at: dict[float, int] = {}

    def counted(self: liveavatar.AvatarSession, msg: dict[str, Any]) -> None:
        if msg.get("type") == KEEP_ALIVE:
            now = asyncio.get_running_loop().time()
            at[now] = at.get(now, 0) + 1
            if at[now] > 10:
                raise RuntimeError("liveavatar's keep-alive spins (cut by the test)")
        send(self, msg)

    monkeypatch.setattr(liveavatar.AvatarSession, "send_event", counted)


def _server(wrapped: bool) -> AgentServer:
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        fast = APIConnectOptions(max_retry=1, retry_interval=0.0, timeout=5.0)
        plugin = liveavatar.AvatarSession(avatar_id="a", api_key="k", conn_options=fast)
        session: AgentSession[Any] = AgentSession()
        if wrapped:
            job = AgentJob.from_job_context(ctx, session=session, avatar=plugin)
            await job.start(Agent(instructions="t"))
        else:  # the control: the plugin started on its own, as livekit does
            job = AgentJob.from_job_context(ctx, session=session, playout=False)
            await plugin.start(session, ctx.room)
            await job.start(Agent(instructions="t"))

    return server


@pytest.mark.virtual_time
@pytest.mark.parametrize("wrapped", [True, False], ids=["wrapped", "unwrapped"])
async def test_liveavatars_keep_alive_goes_every_60_virtual_seconds(
    wrapped: bool,
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    run_entrypoint: EntrypointRunner,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sockets = _fake_provider(monkeypatch, virtual_clock)
    _cut_a_spinning_keep_alive(monkeypatch)
    agent_room.add_participant("user")
    started = asyncio.ensure_future(run_entrypoint(_server(wrapped), start_timeout=60))
    await settle()
    agent_room.add_participant(AVATAR, kind="agent")
    agent_room.publish_track(AVATAR, "video")
    job = await started
    await virtual_clock.advance(150)
    assert len(sockets) == 1
    # the first as the provider says connected, then one a minute (the spin queued them
    # all at 0, the rest of the loop waiting)
    assert [t for t, what in sockets[0].sent if what == KEEP_ALIVE] == [0.0, 60.0, 120.0]
    if wrapped:
        assert job.states["avatar"] == "joined"


# -- a loop kept busy ----------------------------------------------------------------------------


async def _keep_alive(every: float, sent: list[float]) -> None:
    while True:
        await asyncio.sleep(every)
        sent.append(asyncio.get_running_loop().time())


@pytest.mark.virtual_time
async def test_the_kits_bounds_fire_at_their_virtual_time_with_a_periodic_timer_running(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    # what the trial's report suspected, and did not happen: time jumps from tick to tick
    # and the bound's own timer fires in its turn
    sent: list[float] = []
    ticking = asyncio.create_task(_keep_alive(60, sent))

    async def waits_for_ever(ctx: JobContext) -> None:
        await asyncio.Event().wait()

    agent_room.add_participant("user")
    began = _loop().time()
    with pytest.raises(EntrypointStalled, match="after 600s"):
        await run_entrypoint(waits_for_ever, start_timeout=600)
    assert _loop().time() - began == 600.0 and len(sent) == 10
    ticking.cancel()


def test_a_loop_that_never_has_nothing_to_do_fails_its_run() -> None:
    """A task that awaits ``asyncio.sleep(0)`` in a loop: virtual time passes only when
    nothing can run, so it stood still and the 5 s bound never fired (the run went on for
    ever; here the spin gives up after 200,000 rounds, and the bound fires)."""

    async def spin() -> None:
        for _ in range(200_000):
            await asyncio.sleep(0)

    async def main() -> None:
        _loop().max_busy_rounds = 10_000
        spinning = asyncio.create_task(spin(), name="polls")
        try:
            await asyncio.wait_for(asyncio.Event().wait(), 5)
        finally:
            spinning.cancel()

    with pytest.raises(VirtualTimeStalled, match=r"stood still at 0s .*'polls' \(.*spin\)"):
        run(main())


def test_a_loop_polling_a_thread_is_not_stalled() -> None:
    # the thread may answer: the loop's rounds meanwhile are not a spin
    data = bytes(20_000_000)

    async def main() -> str:
        _loop().max_busy_rounds = 100
        work = asyncio.ensure_future(asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest()))
        while not work.done():
            await asyncio.sleep(0)
        return work.result()

    assert run(main()) == hashlib.sha256(data).hexdigest()


def _on_a_runner(runner: str, main: Any) -> None:
    if runner == "clock.run":
        run(main)
    else:  # as pytest-asyncio runs a test marked virtual_time
        with asyncio.Runner(loop_factory=VirtualTimeLoop) as r:
            r.run(main)


@pytest.mark.parametrize("runner", ["clock.run", "asyncio.Runner"])
def test_ctrl_c_stops_a_run_stuck_in_a_callback_that_never_returns(runner: str) -> None:
    """The trial's spin, as Ctrl-C met it: the runner's handler cancels its task and wakes
    the loop, which never comes round to either; a second Ctrl-C was needed. Now the loop
    sends it again itself once INTERRUPT_GRACE has passed (here the callback gives up
    after 10 real seconds, then the first cancel gets through)."""
    assert threading.current_thread() is threading.main_thread()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    spinning = threading.Event()

    def stuck() -> None:
        spinning.set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # never awaits: the loop is stuck here
            pass

    async def main() -> None:
        asyncio.get_running_loop().call_soon(stuck)
        await asyncio.Event().wait()

    def ctrl_c() -> None:
        if spinning.wait(10):
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    threading.Thread(target=ctrl_c, daemon=True).start()
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        _on_a_runner(runner, main())
    assert time.monotonic() - began < 5
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

"""The avatar lifecycle: an agent is never left silent by its avatar.

``routing`` is the plugin started with its audio route installed, waiting for the avatar
participant to join *and* publish video (either order) under ``join_timeout``. Every way
out of ``routing``/``joined`` short of success goes through ``failed``, whose only work is
putting the previous route back (identity-guarded) before ``restored``; ``restore_route``
always answers ``route_restored``, so ``failed`` never lasts past that one effect.

A late join after ``restored`` is ignored unless the ``retry`` guard holds (the runtime's
opt-in ``retry`` setting and a route to reinstall): then the avatar's route goes back in
and the join is awaited again under a fresh ``join_timeout``.

Interruption sends ``lk.clear_buffer`` only from ``joined``; everywhere else it clears the
local buffer and nothing goes on the wire. A clear whose outcome says the recipient is gone
(RECIPIENT_DISCONNECTED / RECIPIENT_NOT_FOUND) counts as the avatar having left.
"""

from .spec import Cell, Effect, MachineSpec, State, StateTimeout, cells, row

ACTIVE = ["routing", "joined"]
LIVE = ["idle", "routing", "joined", "failed", "restored"]
NOT_JOINED = ["idle", "routing", "failed", "restored"]
EVENTS = (
    "start",
    "room_connected",
    "avatar_connected",
    "video_published",
    "join_timeout",
    "start_error",
    "avatar_left",
    "interrupt",
    "playback_finished",
    "clear_buffer_done",
    "route_restored",
    "close",
)


def _all_but(*keep: str) -> list[str]:
    return [e for e in EVENTS if e not in keep]


CLOSED_IGNORES: list[Cell] = cells("closed", _all_but("start"), "closed: nothing left to do")

AVATAR = MachineSpec(
    name="avatar",
    description="One avatar session around any livekit-agents AvatarSession plugin.",
    initial="idle",
    states=(
        State(name="idle", description="created; the plugin is not started"),
        State(
            name="routing",
            timeout=StateTimeout(event="join_timeout", setting="join_timeout", default=30.0),
            description="plugin started, its audio route installed; waiting for the join",
        ),
        State(name="joined", description="the avatar is in the room with video; audio goes to it"),
        State(name="failed", description="the avatar is gone or never came; restoring the route"),
        State(name="restored", description="the previous route is back; the agent is audible"),
        State(name="closed", final=True, description="route restored, plugin closed, unhooked"),
    ),
    events=EVENTS,
    guards=("has_video", "avatar_present", "recipient_gone", "retry"),
    effects=(
        Effect(
            name="start_plugin",
            error_event="start_error",
            description="snapshot the audio chain, run the plugin's start(), record its sink",
        ),
        Effect(
            name="check_presence",
            description="look for an avatar that joined before we could see it",
        ),
        Effect(
            name="restore_route",
            error_event="route_restored",
            description="put the previous route back if the avatar's sink is still in place",
        ),
        Effect(
            name="reinstall_route",
            error_event="start_error",
            description="route audio to the returning avatar again",
        ),
        Effect(
            name="send_clear_buffer",
            error_event="clear_buffer_done",
            description="lk.clear_buffer RPC to the avatar, bounded",
        ),
        Effect(
            name="clear_local_buffer",
            description="finish the avatar sink's pending playout locally; no RPC",
        ),
        Effect(name="mark_playout_done", description="the avatar finished playing a segment"),
        Effect(
            name="close_plugin",
            description="guarded restore, remove the avatar participant, unhook all",
        ),
    ),
    rows=(
        *row("idle", "start", "routing", effects=["start_plugin"]),
        *row("routing", "room_connected", None, effects=["check_presence"]),
        *row("routing", "avatar_connected", "joined", guards=["has_video"]),
        *row("routing", "avatar_connected", None),
        *row("routing", "video_published", "joined", guards=["avatar_present"]),
        *row("routing", "video_published", None),
        *row("routing", "join_timeout", "failed", effects=["restore_route"]),
        *row("routing", "start_error", "failed", effects=["restore_route"]),
        *row(ACTIVE, "avatar_left", "failed", effects=["restore_route"]),
        *row("joined", "interrupt", None, effects=["send_clear_buffer"]),
        *row(NOT_JOINED, "interrupt", None, effects=["clear_local_buffer"]),
        # the avatar can play (and report) before its video is up: DataStreamAudioOutput
        # starts streaming once the participant is there
        *row(ACTIVE, "playback_finished", None, effects=["mark_playout_done"]),
        *row(
            "joined",
            "clear_buffer_done",
            "failed",
            guards=["recipient_gone"],
            effects=["restore_route"],
        ),
        *row("joined", "clear_buffer_done", None),
        *row("failed", "route_restored", "restored"),
        *row(
            "restored", "avatar_connected", "routing", guards=["retry"], effects=["reinstall_route"]
        ),
        *row("restored", "avatar_connected", None),
        *row(LIVE, "close", "closed", effects=["close_plugin"]),
    ),
    ignore=(
        *cells(["idle", "joined", "failed", "restored"], "room_connected", "only routing looks"),
        *cells(["idle", "failed"], "avatar_connected", "the avatar is not awaited"),
        *cells("joined", "avatar_connected", "already joined"),
        *cells(["idle", "joined", "failed", "restored"], "video_published", "not awaited"),
        *cells(["idle", "joined", "failed", "restored"], "join_timeout", "a stale timer"),
        *cells(["idle", "joined", "failed", "restored"], "start_error", "a late start outcome"),
        *cells(["idle", "failed", "restored"], "avatar_left", "its route is already gone"),
        *cells(
            ["idle", "failed", "restored"],
            "playback_finished",
            "the route was swapped out, which finished its segments",
        ),
        *cells(NOT_JOINED, "clear_buffer_done", "a late RPC outcome"),
        *cells(["idle", "routing", "joined", "restored"], "route_restored", "not restoring"),
        *CLOSED_IGNORES,
    ),
    reject=(
        *cells(["routing", "joined", "failed", "restored"], "start", "already started"),
        *cells("closed", "start", "closed"),
    ),
)

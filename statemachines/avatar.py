"""The avatar lifecycle: an agent is never left silent by its avatar.

``routing`` is the plugin started with its audio route installed, waiting for the avatar
participant to join *and* publish video (either order) under ``join_timeout``. Every way
out of ``routing``/``joined`` short of success goes through ``failed``, whose only work is
putting the previous route back (identity-guarded) before ``restored``.
"""

from .spec import Effect, MachineSpec, State, StateTimeout, cells, row

ACTIVE = ["routing", "joined"]
LIVE = ["idle", "routing", "joined", "failed", "restored"]

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
        State(name="closed", final=True),
    ),
    events=(
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
    ),
    guards=("has_video", "avatar_present", "recipient_gone", "retry"),
    effects=(
        Effect(
            name="start_plugin",
            error_event="start_error",
            description="snapshot the audio chain, run the plugin's start()",
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
            description="clear the local buffer and mark playout done; no RPC",
        ),
        Effect(name="mark_playout_done", description="the avatar finished playing"),
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
        *row(
            ["idle", "routing", "failed", "restored"],
            "interrupt",
            None,
            effects=["clear_local_buffer"],
        ),
        *row("joined", "playback_finished", None, effects=["mark_playout_done"]),
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
        *cells(["idle", "joined", "failed", "restored"], "room_connected"),
        *cells(["idle", "failed"], "avatar_connected", "the avatar was not asked for"),
        *cells("joined", "avatar_connected", "already joined"),
        *cells(["idle", "joined", "failed", "restored"], "video_published"),
        *cells(["idle", "joined", "failed", "restored"], "join_timeout"),
        *cells(["idle", "joined", "failed", "restored"], "start_error"),
        *cells(["idle", "failed", "restored"], "avatar_left"),
        *cells(
            ["idle", "routing", "failed", "restored"],
            "playback_finished",
            "no avatar playout to finish",
        ),
        *cells(
            ["idle", "routing", "failed", "restored"], "clear_buffer_done", "a late RPC outcome"
        ),
        *cells(["idle", "routing", "joined", "restored"], "route_restored"),
        *cells(
            "closed",
            [
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
            ],
        ),
    ),
    reject=(
        *cells(["routing", "joined", "failed", "restored"], "start", "already started"),
        *cells("closed", "start", "closed"),
    ),
)

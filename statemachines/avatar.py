"""The avatar lifecycle: an agent is never left silent by its avatar.

``starting`` runs the plugin's ``start()`` as a state task: the mailbox stays free (room
facts, interrupts and ``close`` are handled meanwhile), leaving the state cancels the start,
and its outcome comes back as ``plugin_started`` or ``start_error``. ``routing`` is the
plugin's audio route in place, waiting for the avatar participant to join *and* publish
video (either order) under ``join_timeout``. ``clearing`` is ``joined`` with one
``lk.clear_buffer`` in flight (a state task, bounded by ``clear_buffer_timeout``); a second
interrupt is answered by that clear, and its outcome returns to ``joined``, or, when it
says the recipient is gone (RECIPIENT_DISCONNECTED / RECIPIENT_NOT_FOUND), counts as the
avatar having left.

Every way out of ``starting``/``routing``/``joined``/``clearing`` (where our route may be
in) short of success goes through ``failed``, whose only work is putting the previous route
back (identity-guarded) before ``restored``; ``restore_route`` always answers
``route_restored``, so ``failed`` never lasts past that one effect. ``close`` says by its
source what is left to undo: nothing from ``idle``; from the states where our route may be
in, the guarded restore, then the plugin; from ``failed``/``restored`` only the plugin.
A start cut short (its timeout, or ``close``) first records any sink the plugin had put in.

A late join after ``restored`` is ignored unless the ``retry`` guard holds (the runtime's
opt-in ``retry`` setting and a route to reinstall): then the avatar's route goes back in
and the join is awaited again under a fresh ``join_timeout``.

Interruption sends ``lk.clear_buffer`` only from ``joined`` (into ``clearing``); everywhere
else it clears the local buffer and nothing goes on the wire.
"""

from .spec import Effect, MachineSpec, State, StateTimeout, cells, row

ROUTED = ["starting", "routing", "joined", "clearing"]  # our route may be in
ACTIVE = ["routing", "joined", "clearing"]  # the plugin's start has been handled
DONE = ["failed", "restored"]  # our route is already put back
EVENTS = (
    "start",
    "plugin_started",
    "start_timeout",
    "start_error",
    "room_connected",
    "avatar_connected",
    "video_published",
    "join_timeout",
    "avatar_left",
    "interrupt",
    "playback_finished",
    "clear_buffer_done",
    "route_restored",
    "close",
)
CLOSE_PLUGIN = ["put_route_back", "unhook", "close_plugin"]


def _all_but(*keep: str) -> list[str]:
    return [e for e in EVENTS if e not in keep]


AVATAR = MachineSpec(
    name="avatar",
    description="One avatar session around any livekit-agents AvatarSession plugin.",
    initial="idle",
    states=(
        State(name="idle", description="created; the plugin is not started"),
        State(
            name="starting",
            # the plugin's start() gets the budget the app gave the avatar to show up: a start
            # slower than that has already failed the user, and a setting of its own would be
            # one more public option for the same wait
            timeout=StateTimeout(event="start_timeout", setting="join_timeout", default=30.0),
            invoke=("start_plugin",),
            description="the plugin's start() runs; its route may be in already",
        ),
        State(
            name="routing",
            timeout=StateTimeout(event="join_timeout", setting="join_timeout", default=30.0),
            description="plugin started, its audio route installed; waiting for the join",
        ),
        State(name="joined", description="the avatar is in the room with video; audio goes to it"),
        State(
            name="clearing",
            invoke=("send_clear_buffer",),
            description="joined, with one lk.clear_buffer in flight",
        ),
        State(name="failed", description="the avatar is gone or never came; restoring the route"),
        State(name="restored", description="the previous route is back; the agent is audible"),
        State(name="closed", final=True, description="route restored, plugin closed, unhooked"),
    ),
    events=EVENTS,
    guards=("has_video", "avatar_present", "recipient_gone", "retry", "clear_wanted"),
    effects=(
        Effect(
            name="start_plugin",
            error_event="start_error",
            description="snapshot the audio chain, run the plugin's start(), record its sink",
        ),
        Effect(
            name="record_route",
            description="a start cut short: record the sink it may have installed already",
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
            description="lk.clear_buffer RPC to the avatar, bounded; unreported playout ends",
        ),
        Effect(
            name="clear_local_buffer",
            description="finish the avatar sink's pending playout locally; no RPC",
        ),
        Effect(name="mark_playout_done", description="the avatar finished playing a segment"),
        Effect(
            name="put_route_back",
            description="the guarded restore on the way out (no event: the machine closes)",
        ),
        Effect(
            name="unhook",
            description="give back the sink's clear and the playback RPC, stop following the room",
        ),
        Effect(
            name="close_plugin",
            description="close the plugin and its sink, remove the avatar participant",
        ),
    ),
    rows=(
        *row("idle", "start", "starting"),
        *row("starting", "plugin_started", "routing", effects=["check_presence"]),
        *row("starting", "start_error", "failed", effects=["restore_route"]),
        *row("starting", "start_timeout", "failed", effects=["record_route", "restore_route"]),
        *row("routing", "room_connected", None, effects=["check_presence"]),
        *row("routing", "avatar_connected", "joined", guards=["has_video"]),
        *row("routing", "avatar_connected", None),
        *row("routing", "video_published", "joined", guards=["avatar_present"]),
        *row("routing", "video_published", None),
        *row("routing", "join_timeout", "failed", effects=["restore_route"]),
        *row("routing", "start_error", "failed", effects=["restore_route"]),  # reinstall failed
        *row(ACTIVE, "avatar_left", "failed", effects=["restore_route"]),
        *row("joined", "interrupt", "clearing", guards=["clear_wanted"]),
        # the session's own clear with nothing playing: nothing to clear (as upstream)
        *row("joined", "interrupt", None),
        *row(
            ["idle", "starting", "routing", *DONE],
            "interrupt",
            None,
            effects=["clear_local_buffer"],
        ),
        # the avatar can play (and report) before its video is up: DataStreamAudioOutput
        # starts streaming once the participant is there
        *row(ROUTED, "playback_finished", None, effects=["mark_playout_done"]),
        *row(
            "clearing",
            "clear_buffer_done",
            "failed",
            guards=["recipient_gone"],
            effects=["restore_route"],
        ),
        *row("clearing", "clear_buffer_done", "joined"),
        *row("failed", "route_restored", "restored"),
        *row(
            "restored", "avatar_connected", "routing", guards=["retry"], effects=["reinstall_route"]
        ),
        *row("restored", "avatar_connected", None),
        *row("idle", "close", "closed", effects=["unhook"]),
        *row("starting", "close", "closed", effects=["record_route", *CLOSE_PLUGIN]),
        *row(ACTIVE, "close", "closed", effects=CLOSE_PLUGIN),
        *row(DONE, "close", "closed", effects=["unhook", "close_plugin"]),
    ),
    ignore=(
        *cells(["idle", *ACTIVE, *DONE], ["plugin_started", "start_timeout"], "a stale start"),
        *cells(["idle", "joined", "clearing", *DONE], "start_error", "a late start outcome"),
        *cells(
            "starting",
            ["room_connected", "avatar_connected", "video_published", "avatar_left"],
            "routing checks presence on entry",
        ),
        *cells(["idle", "joined", "clearing", *DONE], "room_connected", "only routing looks"),
        *cells(["idle", "failed"], "avatar_connected", "the avatar is not awaited"),
        *cells(["joined", "clearing"], "avatar_connected", "already joined"),
        *cells(["idle", "joined", "clearing", *DONE], "video_published", "not awaited"),
        *cells(["idle", "starting", "joined", "clearing", *DONE], "join_timeout", "a stale timer"),
        *cells(["idle", *DONE], "avatar_left", "its route is already gone"),
        *cells("clearing", "interrupt", "the clear in flight answers for it"),
        *cells(
            ["idle", *DONE],
            "playback_finished",
            "the route was swapped out, which finished its segments",
        ),
        *cells(
            ["idle", "starting", "routing", "joined", *DONE],
            "clear_buffer_done",
            "a late RPC outcome",
        ),
        *cells(["idle", *ROUTED, "restored"], "route_restored", "not restoring"),
        *cells("closed", _all_but("start"), "closed: nothing left to do"),
    ),
    reject=(
        *cells([*ROUTED, *DONE], "start", "already started"),
        *cells("closed", "start", "closed"),
    ),
)

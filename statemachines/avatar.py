"""The avatar lifecycle: an agent is never left silent by its avatar.

``starting`` runs the plugin's ``start()`` as a state task: the mailbox stays free (room
facts, interrupts and ``close`` are handled meanwhile), leaving the state cancels the start,
and its outcome comes back as ``plugin_started``, ``no_route`` (the start returned having
installed no audio route: a failure the plugin swallowed and logged) or ``start_error``.
``routing`` is the plugin's audio route in place, waiting for the avatar participant to join
*and* publish video (either order) under ``join_timeout``.

While ``joined`` (and ``clearing``) an interruption is the plugin's own, unchanged: its sink's
``clear_buffer()`` runs as without the lifecycle (for a data-stream avatar an
``lk.clear_buffer`` RPC, its hold or no-hold setting; for a queue/websocket sink its own
clear and events). ``clearing`` is ``joined`` while that clear holds the sink (the sink's
next audio waits for the interrupted playback to settle); a second interrupt is answered by
it. In every other state no RPC goes to an avatar that is not there: pending playout is
finished locally, so the session never waits out its 5 s interruption fallback.

Every way out of ``starting``/``routing``/``joined``/``clearing`` (where our route may be
in) short of success goes through ``failed``, whose only work is putting the previous route
back (identity-guarded) before ``restored``; ``restore_route`` always answers
``route_restored`` with the cause. When the retry policy calls that cause transient and has
attempts left, ``backoff`` waits (the agent on room audio) for ``backoff_elapsed`` (again
while the agent is speaking there: the next start would cut that reply), then ``releasing``
closes the failed attempt (its plugin session closed, its avatar participant removed) as a
state task bounded by a ``join_timeout`` of its own, and ``starting`` starts the
plugin again with its whole ``join_timeout`` (``released``, or ``release_timeout`` if the
release hung). An attempt that failed for good is kept only for a rejoin (the policy's
``rejoin``, and a route to reinstall): otherwise ``retiring`` closes it the same way (same
task work, same bound, same outcomes), so that no avatar is left in the room, still billed
by its provider, and then the machine rests in ``restored``. ``close`` says by its source
what is left to undo: nothing from ``idle``; from the states where our route may be in, the
guarded restore, then the plugin; from ``failed``/``backoff``/``releasing``/``retiring``/
``restored`` only the plugin (its ``aclose()`` runs once per attempt: a close under way
in ``releasing``/``retiring`` is waited for, not cut and called again, and one that ended
is not called again; its participant's removal answers "not found").
A start cut short (its timeout, or ``close``) first records any sink the plugin had put in.

A late join in ``backoff`` is ignored unless ``rejoin`` holds (the next attempt's release
removes it); in ``restored`` it is retired unless ``rejoin`` holds (the late avatar removed;
the plugin, closed already, is not closed again). One that joins while ``retiring`` runs is
not let cut the plugin's close under way: ``restored`` looks for it on entry
(``look_for_late_avatar``) and retires it then. With ``rejoin`` the avatar's route goes
back in and the join is awaited again under a fresh ``join_timeout``. A reinstall that fails
reports ``start_error``, a failure wherever the events queued before it took the machine.
"""

from .spec import Effect, MachineSpec, State, StateTimeout, cells, row

ROUTED = ["starting", "routing", "joined", "clearing"]  # our route may be in
ACTIVE = ["routing", "joined", "clearing"]  # the plugin's start has been handled
# the states in which the session's clear reaches the plugin's sink as without the
# lifecycle (the runtime delivers it there, synchronously, before posting ``interrupt``)
PLUGIN_CLEARS = ["joined", "clearing"]
DONE = ["failed", "backoff", "releasing", "retiring", "restored"]  # our route is put back
WAITING = ["backoff", "restored"]  # a late join may be routed to again (rejoin)
# an attempt's close (its plugin session and sink closed, its participant removed), bounded
RELEASES = ["releasing", "retiring"]
# what can end an attempt, as route_restored's cause (the retry policy names the transient)
CAUSES = ("start_error", "start_timeout", "no_route", "join_timeout", "avatar_left")
EVENTS = (
    "start",
    "plugin_started",
    "no_route",
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
    "backoff_elapsed",
    "released",
    "release_timeout",
    "close",
)
CLOSE_PLUGIN = ["put_route_back", "unhook", "close_plugin"]
START_OUTCOMES = ["plugin_started", "no_route", "start_timeout"]


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
            invoke=("follow_plugin_clear",),
            description="joined, the plugin's own clear holding its sink",
        ),
        State(name="failed", description="the avatar is gone or never came; restoring the route"),
        State(
            name="backoff",
            # the policy's delay for this attempt (initial x multiplier^n, capped)
            timeout=StateTimeout(event="backoff_elapsed", setting="retry_backoff", default=1.0),
            description="on room audio, waiting to start the plugin again",
        ),
        State(
            name="releasing",
            # the failed attempt's close has a bound of its own: the next attempt's start
            # gets its whole join_timeout from when that start begins
            timeout=StateTimeout(event="release_timeout", setting="join_timeout", default=30.0),
            invoke=("release_attempt",),
            description="on room audio, the failed attempt closed before the plugin starts again",
        ),
        State(
            name="retiring",
            # as releasing: the same close of the attempt, within the same bound
            timeout=StateTimeout(event="release_timeout", setting="join_timeout", default=30.0),
            invoke=("retire_attempt",),
            description="on room audio for good, the failed attempt closed (no rejoin)",
        ),
        State(name="restored", description="the previous route is back; the agent is audible"),
        State(name="closed", final=True, description="route restored, plugin closed, unhooked"),
    ),
    events=EVENTS,
    guards=(
        "has_video",
        "avatar_present",
        "clear_pending",
        "delivered",
        "retry_left",
        "speaking_in_room",
        "rejoin",
    ),
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
            name="release_attempt",
            # a release that failed is over too: the next attempt starts
            error_event="released",
            description="before a retry: close the failed attempt's plugin session and sink, "
            "remove its avatar participant",
        ),
        Effect(
            name="retire_attempt",
            # a retirement that failed is over too: the agent is on room audio either way
            error_event="released",
            description="no retry, no rejoin: close the failed attempt's plugin session and "
            "sink, remove its avatar participant",
        ),
        Effect(
            name="look_for_late_avatar",
            description="an avatar participant of the attempt retired still in the room (it "
            "joined while the retirement ran): retire it too",
        ),
        Effect(
            name="reinstall_route",
            error_event="start_error",
            description="route audio to the returning avatar again",
        ),
        Effect(
            name="follow_plugin_clear",
            error_event="clear_buffer_done",
            description="wait for the plugin's own clear to settle (it does the clear's work)",
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
        # a start that returned with no route in: the plugin swallowed its failure
        *row("starting", "no_route", "failed", effects=["restore_route"]),
        *row("starting", "start_error", "failed", effects=["restore_route"]),
        *row("starting", "start_timeout", "failed", effects=["record_route", "restore_route"]),
        *row("routing", "room_connected", None, effects=["check_presence"]),
        *row("routing", "avatar_connected", "joined", guards=["has_video"]),
        *row("routing", "avatar_connected", None),
        *row("routing", "video_published", "joined", guards=["avatar_present"]),
        *row("routing", "video_published", None),
        *row("routing", "join_timeout", "failed", effects=["restore_route"]),
        # past starting (whose own outcomes die with it), a start_error is the reinstall's
        # failure, decided after whatever was queued before it (the join, an interruption)
        *row(ACTIVE, "start_error", "failed", effects=["restore_route"]),
        *row(ACTIVE, "avatar_left", "failed", effects=["restore_route"]),
        # the plugin's own clear (already run by its sink) holds the sink: follow it
        *row("joined", "interrupt", "clearing", guards=["clear_pending"]),
        *row("joined", "interrupt", None, guards=["delivered"]),  # it held nothing
        # asked before the join was seen: cleared as it was asked, locally
        *row("joined", "interrupt", None, effects=["clear_local_buffer"]),
        *row(
            ["idle", "starting", "routing", *DONE],
            "interrupt",
            None,
            effects=["clear_local_buffer"],
        ),
        # the avatar can play (and report) before its video is up: DataStreamAudioOutput
        # starts streaming once the participant is there
        *row(ROUTED, "playback_finished", None, effects=["mark_playout_done"]),
        *row("clearing", "clear_buffer_done", "joined"),
        *row("failed", "route_restored", "backoff", guards=["retry_left"]),
        # given up: kept for a late join only if it can get the audio again
        *row("failed", "route_restored", "restored", guards=["rejoin"]),
        *row("failed", "route_restored", "retiring"),
        # the next attempt's start swaps its sink in under the reply playing in the room
        # (livekit clears the output it detaches): the backoff starts again until it is said
        *row("backoff", "backoff_elapsed", "backoff", guards=["speaking_in_room"]),
        *row("backoff", "backoff_elapsed", "releasing"),
        *row("releasing", "released", "starting"),
        # the old attempt's close hung past its bound: logged by it, the new start goes on
        *row("releasing", "release_timeout", "starting"),
        # the attempt closed (or its close cut at its bound, logged): on room audio for good
        *row("retiring", "released", "restored", effects=["look_for_late_avatar"]),
        *row("retiring", "release_timeout", "restored", effects=["look_for_late_avatar"]),
        *row(
            WAITING, "avatar_connected", "routing", guards=["rejoin"], effects=["reinstall_route"]
        ),
        *row("backoff", "avatar_connected", None),  # the next attempt's release removes it
        # one there without video when it was given up, its video now: as if it joined
        *row(WAITING, "video_published", "routing", guards=["rejoin"], effects=["reinstall_route"]),
        *row(WAITING, "video_published", None),
        # a late avatar of an attempt given up: retired (its removal asked again)
        *row("restored", "avatar_connected", "retiring"),
        *row("idle", "close", "closed", effects=["unhook"]),
        *row("starting", "close", "closed", effects=["record_route", *CLOSE_PLUGIN]),
        *row(ACTIVE, "close", "closed", effects=CLOSE_PLUGIN),
        *row(DONE, "close", "closed", effects=["unhook", "close_plugin"]),
    ),
    ignore=(
        *cells(["idle", *ACTIVE, *DONE], START_OUTCOMES, "a stale start"),
        *cells(["idle", *DONE], "start_error", "no attempt running (or it already failed)"),
        *cells(
            "starting",
            ["room_connected", "avatar_connected", "video_published", "avatar_left"],
            "routing checks presence on entry",
        ),
        *cells(["idle", "joined", "clearing", *DONE], "room_connected", "only routing looks"),
        *cells(["idle", "failed", "releasing"], "avatar_connected", "the avatar is not awaited"),
        *cells(
            "retiring",
            "avatar_connected",
            "the plugin's close under way is not cut: restored looks for the avatar on entry",
        ),
        *cells(["joined", "clearing"], "avatar_connected", "already joined"),
        *cells(
            ["idle", "joined", "clearing", "failed", "releasing", "retiring"],
            "video_published",
            "not awaited",
        ),
        *cells(["idle", "starting", "joined", "clearing", *DONE], "join_timeout", "a stale timer"),
        *cells(["idle", *DONE], "avatar_left", "its route is already gone"),
        *cells("clearing", "interrupt", "the plugin's clear in flight answers for it"),
        *cells(
            ["idle", *DONE],
            "playback_finished",
            "the route was swapped out, which finished its segments",
        ),
        *cells(
            ["idle", "starting", "routing", "joined", *DONE],
            "clear_buffer_done",
            "a late clear outcome",
        ),
        *cells(
            ["idle", *ROUTED, "backoff", *RELEASES, "restored"], "route_restored", "not restoring"
        ),
        *cells(
            ["idle", *ROUTED, "failed", *RELEASES, "restored"],
            "backoff_elapsed",
            "a stale backoff timer",
        ),
        *cells(
            ["idle", *ROUTED, "failed", "backoff", "restored"],
            ["released", "release_timeout"],
            "no release running (a stale outcome)",
        ),
        *cells("closed", _all_but("start"), "closed: nothing left to do"),
    ),
    reject=(
        *cells([*ROUTED, *DONE], "start", "already started"),
        *cells("closed", "start", "closed"),
    ),
)

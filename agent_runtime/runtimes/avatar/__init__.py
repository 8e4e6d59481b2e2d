"""The avatar lifecycle around any livekit-agents ``AvatarSession`` plugin.

Upstream plugins point the session's audio at the avatar in ``start()`` and nothing ever
points it back: an avatar that never joins, or leaves, leaves the agent talking into a
data stream nobody reads. ``AvatarLifecycle`` runs the ``avatar`` machine around the
unchanged plugin: it snapshots the audio chain before the plugin's ``start()``, records the
sink the plugin installed, follows the avatar participant through room facts on the
injected clock, and on failure puts the previous route back, but only while the chain's
tail is still the plugin's sink (a route someone installed later is left alone).

The plugin's ``start()`` (with its own keyword options passed through) runs as a state
task of ``starting``: the mailbox keeps moving while it waits, and leaving the state
cancels it. A start that returns having installed no route (a plugin that caught and
logged its provider's error) is a failure at once.

The session's own interruptions reach the plugin's sink as ``clear_buffer()``. While the
avatar is joined that call is the plugin's own, run at once and unchanged (whatever its sink
does: an ``lk.clear_buffer`` RPC with its own bound and hold, or a queue's clear and its
events); the lifecycle only follows it (``clearing`` while it holds the sink). Only when the
avatar is not joined does the lifecycle step in: nothing is sent to a participant who is
not there, and pending playout is finished locally, so the session does not stall.

Route reporting knows the plugin's sink by identity (the one recorded after its start),
whatever its class. For the playout machine the lifecycle also reports what the sink is
given (``segment_flushed``: a segment's audio all pushed, with its duration) and each
``lk.playback_finished`` it accepts (``playback_finished``), from the identity the plugin's
own sink accepts it from: the sink's destination, which need not be the avatar participant
(avatartalk streams to ``listener``). A retry policy (``AvatarRetry``) may start the plugin
again after a transient loss, after a backoff spent on room audio, the failed attempt
closed first (``releasing``). An attempt given up for good is closed the same way
(``retiring``: its plugin session and sink closed, its avatar participant removed, so it is
not left in the room, still billed by its provider) unless the policy's ``rejoin`` keeps it
for a late join; without ``rejoin`` an avatar that joins late is removed too.

The join signal depends on how the plugin delivers its audio (``join_signal``): an avatar
that is a participant of its own waits for it to be there with video (``video``); an
avatar that runs inside the agent's own process (its identity is the agent's own, as
bithuman's local mode) has nothing to wait for (``none``), so it is joined as soon as its
start returns and no ``join_timeout`` can fail it, and it is never removed from the room.

The package, one idea a module: ``_lifecycle`` (the machine's runtime; what it tells
without moving it in ``_view``), ``_route`` (the audio chain and the avatar's route in
it), ``_sink`` (the adopted sink and the playback RPC), ``_plugins`` (what is asked of a
plugin), ``_attempts`` (the retry policy at work: restarts, causes, what is logged of
them), ``_facts`` (what the guards and timers read), ``_waits`` (waiting on its states).
The SDK's private names they need are read through ``agent_runtime.sdk.livekit_compat``.
"""

from agent_runtime.runtimes.avatar._facts import JoinSignal
from agent_runtime.runtimes.avatar._lifecycle import AvatarLifecycle
from agent_runtime.runtimes.avatar._plugins import (
    AvatarPluginError,
    RemoveParticipant,
    check_factory,
    check_plugin,
    check_start_options,
    plugin_name,
    server_api_remover,
)
from agent_runtime.runtimes.avatar._route import (
    _HANDED_OFF as _HANDED_OFF,  # what the tests' leak check counts
)
from agent_runtime.runtimes.avatar._route import (
    Route,
    audio_chain,
    audio_tail,
    route_of,
    session_room_io,
)
from agent_runtime.runtimes.avatar._sink import (
    RPC_CLEAR_BUFFER,
    RPC_PLAYBACK_FINISHED,
    LifecycleEvents,
    PlaybackReport,
    SegmentFlushed,
)

__all__ = [
    "RPC_CLEAR_BUFFER",
    "RPC_PLAYBACK_FINISHED",
    "AvatarLifecycle",
    "AvatarPluginError",
    "JoinSignal",
    "LifecycleEvents",
    "PlaybackReport",
    "RemoveParticipant",
    "Route",
    "SegmentFlushed",
    "audio_chain",
    "audio_tail",
    "check_factory",
    "check_plugin",
    "check_start_options",
    "plugin_name",
    "route_of",
    "server_api_remover",
    "session_room_io",
]

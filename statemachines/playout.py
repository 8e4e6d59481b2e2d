"""The agent's audio from hand-off to heard, and the re-prompt watchdog.

One per session. ``agent_turn`` is the agent thinking or speaking, its audio in the local
pipeline. When that audio has all been handed to a *joined* avatar's sink (``handed_off``),
``remote_playout`` waits for the avatar's ``lk.playback_finished``; the wait is bounded by
the audio actually pushed plus a margin (a timeout the runtime computes on entry), and on
expiry the runtime finishes the sink's segment locally, logging why: nobody stays stuck
"speaking" because an avatar never reported. An avatar that leaves ends the wait at once.
Without a joined avatar the SDK's own playout report (the agent state leaving ``speaking``)
ends the turn. Nothing here sends anything to the avatar.

Once playout is done and the linked user is silent, the watchdog arms after a safety window
(``settling``, for network and playout jitter): ``watching`` times the user's silence and
on expiry calls the re-prompt, at most ``max_reprompts`` times in a row, then hands over
(``exhausted``: the session closing, or waiting for the user, as configured). The user
speaking or leaving, or a new agent turn, disarms it; only the user's speech (or departure)
resets the count, wherever it comes (a user who answers a re-prompt over the agent
answered it).

Audio the sink took before the avatar joined (the plugin's start had not returned, or the
avatar was still routing) is awaited from the join (``avatar_joined``) as if handed then.

Guards (the runtime's view when the event is handled): ``avatar_joined`` (the avatar
machine is ``joined`` or ``clearing``), ``audio_at_avatar`` (the avatar's sink holds ended
segments of agent audio it has not reported), ``watchdog_on`` (re-prompts are configured),
``user_listening`` (a linked user is there and not speaking), ``reprompts_left``.
"""

from .spec import Effect, MachineSpec, Row, State, StateTimeout, cells, row

TURN = ["agent_turn", "remote_playout"]  # the agent's audio is not done
QUIET = ["settling", "watching"]  # the watchdog is armed or arming
REST = ["idle", *QUIET, "exhausted"]  # no agent audio pending
LIVE = [*TURN, *REST]
WATCH = ["watchdog_on", "user_listening"]
EVENTS = (
    "speech_created",  # the session queued a new agent turn
    "agent_thinking",  # the agent state became thinking
    "agent_speaking",  # the agent state became speaking (its first frame reached the output)
    "agent_listening",  # the agent state became listening: the SDK's own playout wait ended
    "speech_done",  # a speech handle is done (one that never reached the output included)
    "handed_off",  # the avatar's sink got the end of a segment: all of its audio is pushed
    "playback_finished",  # lk.playback_finished, accepted from the avatar
    "interrupted",  # the session interrupted the agent's speech
    "avatar_left",  # the avatar machine left joined
    "avatar_joined",  # the avatar machine became joined (from routing: it was not before)
    "user_speaking",
    "user_left",  # the linked participant left
    "playout_timeout",
    "window_elapsed",
    "reprompt_timeout",
    "close",
)
# the ends of a playout: each one leads to the watchdog when the user is listening
ENDS = (
    (TURN, "agent_listening", ["playout_done"]),
    # a speech that never reached "speaking" (no audio, a sink that never took it) ends
    # with no change of the agent state
    (["agent_turn"], "speech_done", ["playout_done"]),
    (["remote_playout"], "playback_finished", ["playout_done"]),
    (["remote_playout"], "playout_timeout", ["finish_playout", "playout_done"]),
    (["remote_playout"], "avatar_left", ["playout_done"]),
)


def _ends() -> list[Row]:
    out: list[Row] = []
    for sources, event, effects in ENDS:
        out += row(sources, event, "settling", guards=WATCH, effects=effects)
        out += row(sources, event, "idle", effects=effects)
    return out


PLAYOUT = MachineSpec(
    name="playout",
    description="The agent's audio until it was heard, and the re-prompt watchdog.",
    initial="idle",
    states=(
        State(name="idle", description="no agent audio pending; the watchdog is off"),
        State(name="agent_turn", description="the agent thinks or speaks; audio in the pipeline"),
        State(
            name="remote_playout",
            # margin + the pushed audio still to play, computed by the runtime on entry
            timeout=StateTimeout(event="playout_timeout", setting="playout_bound", default=2.0),
            description="handed off to a joined avatar; waiting for its lk.playback_finished",
        ),
        State(
            name="settling",
            timeout=StateTimeout(event="window_elapsed", setting="safety_window", default=1.0),
            description="playout done, the user silent: jitter passes before the watchdog arms",
        ),
        State(
            name="watching",
            timeout=StateTimeout(event="reprompt_timeout", setting="reprompt_after", default=10.0),
            description="the watchdog times the user's silence",
        ),
        State(
            name="exhausted",
            description="re-prompts used up: handed over (closing, or waiting for the user)",
        ),
        State(name="closed", final=True, description="the session closed"),
    ),
    events=EVENTS,
    guards=("avatar_joined", "audio_at_avatar", "watchdog_on", "user_listening", "reprompts_left"),
    effects=(
        Effect(name="playout_done", description="log and report the end of playout, its cause"),
        Effect(
            name="finish_playout",
            description="no report in time: end the sink's segments locally (no RPC), log why",
        ),
        Effect(name="reprompt", description="count it and call the re-prompt (generate_reply)"),
        Effect(name="reset_reprompts", description="the user answered: the count starts again"),
        Effect(name="hand_over", description="close the session with the reason, or wait"),
    ),
    rows=(
        *row(REST, "speech_created", "agent_turn"),
        *row(REST, "agent_thinking", "agent_turn"),
        *row(REST, "agent_speaking", "agent_turn"),
        *row(["agent_turn", *REST], "handed_off", "remote_playout", guards=["avatar_joined"]),
        *row(["agent_turn", *REST], "handed_off", None),  # room audio: the SDK reports its end
        # the next segment, or the cut: the bound is computed again from it
        *row("remote_playout", "handed_off", "remote_playout"),
        *row("remote_playout", "interrupted", "remote_playout"),
        # cut before the hand-off: the avatar's word on the cut is awaited, bounded
        *row("agent_turn", "interrupted", "remote_playout", guards=["avatar_joined"]),
        *row("agent_turn", "interrupted", None),
        # audio its sink took before it joined (the plugin's start had not returned, or the
        # avatar was still routing): what it plays from its join is awaited, bounded
        *row("agent_turn", "avatar_joined", "remote_playout", guards=["audio_at_avatar"]),
        *row("agent_turn", "avatar_joined", None),
        # one report ends one segment (the SDK counts them): while another ended segment
        # waits for its own, so does the turn, under the bound it has
        *row("remote_playout", "playback_finished", None, guards=["audio_at_avatar"]),
        *_ends(),
        *row("settling", "window_elapsed", "watching"),
        *row(
            "watching",
            "reprompt_timeout",
            "settling",
            guards=["reprompts_left"],
            effects=["reprompt"],
        ),
        *row("watching", "reprompt_timeout", "exhausted", effects=["hand_over"]),
        *row([*QUIET, "exhausted"], "user_speaking", "idle", effects=["reset_reprompts"]),
        *row([*QUIET, "exhausted"], "user_left", "idle", effects=["reset_reprompts"]),
        # the user who answers over the agent (or leaves) answered too: the count starts
        # again; playout goes on, and its end reads the user
        *row(["idle", *TURN], "user_speaking", None, effects=["reset_reprompts"]),
        *row(["idle", *TURN], "user_left", None, effects=["reset_reprompts"]),
        *row(LIVE, "close", "closed"),
    ),
    ignore=(
        *cells(TURN, "speech_created", "a queued turn: the current one is not done"),
        *cells("agent_turn", ["agent_thinking", "agent_speaking"], "already in a turn"),
        # "speaking" comes once the first frame is out, often after all of a short segment
        # was pushed; "thinking" can start the next reply while a cut segment is still at
        # the avatar (whose sink takes no new audio until it settles)
        *cells(
            "remote_playout",
            ["agent_thinking", "agent_speaking", "speech_done"],
            "the avatar's report, the bound or the SDK's own playout report decide",
        ),
        *cells(REST, "speech_done", "no turn to end"),
        *cells(REST, "agent_listening", "no turn to end"),
        *cells(["agent_turn", *REST], "playback_finished", "not waiting for the avatar"),
        *cells(REST, "interrupted", "nothing of the agent's is playing"),
        *cells(["agent_turn", *REST], "avatar_left", "not waiting for the avatar"),
        *cells(["remote_playout", *REST], "avatar_joined", "no turn's audio waits for it"),
        *cells(["agent_turn", *REST], "playout_timeout", "a stale timer"),
        *cells(["idle", *TURN, "watching", "exhausted"], "window_elapsed", "a stale timer"),
        *cells(["idle", *TURN, "settling", "exhausted"], "reprompt_timeout", "a stale timer"),
        *cells("closed", EVENTS, "closed"),
    ),
)

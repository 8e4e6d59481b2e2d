"""The retry policy at work for one avatar lifecycle: the restarts made so far, what ended
the last attempt, and what the log policy (docs/guide/reliability.md) says of each: an
attempt lost, the agent on room audio, is a WARNING (naming the job and the machine); a
restart, and an attempt given up and closed, an INFO line."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from livekit.agents.voice.avatar import AvatarSession

from agent_runtime.settings import AvatarRetry

logger = logging.getLogger("agent_runtime.avatar")

# ``Actor.report``: (logger, level, msg, *args, event=...), the line naming job and machine
Report = Callable[..., None]


class Attempts:
    """One lifecycle's attempts under its ``AvatarRetry`` policy."""

    __slots__ = ("_report", "cause", "made", "plugin", "policy", "retired", "retirements")

    def __init__(
        self,
        policy: AvatarRetry,
        avatar: AvatarSession[Any],
        report: Report,
    ) -> None:
        self.policy = policy
        self.made = 0  # restarts made so far
        self.cause = ""  # what ended the last attempt
        # the avatar participant (its sid) a retirement asked to remove, or "" for none:
        # one still there after it is not a late avatar to retire again
        self.retired = ""
        self.retirements = 0  # the first closes the attempt; a later one a late avatar's
        self.plugin = avatar  # the current attempt's
        self._report = report

    def say_lost(self, *, silent: bool = False) -> None:
        """The attempt that ``cause`` ended is lost, its route put back (``silent``: the
        session had no audio output to go back to)."""
        cause = self.cause
        retrying = self.policy.retries(cause, self.made)
        self._report(
            logger,
            logging.WARNING,
            "the avatar is gone (%s, attempt %d of %d); %s%s",
            cause,
            self.made + 1,
            self.policy.attempts + 1,
            "the session has no audio output (none before the avatar's either)"
            if silent
            else "the agent is on room audio",
            " until the next attempt" if retrying else " (gave up)" if self.made else "",
            event=cause,
        )

    def restart(self) -> None:
        """A retry's release begins: one restart more."""
        self.made += 1
        self._report(
            logger,
            logging.INFO,
            "starting the plugin again (attempt %d of %d) after %s",
            self.made,
            self.policy.attempts,
            self.cause,
        )

    def retire(self, sid: str) -> None:
        """An attempt given up for good (no retry left, no rejoin) is closed: no restart.
        ``sid``: its avatar participant's, if it is in the room."""
        self.retired = sid
        self.retirements += 1
        if self.retirements > 1:
            self._report(
                logger,
                logging.INFO,
                "the avatar joined after its attempt was given up (%s), no rejoin: removing "
                "it from the room",
                self.cause,
            )
            return
        self._report(
            logger,
            logging.INFO,
            "given up after %s, no rejoin: closing its plugin session and removing it from "
            "the room",
            self.cause,
        )

"""One definition of each setting's valid range: a bad value is refused with its name, the
defaults are livekit-agents' own."""

from __future__ import annotations

import math
from typing import Any

import pytest
from livekit import rtc
from livekit.agents.job import DEFAULT_PARTICIPANT_KINDS
from livekit.agents.voice.room_io.types import DEFAULT_CLOSE_ON_DISCONNECT_REASONS
from pydantic import BaseModel

from agent_runtime.settings import (
    AvatarRetry,
    Backoff,
    PlayoutOptions,
    SettingError,
    SettingTypeError,
    check_setting,
    job_settings,
)


def test_defaults_are_livekit_agents_own() -> None:
    s = job_settings()
    assert set(s.participant_kinds) == {
        rtc.ParticipantKind.Name(k).removeprefix("PARTICIPANT_KIND_").lower()
        for k in DEFAULT_PARTICIPANT_KINDS
    }
    assert set(s.closing_reasons) == {
        rtc.DisconnectReason.Name(r) for r in DEFAULT_CLOSE_ON_DISCONNECT_REASONS
    }
    assert (s.session_end_timeout, s.close_on_disconnect, s.delete_room_on_close) == (
        300.0,
        True,
        False,
    )


@pytest.mark.parametrize(
    ("values", "error", "match"),
    [
        ({"grace_period": -1}, SettingError, r"grace_period: .*>= 0|greater than or equal"),
        ({"grace_period": math.inf}, SettingError, "grace_period: input should be a finite"),
        ({"join_timeout": 0}, SettingError, "join_timeout: input should be greater than 0"),
        (
            {"retry_avatar": {"backoff": {"initial": math.inf}}},
            SettingError,
            "retry_avatar.backoff.initial: input should be a finite",
        ),
        ({"retry_avatar": {"attempts": 1.5}}, SettingError, "retry_avatar.attempts"),
        ({"retry_avatar": {"transient": ["sometimes"]}}, SettingError, "retry_avatar.transient"),
        ({"retry_avatar": "yes"}, SettingTypeError, "retry_avatar"),
        ({"close_timeout": 0}, SettingError, "close_timeout"),
        ({"session_end_timeout": math.nan}, SettingError, "session_end_timeout"),
        ({"join_timeout": "30"}, SettingTypeError, "join_timeout: input should be a valid number"),
        ({"grace_period": True}, SettingTypeError, "grace_period"),
        ({"delete_room_on_close": "yes"}, SettingTypeError, "delete_room_on_close"),
        ({"participant_identity": ""}, SettingError, "participant_identity"),
        ({"participant_kinds": ["robot"]}, SettingError, "unknown participant kind 'robot'"),
        ({"participant_kinds": []}, SettingError, "empty"),
        ({"participant_kinds": "sip"}, TypeError, "collection"),
        ({"participant_kinds": None}, TypeError, "collection of kinds, not None"),
        ({"closing_reasons": None}, TypeError, "collection of reasons, not None"),
        (
            {"retry_avatar": {"backoff": {"initial": 20, "max": 1}}},
            SettingError,
            r"retry_avatar.backoff: .*initial \(20 s\) is above max \(1 s\)",
        ),
        ({"retry_avatar": {"backoff": {"initial": 45}}}, SettingError, "above max \\(30 s\\)"),
        ({"closing_reasons": ["LEFT"]}, SettingError, "unknown disconnect reason 'LEFT'"),
        ({"grace": 3}, SettingError, "unknown setting 'grace'"),
        ({"playout": {"margin": -0.5}}, SettingError, "playout.margin"),
        ({"playout": {"margin": math.inf}}, SettingError, "playout.margin"),
        ({"playout": {"reprompt_after": 0}}, SettingError, "playout.reprompt_after"),
        ({"playout": {"max_reprompts": 11}}, SettingError, "playout.max_reprompts"),
        ({"playout": {"max_reprompts": 1.5}}, SettingError, "playout.max_reprompts"),
        ({"playout": {"reprompt_instructions": ""}}, SettingError, "playout.reprompt_instr"),
        ({"playout": {"when_exhausted": "hang_up"}}, SettingError, "playout.when_exhausted"),
        ({"playout": {"close_reason": "bored"}}, SettingError, "playout.close_reason"),
        ({"playout": {"reprompt": "yes"}}, SettingError, "playout.reprompt"),
        ({"playout": "on"}, SettingTypeError, "playout"),
    ],
)
def test_a_bad_value_is_refused_naming_the_setting(
    values: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        job_settings(**values)


def test_kinds_and_reasons_by_value_or_name() -> None:
    s = job_settings(
        participant_kinds=[rtc.ParticipantKind.PARTICIPANT_KIND_SIP, "STANDARD", "sip"],
        closing_reasons=["client_initiated", rtc.DisconnectReason.SIGNAL_CLOSE],
    )
    assert s.participant_kinds == ("sip", "standard")
    assert s.closing_reasons == ("CLIENT_INITIATED", "SIGNAL_CLOSE")
    assert check_setting("grace_period", 2) == 2.0


def test_the_session_close_bound_is_livekit_agents_own() -> None:
    """livekit-agents gives ``AgentSession.aclose()`` 60 s at job shutdown; a link that
    closes the session gives it the same before it gives up (issue 13 item 2)."""
    from livekit.agents.ipc.job_proc_lazy_main import _SESSION_ACLOSE_TIMEOUT

    from statemachines.participant import PARTICIPANT

    closing = PARTICIPANT.state("closing").timeout
    assert closing is not None and closing.setting == "session_close_timeout"
    assert job_settings().session_close_timeout == closing.default == _SESSION_ACLOSE_TIMEOUT


def test_playout_is_off_unless_asked_and_true_means_its_defaults() -> None:
    assert job_settings().playout is None
    assert job_settings(playout=False).playout is None
    on = job_settings(playout=True).playout
    assert on is not None and (on.margin, on.reprompt, on.max_reprompts) == (2.0, False, 2)
    assert check_setting("playout", {"reprompt": True}).reprompt is True


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"retry_avatar": {"attempts": "x"}},
            "retry_avatar.attempts: input should be a valid integer (got 'x')",
        ),
        (
            {"retry_avatar": {"attempts": 2, "backoff": {"initial": "soon"}}},
            "retry_avatar.backoff.initial: input should be a valid number (got 'soon')",
        ),
        (
            {"playout": {"reprompt": True, "margin": -0.5}},
            "playout.margin: input should be greater than or equal to 0 (got -0.5)",
        ),
        ({"grace_period": -1}, "grace_period: input should be greater than or equal to 0 (got -1)"),
        # a trial: accepted, the link then waited for a participant nobody is
        (
            {"participant_identity": "  "},
            "participant_identity: string should have at least 1 character other than "
            "whitespace (got '  ')",
        ),
        # a new user's try: the whole 100,000 characters were the message
        (
            {"grace_period": "9" * 100_000},
            "grace_period: input should be a valid number (got '" + "9" * 56 + "...)",
        ),
    ],
    ids=["retry-field", "nested-field", "playout-field", "top-level", "blank-identity", "long"],
)
def test_a_bad_field_shows_its_own_value(values: dict[str, Any], message: str) -> None:
    """A bad field inside a mapping showed the whole mapping, ``(got {'attempts': 'x'})``;
    the message names the field and shows that field's value."""
    with pytest.raises(SettingError) as raised:
        job_settings(**values)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (
            lambda: PlayoutOptions(margin=-1),
            SettingError,
            "playout.margin: input should be greater than or equal to 0 (got -1)",
        ),
        (
            lambda: PlayoutOptions(bogus=1),
            SettingError,
            "playout.bogus: extra inputs are not permitted (got 1)",
        ),
        (
            lambda: AvatarRetry(attempts="x"),
            SettingTypeError,
            "retry_avatar.attempts: input should be a valid integer (got 'x')",
        ),
        (
            lambda: AvatarRetry(backoff={"initial": -1}),
            SettingError,
            "retry_avatar.backoff.initial: input should be greater than 0 (got -1)",
        ),
        (
            lambda: Backoff(initial=50, max=10),
            SettingError,
            "retry_avatar.backoff: initial (50 s) is above max (10 s): raise max or lower "
            "initial (got {'initial': 50, 'max': 10})",
        ),
    ],
)
def test_a_setting_model_built_directly_refuses_a_bad_field_as_agent_job_does(
    build: Any, error: type[Exception], message: str
) -> None:
    # it was pydantic's ValidationError, naming neither the setting nor as AgentJob does
    with pytest.raises(error) as e:
        build()
    assert type(e.value) is error and str(e.value) == message


def test_the_setting_models_stay_pydantic_models_and_nested_errors_keep_their_place() -> None:
    assert issubclass(PlayoutOptions, BaseModel) and issubclass(AvatarRetry, BaseModel)
    assert PlayoutOptions.model_validate({"margin": 1}) == PlayoutOptions(margin=1.0)
    # given to a job, the same value is named the same way, from the job's settings
    with pytest.raises(SettingError) as e:
        job_settings(playout={"margin": -1})
    assert str(e.value) == "playout.margin: input should be greater than or equal to 0 (got -1)"

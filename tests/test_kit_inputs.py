"""What a test hands the testing kit's own stand-ins is checked as the runtime's options
are: ``VirtualClock.advance`` refuses a duration that is no finite number of seconds
(``NaN`` stopped the clock for good, a negative one was skipped without a word, a string
was a ``TypeError`` from an addition), naming ``advance``; and nothing moves."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agent_runtime.testing.clock import VirtualClock


@pytest.mark.parametrize(
    ("seconds", "error", "message"),
    [
        (math.nan, ValueError, "advance takes a finite number of seconds, at least 0, not nan"),
        (math.inf, ValueError, "advance takes a finite number of seconds, at least 0, not inf"),
        (-3, ValueError, "advance takes a finite number of seconds, at least 0, not -3"),
        ("x", TypeError, "advance takes a number of seconds, not str"),
        (True, TypeError, "advance takes a number of seconds, not bool"),
        (None, TypeError, "advance takes a number of seconds, not NoneType"),
    ],
)
async def test_advance_refuses_what_is_no_duration_naming_it_and_time_stays(
    seconds: Any, error: type[Exception], message: str
) -> None:
    clock = VirtualClock()
    await clock.advance(5)
    fired: list[float] = []
    clock.call_later(5, lambda: fired.append(clock.now()))
    with pytest.raises(error) as e:
        await clock.advance(seconds)
    assert str(e.value) == message
    assert clock.now() == 5.0 and fired == []  # nothing moved, nothing fired
    await clock.advance(10)  # and the clock still runs: its timer fires on time
    assert (clock.now(), fired) == (15.0, [10.0])


async def test_advance_by_zero_settles_and_run_until_a_past_time_is_still_fine() -> None:
    clock = VirtualClock()
    await clock.advance(2.5)
    await clock.advance(0)
    await clock.run_until(1)  # already past: only settles
    assert clock.now() == 2.5
    with pytest.raises(ValueError, match=r"^run_until takes a finite number of seconds, not nan$"):
        await clock.run_until(math.nan)
    assert clock.now() == 2.5

"""tests/conftest.py's check that no task's failure is left unread."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest


async def _boom() -> None:
    raise ValueError("boom")


async def test_a_failed_task_whose_failure_was_read_is_not_kept_to_the_tests_end() -> None:
    """Every failed task was held until the test's end, read or not: with it the frames
    its traceback holds (a fuzz test's every run: that file ran a fifth slower), and a
    test that counts on an object being collected failed for the check's sake."""
    first = asyncio.create_task(_boom())
    with pytest.raises(ValueError, match="boom"):
        await first
    gone = weakref.ref(first)
    del first
    second = asyncio.create_task(_boom())
    with pytest.raises(ValueError, match="boom"):
        await second
    gc.collect()
    assert gone() is None

"""``Inbox``: a queue with one reader that holds nothing while it is empty.

Every job keeps a few queues that almost never carry anything (session requests come from a
simulator, if at all). An ``asyncio.Queue`` is three deques and an event, about 3 KiB each,
for the whole life of the job; an ``Inbox`` is two slots, a deque only while items wait and
one future only while its reader waits.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Inbox(Generic[T]):
    """``put_nowait`` never waits; ``get`` waits for the next item. One reader at a time."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[T] | None = None
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: T) -> None:
        if self._items is None:
            self._items = deque()
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def get_nowait(self) -> T:
        """The next item; ``asyncio.QueueEmpty`` when there is none."""
        items = self._items
        if not items:
            raise asyncio.QueueEmpty
        item = items.popleft()
        if not items:
            self._items = None
        return item

    async def get(self) -> T:
        while not self._items:
            if self._waiter is not None:
                raise RuntimeError("an Inbox has one reader; another is already waiting")
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None
        return self.get_nowait()

    def empty(self) -> bool:
        return not self._items

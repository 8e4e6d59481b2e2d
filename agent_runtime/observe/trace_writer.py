"""The thread that writes a trace file, so that a file that takes no more (a FIFO whose
reader stopped reading, a stalled network mount) never blocks the event loop.

The loop hands it lines through a queue bounded in bytes: it never waits, and a full
queue is the writer's news that the file stopped taking them. The thread writes what is
queued in one go and flushes it (a write is a system call; nothing is kept in a buffer).
"""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import select
import sys
import threading
import time

POLL = 0.1  # real seconds a writer waiting for a pipe's reader looks whether to give up


class GaveUp(TimeoutError):
    """The file took no more lines before the close's bound: the writer stopped trying."""


class LineWriter:
    """Writes the lines it is given to the file descriptor ``fd`` (which it closes), in
    order, from a thread of its own.

    Each count has one writer (the caller's thread gives, the writer's thread writes), so
    none needs a lock; the queue is ``queue.SimpleQueue``, the cheapest hand-over there is.
    """

    def __init__(self, fd: int, name: str, limit: int) -> None:
        self._fd = fd
        self._limit = limit  # bytes that may wait to be written
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()  # None: close
        self._given = self._given_bytes = 0  # the caller's
        self.written = self._written_bytes = 0  # the thread's: lines (bytes) in the file
        self._closing = False
        self._give_up_at: float | None = None  # time.monotonic() after which it stops trying
        self.error: OSError | None = None  # the write that failed: the thread stopped there
        self._thread = threading.Thread(target=self._run, name=f"trace writer {name}")
        self._thread.daemon = True  # a file that never takes its lines keeps no process alive
        try:
            self._thread.start()
        except RuntimeError as e:  # the process's limit of threads: as a file not opened
            raise OSError(errno.EAGAIN, f"no thread to write it: {e}") from e

    def counts(self) -> tuple[int, int]:
        """(lines written, lines given and not written): a stopped writer's lost ones."""
        written = self.written
        return written, self._given - written

    def put(self, line: bytes) -> bool:
        """Queue ``line``; False, and nothing queued, if the queue is full."""
        waiting = self._given_bytes - self._written_bytes
        if waiting and waiting + len(line) > self._limit:
            return False
        self._given += 1
        self._given_bytes += len(line)
        self._queue.put(line)
        return True

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` real seconds for every line queued to be written (or the
        write to fail); whether it was (not if the write failed)."""
        deadline = time.monotonic() + timeout
        while self.written < self._given and self.error is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.001)  # the thread's, which is writing them
        return self.written == self._given

    def close(self, timeout: float) -> bool:
        """Write what is queued, waiting up to ``timeout`` real seconds, then stop and close
        the file; whether every line was written (if not, the thread gives up its write
        within ``POLL`` seconds, or once the file's system call returns)."""
        if not self._closing:
            self._closing = True
            self._give_up_at = time.monotonic() + timeout
            self._queue.put(None)
        self._thread.join(timeout + POLL if timeout > 0 else 0)
        return self.written == self._given

    def _run(self) -> None:
        try:
            closing = False
            while not closing:
                batch: list[bytes] = []
                line = self._queue.get()
                while line is not None:
                    batch.append(line)
                    try:
                        line = self._queue.get_nowait()
                    except queue.Empty:
                        break
                closing = line is None
                if not batch:
                    continue
                data = b"".join(batch)
                sent, error = self._write(data)
                done = len(batch) if error is None else _whole(batch, sent)
                self._written_bytes += sum(map(len, batch[:done])) if error else len(data)
                self.written += done
                if error is not None:  # the thread stops: what waits is lost
                    self.error = error
                    return
        finally:
            with contextlib.suppress(OSError):
                os.close(self._fd)

    def _write(self, data: bytes) -> tuple[int, OSError | None]:
        """(bytes written, the error that stopped the write or None)."""
        sent, full, view = 0, False, memoryview(data)
        while sent < len(data):
            # the close's bound is past: not one more write (close() counted the lost)
            if self._give_up_at is not None and time.monotonic() >= self._give_up_at:
                return sent, GaveUp("the file took no more lines before the close's bound")
            try:
                if full:
                    _wait_writable(self._fd, POLL)
                sent += os.write(self._fd, view[sent:])
                full = False
            except BlockingIOError:  # a pipe full: its reader has not read it yet
                full = True
            except OSError as e:
                return sent, e
        return sent, None


def _wait_writable(fd: int, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for ``fd`` to take more (a pipe's reader read)."""
    if hasattr(select, "poll") and sys.platform != "darwin":  # macOS's fails on devices
        # any descriptor: select() takes only those below FD_SETSIZE (1024), and a busy
        # worker's trace file may be above
        waiting = select.poll()
        waiting.register(fd, select.POLLOUT)
        waiting.poll(timeout * 1000)
        return
    try:
        select.select([], [fd], [], timeout)
    except ValueError:  # a descriptor select() cannot take: look again after the wait
        time.sleep(timeout)


def _whole(lines: list[bytes], sent: int) -> int:
    """How many of ``lines`` the first ``sent`` bytes of their concatenation hold whole."""
    n = 0
    for line in lines:
        sent -= len(line)
        if sent < 0:
            break
        n += 1
    return n

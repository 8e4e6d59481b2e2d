"""Reading an input file (a scenario, a trace) so that no file can hang or swamp the reader.

Only a regular file is read: a FIFO would block until someone writes to it, ``/dev/zero``
never ends, a directory is no input. The file is opened without blocking (a FIFO then opens
at once and is refused) and read up to a size bound.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

# the size bounds; a test may lower them
MAX_SCENARIO_BYTES = 8 * 1024 * 1024  # some 100,000 steps
MAX_TRACE_BYTES = 64 * 1024 * 1024  # some 200,000 records: days of one job

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, by its ``st_mode`` ("a FIFO", ...)."""
    return next((name for test, name in _KINDS if test(mode)), "a special file")


class InputFileError(ValueError):
    """The file cannot be read as input; the message says why (without the path)."""


def read_input(path: str | Path, *, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Raises ``InputFileError`` naming the reason: it cannot be opened, it is not a regular
    file, or it is larger than ``limit`` (``what`` names the kind of file in that message).
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise InputFileError(e.strerror or str(e)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputFileError(f"{file_kind(mode)}, not a regular file")
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        size = 0
        while size <= limit:  # a file may grow while it is read: count, do not trust stat
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise InputFileError(f"larger than {limit:,} bytes, the limit for {what}")
        return b"".join(chunks)
    except OSError as e:
        raise InputFileError(e.strerror or str(e)) from None
    finally:
        os.close(fd)

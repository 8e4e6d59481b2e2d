"""Let a process that used livekit's native runtime exit without aborting.

livekit's FFI forwards its Rust log records to Python from a runtime thread, through a
ctypes callback, and logs one more record as it is disposed at exit. When that callback
is still waiting for the GIL as the interpreter starts finalizing, CPython ends the
thread with ``pthread_exit``; the unwind cannot cross the FFI's ``extern "C"`` frame and
the process aborts (SIGABRT) after a run that passed. It is rare and load-dependent, and
a test run or a command that exits with 134 is a failure to whoever ran it.

``release_at_exit()`` asks, once the work is done, that the runtime stop sending its logs
to Python (its records go to the FFI's own stderr logger instead: errors by default, more
if ``RUST_LOG`` asks) and be disposed while the interpreter is still whole: registered
after livekit's own exit hook, it runs before it, and livekit's then finds the runtime
disposed. A process that never touched the FFI is left alone. The private names of
``livekit.rtc``'s FFI client (1.1.x) are read here, and only here; an SDK without them
leaves livekit's own exit as it is.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from livekit.rtc._ffi_client import FfiClient

logger = logging.getLogger(__name__)
_IN_FLIGHT = 0.01  # seconds: a callback under way needs microseconds once it has the GIL


def release_at_exit() -> None:
    """Register the release for this process's exit if livekit's native runtime is live."""
    if _live_client() is not None:
        # atexit runs last-registered first: this runs before livekit's own dispose hook
        # (and once, however often a process asks: a CLI run in-process by tests)
        atexit.unregister(release)
        atexit.register(release)


def release() -> None:
    """Stop log forwarding, then dispose the native runtime (idempotent)."""
    client = _live_client()
    if client is None:
        return
    try:
        from livekit.rtc import __version__
        from livekit.rtc._ffi_client import ffi_event_callback

        # initializing again with capture_logs off keeps the event callback and sends the
        # runtime's own records, the dispose's included, to its logger instead of to Python
        client._ffi_lib.livekit_ffi_initialize(
            ffi_event_callback, False, b"python", __version__.encode("ascii")
        )
        client._dispose()
    except (AttributeError, ImportError, OSError) as e:  # an SDK laid out otherwise
        logger.debug("livekit's native runtime left to its own exit hook: %s", e)
        return
    # a callback the runtime began before the switch (it copies the callback, then calls
    # it) may wait for the GIL: let it go by before the interpreter finalizes
    time.sleep(_IN_FLIGHT)


def _live_client() -> FfiClient | None:
    try:
        from livekit.rtc._ffi_client import FfiClient
    except ImportError:
        return None
    client: FfiClient | None = getattr(FfiClient, "_instance", None)
    if client is None or getattr(FfiClient, "_ffi_disposed", True):
        return None
    return client if getattr(client, "_pid", None) == os.getpid() else None

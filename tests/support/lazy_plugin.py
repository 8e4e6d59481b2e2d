"""A livekit plugin package's import, as ``livekit.plugins.bey``'s: importing it registers a
``Plugin``, which livekit allows on the main thread only. ``planted.lazy_plugin_server``
imports it inside its entrypoint, as ``examples/testing/my_agent.py`` imports bey."""

from __future__ import annotations

from livekit.agents import Plugin


class LazyPlugin(Plugin):
    def __init__(self) -> None:
        super().__init__("lazy", "0.0.1", "tests.support.lazy_plugin")


Plugin.register_plugin(LazyPlugin())

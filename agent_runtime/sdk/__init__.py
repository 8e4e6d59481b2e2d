"""The adapter to livekit-agents: the one place livekit's and asyncio's private names are
read, and the session transport the host answers on."""

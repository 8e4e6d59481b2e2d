"""The adapter to livekit-agents: the one place its private names are read, and the
session transport the host answers on."""

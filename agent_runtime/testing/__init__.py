"""The testing kit, for people testing their own agents: virtual time (``clock``), the
embedded in-memory room, the scripted avatar plugin, scenario files (model, runner,
expectations) and session-request builders. Nothing in the production runtime imports it."""

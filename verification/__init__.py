"""The project's own verification of its machines: the exhaustive exploration of the
composed job (``explore``), the conformance replay of the model's paths through a real
``AgentJob`` (``conformance``) and the behaviour-only mutation score (``mutation``).

A dev folder, not part of the installed package: users never run these (they check this
project's machines, not an agent), so the wheel leaves them out. ``python3 dev.py
explore|conformance|mutation`` runs them, as do the tests; nothing in ``agent_runtime`` or
``statemachines`` imports them (``tests/test_layers.py``).
"""

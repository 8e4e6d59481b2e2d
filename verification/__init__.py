"""The project's own verification of its machines: the real job explored, breadth first
and by seeded walks (``explore``), and the behaviour-only mutation score (``mutation``).

A dev folder, not part of the installed package: users never run these (they check this
project's machines, not an agent), so the wheel leaves them out. ``python3 dev.py
explore|mutation`` runs them, as do the tests; nothing in ``agent_runtime`` or
``statemachines`` imports them (``tests/test_layers.py``).
"""

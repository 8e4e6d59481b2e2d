"""The real job explored: a real ``AgentJob`` (``harness``), driven one input at a time
(``real``, with the inputs ``real_inputs`` reads from the system and its stand-ins), searched
breadth first or by seeded walks (``realsearch``), each run checked against the invariants
(``agent_runtime.testing.invariants``); a counterexample as a scenario file
(``toscenario``). The playout machine's own table is explored against an abstract world
(``playout``), and path coverage for one machine is planned from its spec (``paths``)."""

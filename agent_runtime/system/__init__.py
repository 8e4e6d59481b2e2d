"""The job as one declared system: the composition (``JobSystem``), its front
(``AgentJob``), the delivery of room facts and links, and the teardown runner."""

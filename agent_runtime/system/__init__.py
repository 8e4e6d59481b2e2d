"""The job as one declared system: the composition (``JobSystem``) and its front
(``AgentJob``); what it delivers with (room facts, the wiring of links, the teardown
runner) is in ``runtimes``, which every runtime uses too."""

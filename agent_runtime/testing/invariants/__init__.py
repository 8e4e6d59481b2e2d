"""The invariants of a composed job, written once over one view of it (``view.JobView``):
the explorer checks its model's worlds and the real job with them, the property tests and
the conformance replay the real ``AgentJob``, and a scenario's ``expect: invariants`` the
job ``agent-runtime simulate`` runs (``observe.runtime_view`` builds the view of a real
job)."""

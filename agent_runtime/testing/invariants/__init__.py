"""The invariants of a composed job, written once over one view of it (``view.JobView``):
the explorer of the real job and the property tests check a real ``AgentJob`` with them,
and a scenario's ``expect: invariants`` the job ``agent-runtime simulate`` runs
(``observe.runtime_view`` builds the view of a real job)."""

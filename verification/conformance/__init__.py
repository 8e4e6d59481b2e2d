"""Conformance of the real runtime to the explorer's model (as xstate-graph's
``TestModel.testPath`` does): event paths generated from the model (``paths``) are driven
through a real ``AgentJob`` (``harness``; what it observes and the job's ``JobView`` in
``observe``), and after every step the model's view of the job and the runtime's must agree
(``replay``); ``suite`` generates every path, replays them and reports the rows covered."""

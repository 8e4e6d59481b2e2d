"""The behaviour-only mutation score of the machines: which one-cell changes do the tests
that assert behaviour notice?

    python3 dev.py mutation                # every machine (hours)
    python3 dev.py mutation --props-examples 50 --explore-depth 1  # less
    python3 dev.py mutation --machine job --json out.json
    python3 dev.py mutation --system       # the mutants of the system between them

Every single-cell change of every machine in ``statemachines.machines.MACHINES`` is built
(``mutants``); one the spec model refuses cannot load and is not counted. Each other one
is swapped in for the real spec (``swap``) and judged by the behaviour tests alone
(``worker``):

* the suite without the tests marked ``snapshot`` — the golden tables, the hand-written
  per-cell tables, and the paths and counterexamples derived from the specs as written,
  which catch any cell change by construction — and without the tests of the explorer's
  command and of its planted faults, and this tool's own tests: what is left are the
  scenario files with their ``expect`` blocks, the runtime and lifecycle tests, the
  property tests, the explorer's other tests on the real job;
* the exploration of the real job with the mutant in force (``explored``: from the
  shortest runs that decided the mutant's cell on the machines as written, breadth first
  ``--explore-depth`` inputs further and a few walks; a system mutant on every config) and
  its invariants; for the playout machine its table explored against its world instead
  (``verification.explore.playout``).

Only the tests in which an actor decided the changed cell run (recorded once, on the
unchanged specs): a test that never reaches the cell runs as before. A mutant nothing
notices survives, unless ``equivalent`` argues that no one could notice it.

``--system`` judges the mutants of the system instead (``system``: a link fired before its
effect, teardown steps swapped, a watch, link or route removed, ...), each by the same
behaviour tests, those that reach the part it changes (``system_run``).
"""

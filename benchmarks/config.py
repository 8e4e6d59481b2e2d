"""Sizes of one benchmark run. The defaults are the published table; tests use ``tiny()``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Config:
    events: int = 10_000  # events per dispatch run
    repeats: int = 9  # runs (rounds) per figure; the median is reported
    machine: str = "participant"  # the dispatch workload (see dispatch.WORKLOADS)
    jobs: tuple[int, ...] = (1_000, 10_000)  # live jobs per footprint and composed-job run
    import_runs: int = 11  # fresh interpreters per import figure
    job_repeats: int = 3  # fresh processes per composed-job CPU figure (10,000 take minutes)

    def __post_init__(self) -> None:
        if min(self.events, self.repeats, self.import_runs, self.job_repeats) < 1:
            raise ValueError("events, repeats, import_runs and job_repeats must be at least 1")
        if not self.jobs or any(n < 1 for n in self.jobs):
            raise ValueError("jobs must be one or more positive counts")

    @classmethod
    def tiny(cls) -> Config:
        """A run that only proves the code works: seconds, not figures."""
        return cls(events=60, repeats=1, jobs=(3, 30), import_runs=1, job_repeats=1)

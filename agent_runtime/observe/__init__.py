"""Observation: the trace, OpenTelemetry, ``snapshot()`` and bounded input files."""

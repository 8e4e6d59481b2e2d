"""The runtime's cost beside the alternatives: ``python -m benchmarks`` prints one table
and writes it to ``benchmarks/results/latest.json``."""

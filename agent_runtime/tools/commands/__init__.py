"""One module per CLI command, each with ``run(args) -> exit code``."""

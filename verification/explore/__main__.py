"""``python -m verification.explore`` (what ``python3 dev.py explore`` runs)."""

from __future__ import annotations

import sys

from verification.explore.command import main

# guarded: the explorer's worker processes are spawned, and spawn imports the main module
# again in each of them
if __name__ == "__main__":
    sys.exit(main())

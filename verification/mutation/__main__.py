"""``python -m verification.mutation`` (what ``python3 dev.py mutation`` runs): the
behaviour-only mutation score."""

from __future__ import annotations

import sys

from verification.mutation.run import main

sys.exit(main())

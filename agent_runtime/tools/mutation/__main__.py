"""``python -m agent_runtime.tools.mutation``: the behaviour-only mutation score."""

from __future__ import annotations

import sys

from agent_runtime.tools.mutation.run import main

sys.exit(main())

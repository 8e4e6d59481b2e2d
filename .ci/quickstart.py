"""Run the README's quick start where the package is installed (``.ci/wheel``, from a
wheel in a clean virtual environment; ``tests/test_docs.py``, from the source tree).

    python quickstart.py README.md EXTRAS        # EXTRAS: "", "tools", "testing,tools", ...

The blocks it runs follow a marker in the README:

- ``<!-- quickstart: file NAME [EXTRA] -->``: the block is written to ``NAME`` in the
  current directory; a Python file is then imported, so it must import cleanly;
- ``<!-- quickstart: run [EXTRA] -->``: the block's lines run in bash (``set -e``);
- ``<!-- quickstart: install -->``: the install commands, skipped (the package is already
  installed), but each extra they name (``livekit-agent-fsm[X]`` or, from a clone,
  ``.[X]``) must exist.

A block marked with an extra runs only when that extra is installed. Then
``agent-runtime --version`` must print the installed distribution's version. Standard
library only.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

MARKER = re.compile(
    r"<!-- quickstart: (?P<kind>file|run|install)(?: (?P<name>[\w./-]+))?"
    r"(?: \[(?P<extra>\w+)\])? -->\n```[\w-]*\n(?P<body>.*?)```",
    re.S,
)
DIST = "livekit-agent-fsm"


def blocks(readme: str) -> list[tuple[str, str | None, str | None, str]]:
    found = [(m["kind"], m["name"], m["extra"], m["body"]) for m in MARKER.finditer(readme)]
    if not found:
        sys.exit("quickstart: no <!-- quickstart: ... --> block in the README")
    return found


def bash(script: str) -> None:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    print(f"$ {script.strip()}", flush=True)
    subprocess.run(["bash", "-euo", "pipefail", "-c", script], check=True, env=env)


def main(readme_path: str, extras_arg: str) -> int:
    extras = {e for e in extras_arg.split(",") if e}
    provided = set(importlib.metadata.metadata(DIST).get_all("Provides-Extra") or [])
    ran = 0
    for kind, name, extra, body in blocks(Path(readme_path).read_text(encoding="utf-8")):
        if kind == "install":
            # by name, or from a clone (`.[tools]`) while the package is not published
            for named in re.findall(rf"(?:{DIST}|\.)\[([\w,]+)\]", body):
                missing = set(named.split(",")) - provided
                assert not missing, f"the README installs unknown extras {missing}"
            continue
        if extra is not None and extra not in extras:
            continue
        if kind == "file":
            assert name is not None, "a quickstart file block needs a name"
            Path(name).write_text(body, encoding="utf-8")
            print(f"wrote {name}", flush=True)
            if name.endswith(".py"):
                bash(f"python -c 'import {Path(name).stem}'")
        else:
            bash(body)
        ran += 1
    # the installed command reports the version the package metadata has (one source)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "agent-runtime"), "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    version = importlib.metadata.version(DIST)
    assert done.stdout.split() == ["agent-runtime", version], done.stdout
    print(f"quick start: {ran} blocks ran (extras: {', '.join(sorted(extras)) or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""))

"""MkDocs hooks: the machine pages and the changelog, generated at build time.

Each machine in ``statemachines.machines.MACHINES`` gets ``machines/NAME.md`` (its diagram,
committed in ``diagrams/``, and its whole state x event table, rendered from the spec), so
a machine added to the list gets its page and its nav entry with no edit here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

from agent_runtime.tools.render import markdown_table, routing_markdown
from statemachines.machines import MACHINES

ROOT = Path(__file__).resolve().parent.parent


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    pages: list[Any] = [{"Overview": "machines/index.md"}]
    pages += [{name: f"machines/{name}.md"} for name in MACHINES]
    nav = config.nav or []
    for i, item in enumerate(nav):
        if isinstance(item, dict) and item.get("Machines") == "machines/index.md":
            nav[i] = {"Machines": pages}
    return config


def _index() -> str:
    lines = [
        "# The machines",
        "",
        "Every machine of the runtime, generated from its spec in `statemachines/`: each page "
        "has the diagram (drawn by `agent-runtime diagrams`) and the whole state x "
        "event table. `agent-runtime table NAME` prints the same table in a terminal and "
        "`agent-runtime export xstate NAME` writes the machine for XState "
        "([XState](../guide/xstate.md)).",
        "",
        "| machine | what it is | initial | states | events |",
        "|---|---|---|---|---|",
    ]
    for name, spec in MACHINES.items():
        lines.append(
            f"| [{name}]({name}.md) | {spec.description} | `{spec.initial}` | "
            f"{len(spec.states)} | {len(spec.events)} |"
        )
    return "\n".join([*lines, "", *routing_markdown(), ""])


def _machine(name: str) -> str:
    table = markdown_table(MACHINES[name])
    head, sep, rest = table.partition("\n## ")
    picture = f"## Diagram\n\n[![the {name} machine]({name}.svg)]({name}.svg)\n\n"
    if not (ROOT / "diagrams" / f"{name}.svg").is_file():
        picture = ""
    return head + "\n" + picture + sep.lstrip("\n") + rest


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, "machines/index.md", content=_index()))
    for name in MACHINES:
        files.append(File.generated(config, f"machines/{name}.md", content=_machine(name)))
        svg = ROOT / "diagrams" / f"{name}.svg"
        if svg.is_file():
            files.append(File.generated(config, f"machines/{name}.svg", abs_src_path=str(svg)))
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "changelog.md", content=changelog))
    return files


def readme_section(name: str) -> str:
    """The README's text between ``<!-- docs: start NAME -->`` and ``<!-- docs: end NAME -->``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(rf"<!-- docs: start {name} -->\n(.*?)<!-- docs: end {name} -->", text, re.S)
    if m is None:
        raise PluginError(f"README.md has no section marked <!-- docs: start {name} -->")
    return m.group(1)


def on_page_markdown(markdown: str, page: Any, config: MkDocsConfig, files: Files) -> str:
    # the home page shows the README's machine table and quick start, one text for both;
    # the table's links to the committed diagrams become links to the machine pages
    def include(m: re.Match[str]) -> str:
        section = readme_section(m.group(1))
        for name in MACHINES:
            section = section.replace(f"](diagrams/{name}.md)", f"](machines/{name}.md)")
        # the README links the guide from the repository's root; the site's root is docs/
        return section.replace("](docs/", "](")

    return re.sub(r"<!-- README: (\w+) -->", include, markdown)

"""YAML for scenario files, loaded within bounds.

The C loader when PyYAML has it (most of the time of a large file is the pure-Python one),
safe tags only, and before anything is built from the parsed nodes: no key twice in one
mapping, no nesting deeper than ``MAX_DEPTH``, no alias inside the collection it names, and
aliases that add at most ``MAX_ALIAS_NODES`` nodes once expanded (a few anchors of lists of
aliases make a 400-byte file a billion values; everything downstream, the trace and the JSON
output, would hold each of them).
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from agent_runtime.settings import shown

MAX_DEPTH = 32  # nested collections; a scenario needs five or six
MAX_ALIAS_NODES = 10_000  # nodes aliases may add once expanded

_MERGE = "tag:yaml.org,2002:merge"
_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlRefused(ValueError):
    """Parsed, but refused before it is built: too deep, or its aliases expand too far."""


class _Loader(_Base):  # type: ignore[misc]
    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE:
                    continue  # a merge may override what it brings in: not a duplicate
                key = self.construct_object(key_node)
                if key in seen:
                    raise ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark
                    )
                seen.add(key)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        # a scalar its tag's constructor cannot read (an int past Python's int-to-string
        # limit, "!!int abc", "!!bool maybe") raised Python's own error: a traceback, exit 1
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, KeyError, TypeError) as e:
            if isinstance(e, YamlRefused):
                raise
            raise ConstructorError(None, None, _unreadable(node), node.start_mark) from None


def _unreadable(node: Node) -> str:
    tag = str(node.tag).rsplit(":", 1)[-1]  # "int" of tag:yaml.org,2002:int
    limit = sys.get_int_max_str_digits()
    if tag == "int" and isinstance(node.value, str) and len(node.value) > limit:
        return f"a number of more than {limit} digits"
    return f"not a valid {tag}: {shown(node.value)}"


def load_yaml(text: str) -> Any:
    """The document in ``text``; ``yaml.YAMLError`` when it is not YAML, ``YamlRefused``
    when it is but exceeds a bound."""
    loader = _Loader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:  # the pure-Python composer recurses per level
            raise YamlRefused(f"nested deeper than {MAX_DEPTH} levels") from None
        except yaml.MarkedYAMLError as e:
            if "maximum nesting depth" in str(e.problem):  # libyaml's own bound (1,000)
                raise YamlRefused(f"nested deeper than {MAX_DEPTH} levels{_at(e)}") from None
            raise
        if node is None:
            return None
        check_nodes(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def check_nodes(root: Node) -> None:
    """Refuse a node graph that nests too deep, contains itself, or expands too far."""
    in_progress = -1
    size: dict[int, int] = {}  # id(node) -> nodes once aliases are expanded
    height: dict[int, int] = {}  # id(node) -> collections nested in it, itself included
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if not children_done:
            if key in size:
                if size[key] == in_progress:  # reached again below itself
                    raise YamlRefused(
                        "an alias refers to a collection that contains it"
                        + _at_mark(node.start_mark)
                    )
                continue
            if isinstance(node, ScalarNode):
                size[key], height[key] = 1, 0
                continue
            size[key] = in_progress
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node))
            continue
        kids = _children(node)
        size[key] = 1 + sum(size[id(c)] for c in kids)
        height[key] = 1 + max((height[id(c)] for c in kids), default=0)
    if height[id(root)] > MAX_DEPTH:
        node, level = root, 1
        while level <= MAX_DEPTH:  # down the deepest path to the first level too many
            node = max(_children(node), key=lambda c: height[id(c)])
            level += 1
        raise YamlRefused(f"nested deeper than {MAX_DEPTH} levels{_at_mark(node.start_mark)}")
    if size[id(root)] - len(size) > MAX_ALIAS_NODES:
        raise YamlRefused(f"its aliases would expand it by more than {MAX_ALIAS_NODES:,} nodes")


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error on one line: what is wrong and where."""
    if isinstance(e, yaml.MarkedYAMLError):
        text = ", ".join(p for p in (e.context, e.problem) if p) or "invalid"
        return text + _at(e)
    return " ".join(str(e).split())


def _at(e: yaml.MarkedYAMLError) -> str:
    return _at_mark(e.problem_mark or e.context_mark)


def _at_mark(mark: Any) -> str:
    if mark is None:
        return ""
    return f" (line {mark.line + 1}, column {mark.column + 1})"

"""What a scenario file's error says: where, pydantic's word for it, the value given and
the key or the case likely meant."""

from __future__ import annotations

import difflib
import re
from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

from agent_runtime.settings import shown


def dotted(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _model_at(model: Any, loc: tuple[int | str, ...]) -> Any:
    """The type found at ``loc`` under ``model`` (a tuple's items, an optional's model)."""
    for part in (*loc, None):
        args = [a for a in get_args(model) if a is not type(None) and a is not Ellipsis]
        if get_origin(model) in (Union, UnionType, tuple) and len(args) == 1:
            model = args[0]
        if part is None or isinstance(part, int):
            continue
        fields = getattr(model, "model_fields", {})
        model = fields[part].annotation if part in fields else None
    return model


def unknown_key(key: str, given: Any, known: Any) -> str:
    """pydantic's word for a key no model has, and the missing one it likely meant: a key
    misspelt made pydantic say first that the one meant is missing (`identity: Field
    required`), never naming the key written."""
    left = [k for k in known if not (isinstance(given, dict) and k in given)]
    near = difflib.get_close_matches(key, left, n=1)
    return "Extra inputs are not permitted" + (f" (did you mean {near[0]!r}?)" if near else "")


def _got(err: Any) -> str:
    """`` (got VALUE)``: the value given, as ``AgentJob`` names it (``(got -1)``); nothing
    for a mapping or a list of them (the error is about them as a whole: a missing key, a
    rule between fields, a participant listed twice) or a value the message already quotes
    (an exponent YAML read as text)."""
    value = err.get("input")
    whole = isinstance(value, dict) or (
        isinstance(value, list | tuple) and any(isinstance(v, dict | BaseModel) for v in value)
    )
    if err["type"] == "missing" or whole or _said(err) != err["msg"]:
        return ""
    return f" (got {shown(value)})"


def first_error(
    errors: list[Any], model: Any, raw: Any, *, valued: tuple[str, ...] | None = None
) -> tuple[tuple[int | str, ...], str]:
    """The error to report, where and what: a key the model does not have first (it is
    often what made the others); an error under one of the ``valued`` fields (``None``:
    any field) names the value given."""
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = tuple(err["loc"])
    if err["type"] != "extra_forbidden":
        named = valued is None or (loc[:1] and loc[0] in valued)
        return loc, _said(err) + (_got(err) if named else "") + _case_hint(err)
    given = raw
    for part in loc[:-1]:
        given = given[part] if isinstance(given, dict | list) else None
    known = getattr(_model_at(model, loc[:-1]), "model_fields", {})
    return loc, unknown_key(str(loc[-1]), given, known)


# a number with an exponent YAML 1.1 reads as text (no dot, or no sign: 1e5, 1.0e5)
_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _case_hint(err: Any) -> str:
    """`` (did you mean 'X'?)`` for a choice given in another case: disconnect reasons are
    livekit's upper-case names, participant kinds lower case."""
    value = err.get("input")
    if err["type"] != "literal_error" or not isinstance(value, str):
        return ""
    choices = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
    same = [c for c in choices if c.casefold() == value.strip().casefold() and c != value]
    return f" (did you mean {same[0]!r}?)" if same else ""


def _said(err: Any) -> str:
    """pydantic's message, and why when YAML read a number as text (``1e5``, ``1.0e5``)."""
    value = err.get("input")
    if (
        isinstance(value, str)
        and err["type"] in ("float_type", "int_type", "float_parsing")
        and _EXPONENT.fullmatch(value.strip())
    ):
        return (
            f"{err['msg']} ({value!r} is text to YAML: a number with an exponent needs a "
            "dot and a sign, as 1.0e+5)"
        )
    return str(err["msg"])

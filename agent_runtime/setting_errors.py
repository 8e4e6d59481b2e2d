"""How a refused value is said: the errors a bad setting raises, and the cut that keeps a
value they quote (or a reason a log line says) to one short line. ``agent_runtime.settings``
raises them and still exports every name; the testing kit's messages quote values with
``shown`` too."""

from __future__ import annotations

import sys
from typing import Any

from pydantic import ValidationError


class SettingError(ValueError):
    """A setting has a value the runtime cannot run with; the message names it."""


class SettingTypeError(SettingError, TypeError):
    """A setting was given a value of the wrong type (a string for seconds, ...)."""


def setting_error(e: ValidationError, setting: str = "") -> SettingError:
    """``e``'s first error as a ``SettingError`` naming its field (within ``setting``)."""
    err = e.errors()[0]
    name = ".".join([*([setting] if setting else []), *map(str, err["loc"])]) or "settings"
    raised = err.get("ctx", {}).get("error")
    if isinstance(raised, SettingError):  # a validator's own: its class (a type error) kept
        return raised
    msg = str(err["msg"]).removeprefix("Value error, ")
    cls = SettingTypeError if str(err["type"]).endswith("_type") else SettingError
    # the value of the field named, not the whole mapping it sits in (retry_avatar.attempts
    # showed {'attempts': 'x'})
    return cls(f"{name}: {msg[:1].lower()}{msg[1:]} (got {shown(err['input'])})")


GOT_MAX = 60  # the longest value an error quotes: a message stays one short line


def shown(value: Any) -> str:
    """``value`` as an error quotes it: its repr, cut at ``GOT_MAX`` characters; an integer
    past Python's int-to-string limit (its repr raises) by its size."""
    try:
        text = repr(value)
    except ValueError:
        what = "an integer" if isinstance(value, int) else f"a {type(value).__name__} holding one"
        return f"{what} of more than {sys.get_int_max_str_digits()} digits"
    return cut(text, GOT_MAX)


def cut(text: str, limit: int) -> str:
    """``text`` cut at ``limit`` characters, ``...`` saying so."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


REASON_MAX = 200  # the longest shutdown reason a log line says (the trace keeps it whole)


def one_line(text: str, limit: int = REASON_MAX) -> str:
    """Free text a log line says (a shutdown reason): on one line, at most ``limit``
    characters; a whole transcript passed as a reason made the INFO line as long."""
    return cut(" ".join(text.split()), limit)

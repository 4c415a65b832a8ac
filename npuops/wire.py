"""Reading the JSON npuops sends between processes and hosts (a remote `npuops node --json` or `npuops status --json`,
the supervisor's status file, an instance record): typed values out of one JSON object, key by key.

A key that is missing or null takes its default, so what an older npuops sends (before a key existed) still reads;
a key present with the wrong type is a WireFormatError naming it, so a document that is not what npuops writes is a
one-line error, never a KeyError or a TypeError deep inside a caller.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from npuops.errors import BadInputError

# JSON from elsewhere (another host, an engine's answer, a model's config.json, a file another user writes) nests
# this deep at the most: json.loads itself raises RecursionError near a thousand levels, and code walking a document
# a few hundred deep would, far from where it came in.
MAX_JSON_DEPTH = 64


def loads_json(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads of a document that may be hostile: one nested deeper than `max_depth` (or so deep that the parser
    recurses out) is a json.JSONDecodeError like any other document that is not JSON, so callers catch one error."""
    doc = text if isinstance(text, str) else ""
    try:
        data = json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError(f"nested deeper than {max_depth} levels", doc, 0) from None
    level: list[Any] = [data]
    for _ in range(max_depth):  # level by level, without recursion: the values inside one more container
        level = [v for item in level if isinstance(item, (dict, list))
                 for v in (item.values() if isinstance(item, dict) else item)]
        if not level:
            return data
    if any(isinstance(item, (dict, list)) for item in level):
        raise json.JSONDecodeError(f"nested deeper than {max_depth} levels", doc, 0)
    return data


DEFAULT_FIX = "check that it comes from npuops (`npuops --version` where it was written) and write it again"


class WireFormatError(BadInputError):
    """A JSON document that is not the npuops document it should be."""

    def __init__(self, what: str, problem: str, fix: str = DEFAULT_FIX) -> None:
        super().__init__(f"not an npuops {what}: {problem}", fix)
        self.what = what
        self.reason = problem


def _type_name(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return "null" if value is None else type(value).__name__


class WireObject:
    """One JSON object of a document: `what` names the document for errors, `path` where this object sits in it."""

    def __init__(self, data: object, what: str, path: str = "") -> None:
        if not isinstance(data, Mapping):
            raise WireFormatError(what, f"{path or 'the document'} is {_type_name(data)}, not an object")
        self.data: Mapping[str, Any] = data
        self.what = what
        self.path = path

    @classmethod
    def wrap(cls, data: object, what: str) -> WireObject:
        """`data` as the root of a `what` document; a WireObject (a part of a larger document) stays as it is."""
        return data if isinstance(data, WireObject) else cls(data, what)

    def where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, problem: str) -> WireFormatError:
        return WireFormatError(self.what, f"{self.where(key)} {problem}")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def require(self, *keys: str) -> None:
        missing = [k for k in keys if k not in self.data]
        if missing:
            raise WireFormatError(self.what, f"{self.path or 'the document'} lacks {', '.join(missing)}")

    def _typed(self, key: str, types: tuple[type, ...], name: str, required: bool) -> Any:
        value = self.data.get(key)
        if value is None:
            if required:
                raise self.fail(key, "is missing")
            return None
        # A boolean is an int to Python, never a number in a document.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise self.fail(key, f"is {_type_name(value)}, not {name}")
        return value

    # --- scalars ---------------------------------------------------------------------------------------------------
    def text(self, key: str, default: str = "") -> str:
        value = self._typed(key, (str,), "a string", False)
        return default if value is None else str(value)

    def opt_text(self, key: str) -> str | None:
        value = self._typed(key, (str,), "a string", False)
        return None if value is None else str(value)

    def req_text(self, key: str) -> str:
        return str(self._typed(key, (str,), "a string", True))

    def opt_integer(self, key: str) -> int | None:
        value = self._typed(key, (int,), "an integer", False)
        return None if value is None else int(value)

    def integer(self, key: str, default: int = 0) -> int:
        value = self.opt_integer(key)
        return default if value is None else value

    def req_integer(self, key: str) -> int:
        return int(self._typed(key, (int,), "an integer", True))

    def opt_number(self, key: str) -> float | None:
        value = self._typed(key, (int, float), "a number", False)
        return None if value is None else float(value)

    def flag(self, key: str, default: bool = False) -> bool:
        value = self._typed(key, (bool,), "a boolean", False)
        return default if value is None else bool(value)

    # --- containers ------------------------------------------------------------------------------------------------
    def obj(self, key: str) -> WireObject:
        """The object under `key`; an empty one when the key is missing."""
        return self.opt_obj(key) or WireObject({}, self.what, self.where(key))

    def opt_obj(self, key: str) -> WireObject | None:
        value = self._typed(key, (Mapping,), "an object", False)
        return None if value is None else WireObject(value, self.what, self.where(key))

    def raw_object(self, key: str) -> dict[str, Any]:
        """The object under `key` as it is (its values unchecked); empty when missing."""
        return dict(self.obj(key).data)

    def _list(self, key: str) -> list[Any]:
        value = self._typed(key, (list,), "a list", False)
        return [] if value is None else list(value)

    def objects(self, key: str) -> list[WireObject]:
        return [WireObject(item, self.what, f"{self.where(key)}[{i}]") for i, item in enumerate(self._list(key))]

    def texts(self, key: str) -> tuple[str, ...]:
        items = self._list(key)
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise self.fail(f"{key}[{i}]", f"is {_type_name(item)}, not a string")
        return tuple(items)

    def integers(self, key: str) -> tuple[int, ...]:
        items = self._list(key)
        for i, item in enumerate(items):
            if not isinstance(item, int) or isinstance(item, bool):
                raise self.fail(f"{key}[{i}]", f"is {_type_name(item)}, not an integer")
        return tuple(items)

    def text_map(self, key: str) -> dict[str, str]:
        """An object of strings (e.g. component -> distribution)."""
        found = self.obj(key)
        return {name: found.req_text(name) for name in found.data}

    def number_map(self, key: str) -> dict[str, float]:
        found = self.obj(key)
        out: dict[str, float] = {}
        for name in found.data:
            value = found.opt_number(name)
            if value is None:
                raise found.fail(name, "is missing")
            out[name] = value
        return out

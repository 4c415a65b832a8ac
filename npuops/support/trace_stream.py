"""A Chrome trace read as a stream, in bounded memory: the elements of its event list one at a time.

A trace is a JSON array of events, or an object whose "traceEvents" holds them. Parsed whole, JSON costs many times
its size (one 32 MiB trace of `[{},{},...]` is 0.9 GB of dicts), and a small .gz expands to anything. So the file is
read in pieces of READ_CHUNK (a .gz decompressed a piece at a time, never whole), and each element of the event
list is parsed on its own with the standard library's scanner and handed on; the other values of the object are
parsed and dropped. No element may exceed MAX_ELEMENT_CHARS, and a `TraceBudget` bounds what all the traces of a
profile may make the summary read (bytes and elements: the time it takes). Whatever a file holds ends in its
elements or a TraceError with why.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import json
import os
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from npuops.safefiles import READ_CHUNK, printable
from npuops.support.trace_summary import TraceError

MIB = 2**20
# All the traces of one profile: the JSON read (decompressed) and the elements parsed. 256 MiB holds a profile of
# 100 engine steps; 4 million elements are what a hostile `[{},{},...]` of 12 MiB has (about 3 s to parse).
MAX_SUMMARY_BYTES = 256 * MIB
MAX_SUMMARY_ELEMENTS = 4_000_000
# One event (or another value of the trace's object), at most: torch's events are hundreds of bytes.
MAX_ELEMENT_CHARS = MIB

_SPACES = " \t\n\r"
_WHITESPACE = re.compile(f"[{_SPACES}]*")
_NUMBER_GOES_ON = re.compile(r"[0-9eE+\-.]*")
# The standard library's scanner (C where built): one value at an index, without the whitespace and end checks of
# raw_decode; StopIteration where no value starts.
_SCAN: Callable[[str, int], tuple[object, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


@dataclass
class TraceBudget:
    """What the summary may still read, over every trace of a profile."""

    bytes_left: int = MAX_SUMMARY_BYTES
    elements_left: int = MAX_SUMMARY_ELEMENTS
    max_bytes: int = MAX_SUMMARY_BYTES
    max_elements: int = MAX_SUMMARY_ELEMENTS

    @classmethod
    def of(cls, max_bytes: int = MAX_SUMMARY_BYTES, max_elements: int = MAX_SUMMARY_ELEMENTS) -> TraceBudget:
        return cls(max_bytes, max_elements, max_bytes, max_elements)

    @property
    def spent(self) -> bool:
        return self.bytes_left <= 0 or self.elements_left <= 0

    def why_spent(self) -> str:
        return (f"the summary reads at most {self.max_bytes // MIB} MiB of JSON and {self.max_elements:,} events "
                "over all traces; this one is copied, not summarized (profile again with fewer --steps)")

    def take_bytes(self, count: int) -> None:
        self.bytes_left -= count
        if self.bytes_left < 0:
            raise TraceError(f"too big to summarize: {self.why_spent()}")

    def take_element(self) -> None:
        self.elements_left -= 1
        if self.elements_left < 0:
            raise TraceError(f"too many events to summarize: {self.why_spent()}")


def _pieces(read: Callable[[int], bytes]) -> Iterator[bytes]:
    """The source in pieces of at least READ_CHUNK bytes (but the last): a .gz of many tiny members would otherwise
    hand out a byte at a time, and a long element be scanned again after each."""
    while True:
        piece = read(READ_CHUNK)
        if not piece:
            return
        while len(piece) < READ_CHUNK and (more := read(READ_CHUNK - len(piece))):
            piece += more
        yield piece


def trace_text(fd: int, name: str, budget: TraceBudget) -> Iterator[str]:
    """The text of the trace open at `fd` (gunzipped when `name` ends in .gz) in pieces, each counted against the
    budget; TraceError for a .gz cut short or not gzip, for text that is not UTF-8, or past the budget."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    try:
        with os.fdopen(os.dup(fd), "rb") as raw, contextlib.ExitStack() as stack:
            read = raw.read
            if name.endswith(".gz"):
                read = stack.enter_context(gzip.GzipFile(fileobj=raw, mode="rb")).read
            for piece in _pieces(read):
                budget.take_bytes(len(piece))
                yield decoder.decode(piece)
            yield decoder.decode(b"", final=True)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        # EOFError: the engine was still writing it, or it was cut short.
        raise TraceError(f"{printable(name)} is not a whole gzip file ({exc})") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{printable(name)} is not JSON (not UTF-8 at byte {exc.start} of a piece)") from None
    except OSError as exc:
        raise TraceError(f"{printable(name)} cannot be read ({exc.strerror})") from None


class JsonStream:
    """JSON text from pieces, parsed one value at a time: only the value being parsed (and one piece) in memory."""

    def __init__(self, pieces: Iterator[str], name: str) -> None:
        self._pieces = pieces
        self._name = printable(name)
        self._text = ""
        self._at = 0
        self._ended = False

    def error(self, what: str) -> TraceError:
        return TraceError(f"{self._name} is not JSON ({what})")

    def _more(self) -> bool:
        piece = next(self._pieces, None) if not self._ended else None
        if piece is None:
            self._ended = True
            return False
        self._text = self._text[self._at:] + piece
        self._at = 0
        return True

    def peek(self) -> str:
        """The next character that is not whitespace ("" at the end), not consumed."""
        text, at = self._text, self._at
        if at < len(text) and text[at] not in _SPACES:  # the common case, without the regular expression
            return text[at]
        while True:
            self._at = _WHITESPACE.match(self._text, self._at).end()  # type: ignore[union-attr]
            if self._at < len(self._text):
                return self._text[self._at]
            if not self._more():
                return ""

    def take(self, char: str) -> None:
        found = self.peek()
        if found != char:
            raise self.error(f"{char!r} expected, found {found!r}" if found else f"it ends where {char!r} is due")
        self._at += 1

    def value(self) -> object:
        """The next JSON value, parsed whole (at most MAX_ELEMENT_CHARS of it)."""
        if not self.peek():
            raise self.error("it ends where a value is due")
        while True:
            try:
                value, end = _SCAN(self._text, self._at)
            except (StopIteration, json.JSONDecodeError) as exc:
                # The value may go on in the next piece; past the element cap, or at the end, it is broken.
                if len(self._text) - self._at > MAX_ELEMENT_CHARS:
                    raise self.error(f"a value of more than {MAX_ELEMENT_CHARS // MIB} MiB, or {exc}") from None
                if not self._more():
                    raise self.error(str(exc) if str(exc) else "it is cut short") from None
                continue
            except RecursionError:
                raise self.error("nested deeper than a parser goes") from None
            # A number may go on in the next piece ("1.5" of "1.5e+16"): while all the text after it could still
            # be part of it, read on first. (A string, an object, an array or a literal ends with its last
            # character.)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and \
                    _NUMBER_GOES_ON.fullmatch(self._text, end) and len(self._text) - self._at <= MAX_ELEMENT_CHARS \
                    and self._more():
                continue
            self._at = end
            return value

    def elements(self) -> Iterator[object]:
        """The elements of the array that starts here."""
        self.take("[")
        if self.peek() == "]":
            self._at += 1
            return
        while True:
            yield self.value()
            if self._at < len(self._text) and self._text[self._at] == ",":  # the common case, at once
                self._at += 1
                continue
            if self.peek() == "]":
                self._at += 1
                return
            self.take(",")


def trace_elements(pieces: Iterator[str], name: str, budget: TraceBudget) -> Iterator[object]:
    """The events of a Chrome trace's text (a JSON array of them, or an object with a "traceEvents" array), one at a
    time, each counted against the budget; TraceError where the text is not such JSON."""
    stream = JsonStream(pieces, name)
    first = stream.peek()
    found = first == "["
    if found:
        for element in stream.elements():
            budget.take_element()
            yield element
    elif first == "{":
        stream.take("{")
        more = stream.peek() != "}"
        while more:
            key = stream.value()
            if not isinstance(key, str):
                raise stream.error("an object's key is not a string")
            stream.take(":")
            if key == "traceEvents" and not found and stream.peek() == "[":
                found = True
                for element in stream.elements():
                    budget.take_element()
                    yield element
            else:  # another value of the object (deviceProperties, ...): parsed, counted, dropped
                stream.value()
                budget.take_element()
            more = stream.peek() == ","
            if more:
                stream.take(",")
        stream.take("}")
    else:
        raise stream.error(f"it starts with {first!r}" if first else "it is empty")
    if stream.peek():
        raise stream.error("more follows its value")
    if not found:
        raise TraceError(f"{printable(name)} holds no traceEvents list")

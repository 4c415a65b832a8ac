"""Why an engine died: its log scanned for the known failure signatures (npuops/data/failure_signatures.toml).

Pure: lines in, a Diagnosis (or None) out. The supervisor calls it when the engine exits, and writes the result to
the journal and to its status file, where `npuops status` and `npuops launch` read it (so Diagnosis itself lives with
the status file, in npuops.instance.state).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from npuops.datafiles import load_data_toml
from npuops.failures import classify_import_failure
from npuops.instance.state import Diagnosis


@dataclass(frozen=True)
class Signature:
    id: str
    patterns: tuple[re.Pattern[str], ...]
    cause: str
    fix: str
    source: str
    # The torch_npu import classifier (shared with the doctor) words the cause and fix of this one.
    import_failure: bool = False
    # A restart cannot cure it (see the data file).
    permanent: bool = False


@lru_cache(maxsize=1)
def load_signatures() -> tuple[Signature, ...]:
    signatures = []
    for entry in load_data_toml("failure_signatures.toml")["signature"]:
        signatures.append(Signature(
            id=entry["id"],
            patterns=tuple(re.compile(p) for p in entry["patterns"]),
            cause=entry.get("cause", ""),
            fix=entry.get("fix", ""),
            source=entry["source"],
            import_failure=bool(entry.get("import_failure", False)),
            permanent=bool(entry.get("permanent", False)),
        ))
    return tuple(signatures)


class _Blank(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def diagnose(lines: Sequence[str], facts: Mapping[str, str] | None = None) -> Diagnosis | None:
    """The first signature (in the data file's order, most specific first) that matches a line, or None.

    `facts` fills the {name}, {env_file}, {port}, {model} and {user} placeholders of the cause and fix; a
    pattern's named groups fill their own.
    """
    values = _Blank(facts or {})
    text = "\n".join(lines)
    for signature in load_signatures():
        for line in lines:
            match = next((m for p in signature.patterns if (m := p.search(line))), None)
            if match is None:
                continue
            if signature.import_failure:
                failure = classify_import_failure(text, values.get("env_file", "the service's environment"))
                return Diagnosis(signature.id, failure.cause, failure.remediation, failure.line, signature.source,
                                 signature.permanent)
            # A pattern's named groups (the file a message names) fill placeholders too.
            filled = _Blank({**values, **{k: v for k, v in match.groupdict().items() if v is not None}})
            return Diagnosis(signature.id, signature.cause.format_map(filled), signature.fix.format_map(filled),
                             line.strip(), signature.source, signature.permanent)
    return None

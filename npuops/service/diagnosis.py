"""Why an engine died: its log scanned for the known failure signatures (npuops/data/failure_signatures.toml).

Pure: lines in, a Diagnosis (or None) out. The supervisor calls it when the engine exits, and writes the result to
the journal and to its status file, where `npuops status` and `npuops launch` read it (so Diagnosis itself lives with
the status file, in npuops.instance.state).
"""

from __future__ import annotations

import re
import signal
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
    pattern's named groups fill their own; `host:ADDRESS` facts name a group's hosts by address.
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
            # A pattern's named groups (the file a message names) fill placeholders too; a group `X_ip` (an address
            # the message names) also fills `X_host` with the group's host of that address (facts `host:ADDRESS`).
            groups = {k: v for k, v in match.groupdict().items() if v is not None}
            hosts = {f"{k[:-3]}_host": values.get(f"host:{v}", f"the host at {v}") for k, v in groups.items()
                     if k.endswith("_ip")}
            filled = _Blank({**values, **groups, **hosts})
            return Diagnosis(signature.id, signature.cause.format_map(filled), signature.fix.format_map(filled),
                             line.strip(), signature.source, signature.permanent)
    return None


# Where a diagnosis cannot name the fix, the next step: everything a support case needs, in one bundle.
COLLECT_NEXT = "if they do not say why, `npuops collect NAME` gathers what a support case needs"

# When the log names no cause, how the engine died still says something.
_SIGNAL_CAUSES = {
    signal.SIGKILL: ("the engine was killed with SIGKILL: by the kernel's OOM killer or by hand",
                     "look for it in `dmesg | grep -i -e 'killed process' -e oom`; if the OOM killer did it, lower "
                     "--max-num-seqs or --max-model-len, or give the node (container) more host memory"),
    signal.SIGSEGV: ("the engine crashed with a segmentation fault (a native library: torch_npu, CANN or vLLM)",
                     "check the stack is one compatible row (`npuops doctor --only stack-row,torch-npu-cann`) and "
                     f"read the lines before the crash with `npuops logs NAME`; {COLLECT_NEXT}"),
    signal.SIGBUS: ("the engine died of SIGBUS: usually shared memory (/dev/shm) ran out",
                    "give /dev/shm more room (containers: --shm-size=16g); see `npuops doctor --only shm-size`"),
    signal.SIGABRT: ("the engine aborted (SIGABRT): a native library gave up",
                     f"read the lines before the abort with `npuops logs NAME`; {COLLECT_NEXT}"),
}


def signal_diagnosis(returncode: int) -> Diagnosis | None:
    if returncode >= 0 or -returncode not in _SIGNAL_CAUSES:
        return None
    cause, fix = _SIGNAL_CAUSES[signal.Signals(-returncode)]
    return Diagnosis(f"signal-{signal.Signals(-returncode).name.lower()}", cause, fix,
                     f"engine exit status {returncode}", "npuops")

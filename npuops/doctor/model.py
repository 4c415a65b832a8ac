"""The check model (after ansible-lint rules and DCGM diagnostics).

A check is a small class with a stable kebab-case `id`, a title (its docstring's first line), a
`severity`, a `level` (1 = seconds, safe anywhere; 2 = standard; 3 = heavy), the tools it
`requires`, the `tags` that select it for a purpose (the start gate, `launch --verify`), and
`run(ctx) -> Result`. A Result is frozen and carries the evidence it is based on and, unless it
passed, what to do about it.
"""

from __future__ import annotations

import abc
import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from npuops.doctor.context import CheckContext


class Status(str, enum.Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"

    @property
    def rank(self) -> int:
        """Worst first: how results sort in the report."""
        return {Status.FAIL: 0, Status.ERROR: 1, Status.WARN: 2, Status.SKIP: 3, Status.PASS: 4}[self]


class Severity(str, enum.Enum):
    CRITICAL = "critical"  # the engine cannot start or will fail
    HIGH = "high"  # it starts but misbehaves (wrong results, crashes under load)
    MEDIUM = "medium"  # it runs slower or less safely than it should
    LOW = "low"  # worth knowing


@dataclass(frozen=True)
class Result:
    status: Status
    message: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    remediation: str | None = None

    def __post_init__(self) -> None:
        if self.status is not Status.PASS and not self.remediation:
            raise ValueError(f"a {self.status.value} result needs a remediation: {self.message!r}")

    @classmethod
    def passed(cls, message: str, **evidence: Any) -> Result:
        return cls(Status.PASS, message, evidence)

    @classmethod
    def warn(cls, message: str, remediation: str, **evidence: Any) -> Result:
        return cls(Status.WARN, message, evidence, remediation)

    @classmethod
    def fail(cls, message: str, remediation: str, **evidence: Any) -> Result:
        return cls(Status.FAIL, message, evidence, remediation)

    @classmethod
    def skip(cls, why: str, remediation: str, **evidence: Any) -> Result:
        return cls(Status.SKIP, why, evidence, remediation)


_ID = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")

# The tags npuops selects checks by, and what each means (`npuops doctor --list` shows them). A check may carry only
# these: a misspelt tag would silently drop the check from the selection that needs it.
TAG_GATE = "gate"
TAG_GATE_NPU = "gate-npu"
TAG_GATE_GROUP = "gate-group"
TAG_INSTANCE = "instance"
TAG_VERIFY = "verify"
TAGS: Mapping[str, str] = {
    TAG_GATE: "the start gate of every instance (`npuops run --preflight NAME`, the unit's ExecStartPre)",
    TAG_GATE_NPU: "the start gate of an instance on NPUs (with the `gate` checks)",
    TAG_GATE_GROUP: "the start gate of each host of a multi-node instance: the network to the group's other hosts",
    TAG_INSTANCE: "reads a launched instance's record: the start gate gives it, a plain doctor run leaves it out",
    TAG_VERIFY: "`npuops launch --verify`: the served model against its reference",
}


class Check(abc.ABC):
    """Base class of every check. Subclasses set the class attributes and implement run()."""

    id: ClassVar[str]
    area: ClassVar[str]  # the report groups by area: driver, chips, cann, stack, environment, host, network, ...
    severity: ClassVar[Severity]
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ()  # tools it needs, e.g. ("npu-smi",) - named in --list
    tags: ClassVar[tuple[str, ...]] = ()  # what selects it besides its level: names from TAGS

    @classmethod
    def title(cls) -> str:
        doc = (cls.__doc__ or "").strip()
        return doc.splitlines()[0].strip() if doc else cls.id

    @classmethod
    def validate(cls) -> None:
        """Raise ValueError when the class does not satisfy the model (checked at discovery)."""
        for attr in ("id", "area", "severity"):
            if not hasattr(cls, attr):
                raise ValueError(f"check {cls.__name__} lacks {attr}")
        if not _ID.match(cls.id):
            raise ValueError(f"check id {cls.id!r} is not kebab-case")
        if cls.level not in (1, 2, 3):
            raise ValueError(f"check {cls.id} has level {cls.level}, not 1-3")
        if not (cls.__doc__ or "").strip():
            raise ValueError(f"check {cls.id} has no docstring (its title)")
        if not isinstance(cls.tags, tuple) or len(set(cls.tags)) != len(cls.tags):
            raise ValueError(f"check {cls.id} has tags {cls.tags!r}, not a tuple of distinct names")
        for tag in cls.tags:
            if not isinstance(tag, str) or not _ID.match(tag):
                raise ValueError(f"check {cls.id} has tag {tag!r}, not kebab-case")
            if tag not in TAGS:
                raise ValueError(f"check {cls.id} has tag {tag!r}, not one of {', '.join(TAGS)}")

    @abc.abstractmethod
    def run(self, ctx: CheckContext) -> Result:
        """Answer the check's question about the node in ctx."""


@dataclass(frozen=True)
class CheckOutcome:
    """A check's result as reported: the check's identity plus the result and how long it took."""

    check_id: str
    title: str
    area: str
    level: int
    severity: Severity
    result: Result
    duration_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.check_id,
            "title": self.title,
            "area": self.area,
            "level": self.level,
            "severity": self.severity.value,
            "status": self.result.status.value,
            "message": self.result.message,
            "evidence": _jsonable(self.result.evidence),
            "remediation": self.result.remediation,
            "duration_s": round(self.duration_s, 4),
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)

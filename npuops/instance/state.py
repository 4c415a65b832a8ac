"""What the supervisor tells `npuops status` and `npuops launch` about an instance's engine: its status file
(`supervisor.json`, written through npuops.instance.record.write_status), one `SupervisorState` whoever writes it.

Three writers: the running supervisor (`SupervisorState.started`, then updated as the engine goes through its
stages), the start gate when it refuses a start (`SupervisorState.refused`), and a foreground launch before its gate
runs (`SupervisorState.gate`). Readers take it back with `SupervisorState.from_json`, which accepts the file of an
older npuops (keys missing) and turns anything else into a WireFormatError.
"""

from __future__ import annotations

import enum
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from npuops.instance.ray import RayState
from npuops.wire import WireObject

STATUS = "supervisor status file"
EXIT_GATE_REFUSED = "gate-refused"
EXIT_STOPPED = "stopped"
# A diagnosis id as npuops makes them: a failure signature's, `gate:CHECK`, `systemd-NAME`, `signal-NAME`. The
# status file is the service user's to write: an id is a key (shown in brackets, looked up), never free text.
DIAGNOSIS_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


class Stage(str, enum.Enum):
    GATE = "gate"  # the start gate runs; there is no engine yet
    STARTING = "starting"  # the engine process exists
    LOADING = "loading weights"
    KV_CACHE = "KV cache allocated"
    GRAPHS = "capturing graphs"
    LISTENING = "listening"
    HEALTHY = "healthy"  # /health answered 200
    UNHEALTHY = "unhealthy"  # was healthy, /health stopped answering
    DEGRADED = "degraded"  # answers /health, but a chip it runs on reports Alarm or Critical
    STOPPING = "stopping"
    EXITED = "exited"

    @property
    def order(self) -> int:
        return list(Stage).index(self)


def _stage(value: str | None, where: WireObject, key: str) -> Stage | None:
    if value is None:
        return None
    try:
        return Stage(value)
    except ValueError:
        raise where.fail(key, f"is {value!r}, not a stage ({', '.join(s.value for s in Stage)})") from None


@dataclass(frozen=True)
class Diagnosis:
    """Why an engine died (npuops.service.diagnosis matches its log), or why it was not started."""

    id: str
    cause: str
    fix: str
    line: str  # the log line the verdict rests on
    source: str
    permanent: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "cause": self.cause, "fix": self.fix, "line": self.line, "source": self.source,
                "permanent": self.permanent}

    @classmethod
    def from_json(cls, data: object) -> Diagnosis:
        diagnosis = WireObject.wrap(data, "diagnosis")
        diagnosis_id = diagnosis.req_text("id")
        if not DIAGNOSIS_ID.fullmatch(diagnosis_id):
            raise diagnosis.fail("id", "is not a diagnosis id (letters, digits and . _ : -, at most 128)")
        return cls(diagnosis_id, diagnosis.text("cause"), diagnosis.text("fix"), diagnosis.text("line"),
                   diagnosis.text("source"), diagnosis.flag("permanent"))


@dataclass(frozen=True)
class StageEntry:
    """One stage the engine reached: when (epoch), after how long, and what the log said about it."""

    stage: Stage
    at: float
    elapsed_s: float = 0.0
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage.value, "at": self.at, "elapsed_s": self.elapsed_s, "detail": self.detail}

    @classmethod
    def from_json(cls, data: object) -> StageEntry:
        entry = WireObject.wrap(data, STATUS)
        stage = _stage(entry.req_text("stage"), entry, "stage")
        assert stage is not None
        at = entry.opt_number("at")
        return cls(stage, 0.0 if at is None else at, entry.opt_number("elapsed_s") or 0.0, entry.text("detail"))


@dataclass(frozen=True)
class SupervisorExit:
    """How the supervisor ended: its exit status, why (stopped, engine-exited, start-timeout, hang, not-started,
    gate-refused), the engine's own status and the diagnosis."""

    code: int
    reason: str
    engine_returncode: int | None = None
    at: float | None = None
    diagnosis: Diagnosis | None = None
    log_tail: tuple[str, ...] = ()
    blocking: tuple[str, ...] = ()  # the start gate's refusing checks

    @property
    def failed(self) -> bool:
        return self.reason != EXIT_STOPPED

    def summary_json(self) -> dict[str, Any]:
        """What `npuops status --json` shows of it (the diagnosis is a key of its own there)."""
        data: dict[str, Any] = {"code": self.code, "reason": self.reason, "engine_returncode": self.engine_returncode,
                                "at": self.at}
        if self.blocking:
            data["blocking"] = list(self.blocking)
        return data

    def to_json(self) -> dict[str, Any]:
        return {**self.summary_json(), "diagnosis": self.diagnosis.to_json() if self.diagnosis else None,
                "log_tail": list(self.log_tail)}

    @classmethod
    def from_json(cls, data: object) -> SupervisorExit:
        done = WireObject.wrap(data, STATUS)
        diagnosis = done.opt_obj("diagnosis")
        return cls(code=done.integer("code", 1), reason=done.text("reason"),
                   engine_returncode=done.opt_integer("engine_returncode"), at=done.opt_number("at"),
                   diagnosis=Diagnosis.from_json(diagnosis) if diagnosis is not None else None,
                   log_tail=done.texts("log_tail"), blocking=done.texts("blocking"))


@dataclass
class SupervisorState:
    """The supervisor's state as it writes it (mutable: the running supervisor updates it in place)."""

    name: str
    supervisor_pid: int | None
    started_at: float | None = None
    stage: Stage | None = None
    stages: list[StageEntry] = field(default_factory=list)
    engine_pid: int | None = None
    url: str | None = None
    healthy_at: float | None = None
    last_health_at: float | None = None
    kv_cache_tokens: int | None = None
    # While a stopping engine drains (vLLM's --shutdown-timeout): the requests it still runs or holds.
    in_flight: int | None = None
    updated_at: float | None = None
    cluster: RayState | None = None  # a Ray head's last look at its cluster
    exit: SupervisorExit | None = None
    # How the run before this one ended (kept when a restart starts a new one): why systemd restarted the unit.
    previous_exit: SupervisorExit | None = None

    # --- the three writers ----------------------------------------------------------------------------------------
    @classmethod
    def started(cls, name: str, url: str, before: SupervisorState | None = None) -> SupervisorState:
        """The running supervisor's state before the engine starts; `before`, the state the last run left, gives
        this one its previous exit (without the log tail: the journal keeps that)."""
        previous = before.exit if before is not None else None
        if previous is not None:
            previous = replace(previous, log_tail=())
        return cls(name, os.getpid(), time.time(), url=url, previous_exit=previous)

    @classmethod
    def gate(cls, name: str, url: str) -> SupervisorState:
        """A foreground launch's first state: `npuops status` sees the instance starting while the gate runs."""
        return cls(name, os.getpid(), time.time(), stage=Stage.GATE, url=url, updated_at=time.time())

    @classmethod
    def refused(cls, name: str, blocking: Sequence[tuple[str, str, str]]) -> SupervisorState:
        """After the start gate refused the start: `blocking` lists each refusing check's (id, message, fix), the
        first one being the diagnosis `npuops status` names."""
        check_id, message, fix = blocking[0]
        now = time.time()
        diagnosis = Diagnosis(f"gate:{check_id}", message, fix, "", "npuops start gate")
        return cls(name, os.getpid(), now, stage=Stage.EXITED, updated_at=now,
                   exit=SupervisorExit(1, EXIT_GATE_REFUSED, None, now, diagnosis,
                                       blocking=tuple(b[0] for b in blocking)))

    # --- the file -------------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "supervisor_pid": self.supervisor_pid, "engine_pid": self.engine_pid,
            "stage": self.stage.value if self.stage is not None else None,
            "stages": [s.to_json() for s in self.stages], "started_at": self.started_at,
            "healthy_at": self.healthy_at, "last_health_at": self.last_health_at,
            "kv_cache_tokens": self.kv_cache_tokens, "in_flight": self.in_flight, "url": self.url,
            "updated_at": self.updated_at,
            "cluster": self.cluster.to_json() if self.cluster is not None else None,
            "exit": self.exit.to_json() if self.exit is not None else None,
            "previous_exit": self.previous_exit.to_json() if self.previous_exit is not None else None,
        }

    @classmethod
    def from_json(cls, data: object) -> SupervisorState:
        """The status file as any npuops wrote it: a missing key takes its default (a stand-in or an older npuops
        writes only some), a wrong type is a WireFormatError."""
        state = WireObject.wrap(data, STATUS)
        cluster, done, previous = state.opt_obj("cluster"), state.opt_obj("exit"), state.opt_obj("previous_exit")
        return cls(
            name=state.text("name"), supervisor_pid=state.opt_integer("supervisor_pid"),
            started_at=state.opt_number("started_at"), stage=_stage(state.opt_text("stage"), state, "stage"),
            stages=[StageEntry.from_json(s) for s in state.objects("stages")],
            engine_pid=state.opt_integer("engine_pid"), url=state.opt_text("url"),
            healthy_at=state.opt_number("healthy_at"), last_health_at=state.opt_number("last_health_at"),
            kv_cache_tokens=state.opt_integer("kv_cache_tokens"), in_flight=state.opt_integer("in_flight"),
            updated_at=state.opt_number("updated_at"),
            cluster=RayState.from_json(cluster) if cluster is not None else None,
            exit=SupervisorExit.from_json(done) if done is not None else None,
            previous_exit=SupervisorExit.from_json(previous) if previous is not None else None,
        )

"""Environment of the service: the variables a launch renders into its env file (or the current environment).

systemd does not source the CANN set_env.sh scripts, so everything they export has to be in the unit's
EnvironmentFile (systemd.exec(5): a unit reads no shell profile); the rest are the settings vllm-ascend
expects or forbids (vllm-ascend's Optimization and Tuning guide and tutorials).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from npuops.doctor.common import skip_without_npus
from npuops.doctor.context import CheckContext
from npuops.doctor.model import Check, Result, Severity

# The fix for thread conflicts npuops tests (docs/claims.md, claim 6); vllm-ascend's tutorials and CI configs run
# with OMP_NUM_THREADS=1 too.
THREAD_LIMITS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
RECOMMENDED_ALLOC_CONF = "expandable_segments:True"


def _where(ctx: CheckContext) -> str:
    return f"env file {ctx.env_source}" if ctx.options.env_file else "the current environment"


def _how_to_set(ctx: CheckContext, assignments: str) -> str:
    if ctx.options.env_file:
        return f"set {assignments} in {ctx.options.env_file} (or re-render it with `npuops launch`)"
    return f"export {assignments} in the environment the service starts from"


def split_path_list(value: str) -> list[str]:
    return [entry for entry in value.split(":") if entry]


class AscendEnv(Check):
    """ASCEND_HOME_PATH and LD_LIBRARY_PATH point at the installed CANN, its NNAL and the driver libraries."""

    id = "ascend-env"
    area = "environment"
    severity = Severity.CRITICAL
    level = 1
    tags = ("gate-npu",)

    def run(self, ctx: CheckContext) -> Result:
        node = ctx.node
        cann = node.cann
        if not cann.toolkit.installed:
            return Result.skip(f"CANN is not installed (no {cann.toolkit.path}): no environment to point at it",
                               "install CANN first: `npuops provision --tags cann`", toolkit_path=cann.toolkit.path)
        env = ctx.service_env()
        problems: list[str] = []
        kinds: list[str] = []  # one per problem, for whoever reads the evidence rather than the words
        evidence: dict[str, Any] = {"env_source": ctx.env_source}

        def problem(kind: str, text: str) -> None:
            kinds.append(kind)
            problems.append(text)

        home_var = "ASCEND_HOME_PATH" if env.get("ASCEND_HOME_PATH") else "ASCEND_TOOLKIT_HOME"
        home = env.get(home_var, "")
        evidence["ascend_home"] = home or None
        if not home:
            problem("home-unset", "ASCEND_HOME_PATH (or ASCEND_TOOLKIT_HOME) is not set")
        elif not ctx.probe.exists(home):
            problem("home-missing", f"{home_var}={home} does not exist")

        ld_path = split_path_list(env.get("LD_LIBRARY_PATH", ""))
        evidence["ld_library_path"] = ld_path
        unexpanded = [e for e in ld_path if "$" in e]
        if unexpanded and ctx.options.env_file:
            # systemd reads EnvironmentFile= values literally: "$LD_LIBRARY_PATH" stays those characters.
            problem("unexpanded", f"LD_LIBRARY_PATH has unexpanded {', '.join(unexpanded)} (systemd does not expand "
                            "variables in an env file)")
        if home and not self._on_path(ctx, f"{home.rstrip('/')}/lib64", ld_path):
            problem("toolkit-lib64", f"LD_LIBRARY_PATH lacks the toolkit's {home.rstrip('/')}/lib64")

        if cann.nnal.installed:
            nnal_root = f"{str(ctx.settings.ascend_root).rstrip('/')}/nnal/atb"
            if not any(os.path.normpath(e).startswith(nnal_root + "/") for e in ld_path):
                problem("nnal", f"LD_LIBRARY_PATH has no NNAL/ATB directory under {nnal_root} (libatb.so)")

        driver_dirs, driver_note = self._driver_dirs(ctx)
        evidence["driver_lib_dirs"] = driver_dirs
        if driver_note:
            evidence["driver"] = driver_note
        if driver_dirs:
            configured = self._ld_so_conf_dirs(ctx)
            if not any(self._on_path(ctx, d, ld_path) or d in configured for d in driver_dirs):
                problem("driver", f"neither LD_LIBRARY_PATH nor /etc/ld.so.conf.d has the driver's {driver_dirs[0]}")

        if problems:
            scripts = " and ".join(cann.set_env_scripts) or "the CANN set_env.sh scripts"
            fix = (_how_to_set(ctx, "ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME, ASCEND_OPP_PATH and LD_LIBRARY_PATH as "
                                    f"{scripts} set them (`bash -c 'source SCRIPT && env'` shows the values), plus "
                                    "the driver's lib64/driver and lib64/common on LD_LIBRARY_PATH"))
            return Result.fail("; ".join(problems), fix, problems=problems, problem_kinds=kinds, **evidence)
        return Result.passed(f"{home_var}={home}; LD_LIBRARY_PATH has the toolkit, "
                             f"{'NNAL, ' if cann.nnal.installed else ''}and driver libraries", home_var=home_var,
                             nnal=cann.nnal.installed, **evidence)

    @staticmethod
    def _on_path(ctx: CheckContext, wanted: str, entries: list[str]) -> bool:
        """Whether a directory is on a path list, also through symlinks (ascend-toolkit/latest -> 8.3.RC1)."""
        norm = os.path.normpath(wanted)
        if any(os.path.normpath(e) == norm for e in entries):
            return True
        real = os.path.realpath(ctx.settings.host_path(norm))
        return any(os.path.realpath(ctx.settings.host_path(os.path.normpath(e))) == real
                   for e in entries if e.startswith("/"))

    @staticmethod
    def _driver_dirs(ctx: CheckContext) -> tuple[list[str], str | None]:
        """The driver directories that can satisfy the library path, best first (the one with libascend_hal.so)."""
        base = (ctx.node.driver_install_path or str(ctx.settings.ascend_root)).rstrip("/")
        candidates = [f"{base}/driver/lib64/driver", f"{base}/driver/lib64", f"{base}/driver/lib64/common"]
        if not ctx.probe.exists(f"{base}/driver/lib64"):
            return [], f"no {base}/driver/lib64: the driver checks cover a missing driver"
        with_hal = [d for d in candidates if ctx.probe.exists(f"{d}/libascend_hal.so")]
        return (with_hal or candidates), None

    @staticmethod
    def _ld_so_conf_dirs(ctx: CheckContext) -> set[str]:
        """Directories the dynamic loader searches through /etc/ld.so.conf and /etc/ld.so.conf.d/*.conf."""
        texts = [ctx.probe.read_text("/etc/ld.so.conf") or ""]
        texts += [ctx.probe.read_text(f"/etc/ld.so.conf.d/{n}") or "" for n in ctx.probe.glob("/etc/ld.so.conf.d",
                                                                                                "*.conf")]
        dirs: set[str] = set()
        for text in texts:
            for line in text.splitlines():
                line = line.split("#", 1)[0].strip()
                if line.startswith("/"):
                    dirs.add(os.path.normpath(line))
        return dirs


def _positive_int(value: str | None) -> bool:
    return value is not None and value.strip().isdigit() and int(value) > 0


class ThreadLimits(Check):
    """OMP_NUM_THREADS and OPENBLAS_NUM_THREADS are set (the fix for thread conflicts between ranks)."""

    id = "thread-limits"
    area = "environment"
    severity = Severity.MEDIUM
    level = 1

    def run(self, ctx: CheckContext) -> Result:
        env = ctx.service_env()
        values = {name: env.get(name) for name in THREAD_LIMITS}
        if not ctx.node.has_npus:
            return self._cpu_engine(ctx, values)
        bad = [name for name, value in values.items() if not _positive_int(value)]
        if bad:
            unset = [n for n in bad if values[n] is None]
            what = ", ".join(f"{n} is unset" if n in unset else f"{n}={values[n]!r} is not a positive number"
                             for n in bad)
            assignments = " ".join(f"{n}={THREAD_LIMITS[n]}" for n in bad)
            return Result.warn(f"{what} in {_where(ctx)}: every rank's OpenMP/OpenBLAS pool then takes all cores",
                               _how_to_set(ctx, assignments), env_source=ctx.env_source, **values)
        return Result.passed(", ".join(f"{n}={v}" for n, v in values.items()), env_source=ctx.env_source, **values)

    @staticmethod
    def _cpu_engine(ctx: CheckContext, values: dict[str, str | None]) -> Result:
        """Without an NPU the engine here is vLLM's CPU engine, whose OpenMP threads do the model's math: the
        NPU host's one-thread limit would leave it one core. vLLM sizes and binds the pool itself
        (VLLM_CPU_OMP_THREADS_BIND; `npuops launch --hardware cpu` gives each replica its cores)."""
        omp = values.get("OMP_NUM_THREADS")
        evidence = {"env_source": ctx.env_source, "engine": "cpu", **values}
        if omp is not None and omp.strip() == "1":
            return Result.warn(f"OMP_NUM_THREADS=1 in {_where(ctx)}: on this host without an NPU the vLLM CPU "
                               "engine's matrix math gets one thread", "unset OMP_NUM_THREADS for the CPU engine "
                               "(vLLM binds its OpenMP threads to the cores in VLLM_CPU_OMP_THREADS_BIND); the "
                               "one-thread limit is for NPU hosts", **evidence)
        return Result.passed("no NPU here: the vLLM CPU engine sizes and binds its own OpenMP threads "
                             "(VLLM_CPU_OMP_THREADS_BIND)", **evidence)


class LaunchBlockingGraph(Check):
    """ASCEND_LAUNCH_BLOCKING=1 is not combined with graph mode (vllm-ascend refuses to start)."""

    id = "launch-blocking-graph"
    area = "environment"
    severity = Severity.CRITICAL
    level = 1
    tags = ("gate-npu",)

    def run(self, ctx: CheckContext) -> Result:
        value = ctx.service_env().get("ASCEND_LAUNCH_BLOCKING")
        graph = ctx.options.graph_mode
        evidence = {"ASCEND_LAUNCH_BLOCKING": value, "graph_mode": graph, "env_source": ctx.env_source}
        if value is None or value.strip() != "1":
            return Result.passed(f"ASCEND_LAUNCH_BLOCKING is {'unset' if value is None else repr(value)}", **evidence)
        if graph:
            return Result.fail(f"ASCEND_LAUNCH_BLOCKING=1 in {_where(ctx)} with graph mode: vllm-ascend stops at "
                               "startup", "remove ASCEND_LAUNCH_BLOCKING from the service environment (it is a "
                               "debugging switch), or run eager (`--enforce-eager`, `npuops doctor --eager`)",
                               **evidence)
        return Result.warn(f"ASCEND_LAUNCH_BLOCKING=1 in {_where(ctx)}: every kernel launch waits, serving is slow",
                           "remove ASCEND_LAUNCH_BLOCKING once the debugging it was set for is done", **evidence)


def parse_alloc_conf(value: str) -> tuple[dict[str, str], list[str]]:
    """PYTORCH_NPU_ALLOC_CONF ("key:value,key:value") as a dict, plus the items that are not key:value."""
    options: dict[str, str] = {}
    malformed: list[str] = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, val = item.partition(":")
        if not sep or not key.strip():
            malformed.append(item)
            continue
        options[key.strip()] = val.strip()
    return options, malformed


# Allocator options vllm-ascend names as incompatible with expandable segments (vllm_ascend/platform.py).
_NOT_WITH_EXPANDABLE = ("max_split_size_mb", "garbage_collection_threshold")


class AllocConf(Check):
    """PYTORCH_NPU_ALLOC_CONF enables expandable_segments and does not mix it with max_split_size_mb."""

    id = "alloc-conf"
    area = "environment"
    severity = Severity.HIGH
    level = 1
    tags = ("gate-npu",)

    def run(self, ctx: CheckContext) -> Result:
        skipped = skip_without_npus(ctx)  # only torch_npu's allocator reads it
        if skipped is not None:
            return skipped
        env: Mapping[str, str] = ctx.service_env()
        value = env.get("PYTORCH_NPU_ALLOC_CONF")
        evidence: dict[str, Any] = {"PYTORCH_NPU_ALLOC_CONF": value, "env_source": ctx.env_source}
        recommended = _how_to_set(ctx, f"PYTORCH_NPU_ALLOC_CONF={RECOMMENDED_ALLOC_CONF}")
        if value is None or not value.strip():
            return Result.warn(f"PYTORCH_NPU_ALLOC_CONF is unset in {_where(ctx)}: HBM fragments under long-running "
                               "load", recommended, **evidence)
        options, malformed = parse_alloc_conf(value)
        expandable = options.get("expandable_segments", "").lower() == "true"
        clashing = [k for k in _NOT_WITH_EXPANDABLE if k in options]
        if expandable and clashing:
            keep = ",".join(f"{k}:{v}" for k, v in options.items() if k not in clashing)
            return Result.fail(f"PYTORCH_NPU_ALLOC_CONF mixes expandable_segments:True with {', '.join(clashing)} "
                               "(an expandable segment is never split)", f"drop {', '.join(clashing)}: "
                               + _how_to_set(ctx, f"PYTORCH_NPU_ALLOC_CONF={keep}"), clashing=clashing, **evidence)
        if malformed:
            return Result.warn(f"PYTORCH_NPU_ALLOC_CONF has items that are not key:value: {', '.join(malformed)}",
                               f"write each option as key:value, e.g. {RECOMMENDED_ALLOC_CONF}", malformed=malformed,
                               **evidence)
        if not expandable:
            why = f" ({', '.join(clashing)} set instead)" if clashing else ""
            drop = f"drop {', '.join(clashing)}: " if clashing else ""
            return Result.warn(f"PYTORCH_NPU_ALLOC_CONF={value} does not enable expandable_segments{why}",
                               drop + _how_to_set(ctx, f"PYTORCH_NPU_ALLOC_CONF={RECOMMENDED_ALLOC_CONF}"), **evidence)
        return Result.passed(f"PYTORCH_NPU_ALLOC_CONF={value}", **evidence)

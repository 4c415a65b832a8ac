"""The plain-PyTorch side of `npuops bench --baseline transformers`: the same requests as `vllm bench serve`, served by
transformers' `generate` in static batches, timed per token.

Run with the serving venv's python (torch, transformers and vllm installed there):

    python -m npuops.bench.plain_pytorch REQUEST.json RESULT.json
    python -m npuops.bench.plain_pytorch --prompts-only REQUEST.json PROMPTS.json

REQUEST.json (every key required):
    {"model": DIR, "dtype": "float32"|"bfloat16"|"float16"|"auto", "input_len": int >= 1, "output_len": int >= 1,
     "num_prompts": int >= 1, "batch_size": int >= 1, "seed": int >= 0, "device": "auto"|"cpu"|"npu"}

- Prompts: exactly those of `vllm bench serve --dataset-name random --random-input-len INPUT_LEN --random-output-len
  OUTPUT_LEN --num-prompts NUM_PROMPTS --seed SEED --ignore-eos --model DIR`: the arguments go through vLLM's own
  `bench serve` parser (so its defaults apply: range ratio 0, prefix 0) and `get_samples` with the tokenizer
  `bench serve` loads. Each prompt is INPUT_LEN tokens once the tokenizer adds its special tokens, as the server
  counts it.
- Generation: `model.generate` over batches of BATCH_SIZE prompts in order (the last may be smaller), left padded
  (the tokenizer's pad token, else its eos), greedy, min_new_tokens = max_new_tokens = OUTPUT_LEN (every request
  yields OUTPUT_LEN tokens, like --ignore-eos), the model in DTYPE ("auto": the config's dtype). One untimed warm-up
  batch (the first batch's prompts) first.
- Timing: a batch starts before its prompts are tokenized; a StoppingCriteria records a timestamp after every
  generated token (after torch.npu.synchronize() on the NPU). Per request TTFT = first token - batch start, TPOT =
  (last - first) / (OUTPUT_LEN - 1), E2EL = last - batch start, ITL = the gaps between tokens: vLLM's definitions,
  so a static batch's requests all share their batch's figures. duration = the sum of the timed batches.
- Device: "auto" is the NPU when `torch_npu` imports and `torch.npu.is_available()`, else the CPU.
- Threads: on the CPU torch's own choice stands (OMP_NUM_THREADS and friends, as the caller's environment sets
  them); NPUOPS_BENCH_TORCH_THREADS=N makes it torch.set_num_threads(N). RESULT says what was used.
- VLLM_PLUGINS defaults to "" here (none): only vLLM's dataset code is used, and a platform plugin (vllm-ascend)
  has no business initialising a device in this process.

RESULT.json (written atomically, only on success) has the key names of `vllm bench serve --save-result`:
    backend ("transformers"), device, dtype (resolved, e.g. "float32"), torch_threads (null on the NPU),
    num_prompts, batch_size, input_len, output_len, completed, total_input_tokens, total_output_tokens, input_lens,
    duration (seconds) and duration_s (the same), request_throughput, output_throughput, total_token_throughput,
    {mean,median,std,p99}_{ttft,tpot,itl,e2el}_ms, versions {"torch", "transformers"[, "torch_npu"]}.
--prompts-only writes {"prompts": [...], "prompt_lens": [...]} (vLLM's SampleRequest prompt and prompt_len) and
loads no weights.

Exit codes: 0 done; 3 the request is wrong (bad JSON or fields, model directory missing or not loadable, prompts
impossible); 4 the environment cannot run it (torch, transformers or vllm missing, no NPU for "npu", out of
memory, a failure inside torch). Errors are one line on stderr, never a traceback; progress is one line per batch
on stderr ("batch 2/5 done").

This module imports nothing from npuops, and torch, transformers and vllm only inside functions.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_BAD_INPUT = 3
EXIT_ENVIRONMENT = 4
THREADS_ENV = "NPUOPS_BENCH_TORCH_THREADS"
DTYPES = ("float32", "bfloat16", "float16", "auto")
DEVICES = ("auto", "cpu", "npu")
PERCENTILE = 99  # `vllm bench serve`'s default --metric-percentiles
_INT_FIELDS = ("input_len", "output_len", "num_prompts", "batch_size", "seed")


class BadRequest(Exception):
    """The request cannot be run as given (exit 3)."""


class EnvironmentMissing(Exception):
    """The environment cannot run the request (exit 4)."""


@dataclass(frozen=True)
class BenchRequest:
    model: Path
    dtype: str
    input_len: int
    output_len: int
    num_prompts: int
    batch_size: int
    seed: int
    device: str


@dataclass(frozen=True)
class BatchTiming:
    """One timed batch: when it started, when each of its generated tokens was there, and its prompts' lengths."""

    start: float
    token_times: tuple[float, ...]
    input_lens: tuple[int, ...]


def parse_request(data: object) -> BenchRequest:
    """The request from REQUEST.json's decoded content; BadRequest names the first wrong field."""
    if not isinstance(data, dict):
        raise BadRequest("the request must be a JSON object")
    missing = [key for key in ("model", "dtype", "device", *_INT_FIELDS) if key not in data]
    if missing:
        raise BadRequest(f"the request lacks {', '.join(missing)}")
    for key in _INT_FIELDS:
        value = data[key]
        lowest = 0 if key == "seed" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
            raise BadRequest(f"{key} must be an integer >= {lowest}, not {value!r}")
    if data["dtype"] not in DTYPES:
        raise BadRequest(f"dtype must be one of {', '.join(DTYPES)}, not {data['dtype']!r}")
    if data["device"] not in DEVICES:
        raise BadRequest(f"device must be one of {', '.join(DEVICES)}, not {data['device']!r}")
    if not isinstance(data["model"], str) or not data["model"]:
        raise BadRequest(f"model must be a directory path, not {data['model']!r}")
    model = Path(data["model"])
    if not (model / "config.json").is_file():
        raise BadRequest(f"model directory {model} does not exist or has no config.json")
    return BenchRequest(
        model=model,
        dtype=data["dtype"],
        device=data["device"],
        **{key: data[key] for key in _INT_FIELDS},
    )


# Statistics as numpy computes them in `vllm bench serve` (np.mean, np.median, np.std, np.percentile linear), in
# plain Python so they are tested without numpy; an empty list gives 0 like vLLM's `values or 0`.


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def std(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    centre = mean(values)
    return math.sqrt(math.fsum((v - centre) ** 2 for v in values) / len(values))


def summarize(batches: Sequence[BatchTiming], output_len: int) -> dict[str, Any]:
    """vLLM's serve metrics from the batches' timestamps (seconds): throughputs, and mean/median/std/p99 in ms of
    TTFT, TPOT, ITL and E2EL with every request of a batch counted (they share its timestamps)."""
    ttfts: list[float] = []
    tpots: list[float] = []
    itls: list[float] = []
    e2els: list[float] = []
    input_lens: list[int] = []
    for batch in batches:
        if len(batch.token_times) != output_len:
            raise ValueError(f"a batch has {len(batch.token_times)} token timestamps, not {output_len}")
        first, last = batch.token_times[0], batch.token_times[-1]
        gaps = [b - a for a, b in zip(batch.token_times, batch.token_times[1:], strict=False)]
        for input_len in batch.input_lens:
            input_lens.append(input_len)
            ttfts.append(first - batch.start)
            e2els.append(last - batch.start)
            itls.extend(gaps)
            if output_len > 1:  # vLLM leaves single-token requests out of TPOT
                tpots.append((last - first) / (output_len - 1))
    completed = len(input_lens)
    duration = math.fsum(batch.token_times[-1] - batch.start for batch in batches)
    total_output = completed * output_len
    result: dict[str, Any] = {
        "completed": completed,
        "total_input_tokens": sum(input_lens),
        "total_output_tokens": total_output,
        "input_lens": input_lens,
        "duration": duration,
        "duration_s": duration,
        "request_throughput": completed / duration if duration > 0 else 0.0,
        "output_throughput": total_output / duration if duration > 0 else 0.0,
        "total_token_throughput": (sum(input_lens) + total_output) / duration if duration > 0 else 0.0,
    }
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        result[f"mean_{name}_ms"] = mean(values) * 1000
        result[f"median_{name}_ms"] = percentile(values, 50) * 1000
        result[f"std_{name}_ms"] = std(values) * 1000
        result[f"p{PERCENTILE}_{name}_ms"] = percentile(values, PERCENTILE) * 1000
    return result


def batches_of(items: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def vllm_serve_argv(request: BenchRequest) -> list[str]:
    """The `vllm bench serve` arguments whose prompts this bench serves (the lead's vLLM side passes the same)."""
    return [
        "--model", str(request.model),
        "--dataset-name", "random",
        "--random-input-len", str(request.input_len),
        "--random-output-len", str(request.output_len),
        "--num-prompts", str(request.num_prompts),
        "--seed", str(request.seed),
        "--ignore-eos",
    ]  # fmt: skip


def vllm_random_prompts(request: BenchRequest) -> list[tuple[str, int]]:
    """(prompt, prompt_len) of every request `vllm bench serve` sends for these arguments, made by vLLM's own code
    the way its main_async makes them (vllm/benchmarks/serve.py): its parser, global seeds, tokenizer, get_samples."""
    os.environ.setdefault("VLLM_PLUGINS", "")
    try:
        import random

        import numpy as np  # type: ignore[import-not-found]
        from vllm.benchmarks.datasets import get_samples  # type: ignore[import-not-found]
        from vllm.benchmarks.serve import add_cli_args  # type: ignore[import-not-found]
        from vllm.tokenizers import get_tokenizer  # type: ignore[import-not-found]
        from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]
    except ImportError as exc:
        raise EnvironmentMissing(
            f"vLLM's benchmark code does not import ({exc}): run this with the serving venv's python"
        ) from exc
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(vllm_serve_argv(request))
    random.seed(args.seed)
    np.random.seed(args.seed)
    tokenizer_id = args.tokenizer if args.tokenizer is not None else args.model
    try:
        tokenizer = get_tokenizer(tokenizer_id, tokenizer_mode=args.tokenizer_mode,
                                  trust_remote_code=args.trust_remote_code)
        samples = get_samples(args, tokenizer)
    except (OSError, ValueError) as exc:
        raise BadRequest(f"vLLM's random dataset cannot make these prompts: {exc}") from exc
    return [(sample.prompt, int(sample.prompt_len)) for sample in samples]


def _import_torch_stack() -> tuple[Any, Any]:
    try:
        import torch  # type: ignore[import-not-found]
        import transformers  # type: ignore[import-not-found]
    except ImportError as exc:
        missing = exc.name or str(exc)
        raise EnvironmentMissing(f"{missing} is not installed: run this with the serving venv's python") from exc
    return torch, transformers


def resolve_device(requested: str) -> str:
    """"cpu" or "npu" (importing torch_npu, which registers the device, when the NPU is used)."""
    if requested == "cpu":
        return "cpu"
    torch, _ = _import_torch_stack()
    try:
        import torch_npu  # type: ignore[import-not-found]  # noqa: F401 - registers torch.npu
    except ImportError as exc:
        if requested == "npu":
            raise EnvironmentMissing(f"device npu asked for but torch_npu does not import ({exc})") from exc
        return "cpu"
    if torch.npu.is_available():
        return "npu"
    if requested == "npu":
        raise EnvironmentMissing("device npu asked for but torch.npu.is_available() is false")
    return "cpu"


def resolve_dtype(requested: str, model_dir: Path) -> str:
    """The dtype name to load in: the requested one, or for "auto" the config's (`dtype`, older `torch_dtype`)."""
    if requested != "auto":
        return requested
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise BadRequest(f"{model_dir / 'config.json'} is unreadable: {exc}") from exc
    if not isinstance(config, dict):
        raise BadRequest(f"{model_dir / 'config.json'} is not a JSON object")
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    if name not in DTYPES[:-1]:
        raise BadRequest(f"the config's dtype {name!r} is not one of {', '.join(DTYPES[:-1])}")
    return str(name)


def _configure_threads(torch: Any, device: str) -> int | None:
    if device != "cpu":
        return None
    wanted = os.environ.get(THREADS_ENV, "")
    if wanted:
        if not wanted.isdigit() or int(wanted) < 1:
            raise BadRequest(f"{THREADS_ENV} must be a positive integer, not {wanted!r}")
        torch.set_num_threads(int(wanted))
    return int(torch.get_num_threads())


def _load(request: BenchRequest, device: str, dtype: str) -> tuple[Any, Any]:
    torch, transformers = _import_torch_stack()
    transformers.utils.logging.disable_progress_bar()  # stderr carries this bench's progress lines only
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(request.model)
        model = transformers.AutoModelForCausalLM.from_pretrained(request.model, dtype=getattr(torch, dtype))
    except (OSError, ValueError, KeyError) as exc:
        raise BadRequest(f"transformers cannot load the model in {request.model}: {exc}") from exc
    tokenizer.padding_side = "left"  # generation continues every prompt from its end
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device)
    model.eval()
    return tokenizer, model


def _timed_generate(torch: Any, transformers: Any, tokenizer: Any, model: Any, prompts: list[str],
                    output_len: int, device: str) -> BatchTiming:
    sync: Callable[[], None] = torch.npu.synchronize if device == "npu" else (lambda: None)
    token_times: list[float] = []

    class RecordTokenTime(transformers.StoppingCriteria):  # type: ignore[misc]
        """Called by generate after every new token; never stops (min/max_new_tokens decide)."""

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            sync()
            token_times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    sync()
    start = time.perf_counter()
    inputs = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
    with torch.inference_mode():
        output = model.generate(
            **inputs,
            do_sample=False,
            num_beams=1,
            max_new_tokens=output_len,
            min_new_tokens=output_len,
            pad_token_id=tokenizer.pad_token_id,
            stopping_criteria=transformers.StoppingCriteriaList([RecordTokenTime()]),
        )
    generated = output.shape[1] - inputs["input_ids"].shape[1]
    if generated != output_len or len(token_times) != output_len:
        raise EnvironmentMissing(f"generate made {generated} tokens ({len(token_times)} timed), not {output_len}")
    input_lens = tuple(int(n) for n in inputs["attention_mask"].sum(dim=1).tolist())
    return BatchTiming(start=start, token_times=tuple(token_times), input_lens=input_lens)


def run_bench(request: BenchRequest) -> dict[str, Any]:
    """Make the prompts, load the model, warm up, run the timed batches; the RESULT content."""
    # The environment and the dtype first: a missing package or NPU fails at once, not after vLLM's slow import.
    torch, transformers = _import_torch_stack()
    device = resolve_device(request.device)
    dtype = resolve_dtype(request.dtype, request.model)
    prompts = [prompt for prompt, _ in vllm_random_prompts(request)]
    threads = _configure_threads(torch, device)
    tokenizer, model = _load(request, device, dtype)
    batches = batches_of(prompts, request.batch_size)
    _timed_generate(torch, transformers, tokenizer, model, batches[0], request.output_len, device)
    _progress("warm-up batch done")
    timings = []
    for number, batch in enumerate(batches, start=1):
        timings.append(_timed_generate(torch, transformers, tokenizer, model, batch, request.output_len, device))
        _progress(f"batch {number}/{len(batches)} done")
    versions = {"torch": str(torch.__version__), "transformers": str(transformers.__version__)}
    if device == "npu":
        import torch_npu  # type: ignore[import-not-found]

        versions["torch_npu"] = str(getattr(torch_npu, "__version__", "unknown"))
    return {
        "backend": "transformers",
        "device": device,
        "dtype": dtype,
        "torch_threads": threads,
        "num_prompts": request.num_prompts,
        "batch_size": request.batch_size,
        "input_len": request.input_len,
        "output_len": request.output_len,
        **summarize(timings, request.output_len),
        "versions": versions,
    }


def write_json_atomically(path: Path, content: object) -> None:
    """Readers see the old file or the whole new one, never a part."""
    path = path.resolve()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(content, out, indent=2)
            out.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _fail(code: int, message: str) -> int:
    one_line = " ".join(message.split())
    print(f"plain_pytorch: error: {one_line}", file=sys.stderr, flush=True)
    return code


def _run(argv: Sequence[str]) -> int:
    prompts_only = "--prompts-only" in argv
    paths = [arg for arg in argv if arg != "--prompts-only"]
    if len(paths) != 2 or any(arg.startswith("-") for arg in paths):
        return _fail(EXIT_BAD_INPUT, "usage: python -m npuops.bench.plain_pytorch [--prompts-only] REQUEST.json "
                     "RESULT.json")
    request_path, result_path = Path(paths[0]), Path(paths[1])
    try:
        data = json.loads(request_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BadRequest(f"cannot read the request {request_path}: {exc}") from exc
    request = parse_request(data)
    if not result_path.resolve().parent.is_dir():
        raise BadRequest(f"the result's directory {result_path.parent} does not exist")
    if prompts_only:
        samples = vllm_random_prompts(request)
        content: dict[str, Any] = {"prompts": [p for p, _ in samples], "prompt_lens": [n for _, n in samples]}
    else:
        content = run_bench(request)
    write_json_atomically(result_path, content)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _run(sys.argv[1:] if argv is None else argv)
    except BadRequest as exc:
        return _fail(EXIT_BAD_INPUT, str(exc))
    except EnvironmentMissing as exc:
        return _fail(EXIT_ENVIRONMENT, str(exc))
    except MemoryError:
        return _fail(EXIT_ENVIRONMENT, "out of memory")
    except KeyboardInterrupt:
        return _fail(130, "interrupted")
    except Exception as exc:  # noqa: BLE001 - torch's failures (its OutOfMemoryError too) are RuntimeErrors
        return _fail(EXIT_ENVIRONMENT, f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    sys.exit(main())

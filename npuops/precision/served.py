"""Served-model precision: a fixed set of greedy completions from an endpoint, compared with a reference.

The reference is a golden file recorded from a trusted run (`npuops golden record`) or, for a model small enough,
transformers on the CPU from the same weights (reference_script.py, run in the serving stack's interpreter). Prompts
and bounds are data (npuops/data/served_precision.toml, which explains the bounds). Parsing and comparing are pure;
the HTTP and subprocess calls are the only effects.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from npuops import __version__
from npuops.atomic import write_text_atomic
from npuops.datafiles import load_data_toml
from npuops.errors import BadInputError, ConfigError, EnvironmentMissingError
from npuops.hardware.probe import CommandResult, CommandRunner
from npuops.httpclient import http_request
from npuops.parsing import ParseError
from npuops.wire import loads_json

GOLDEN_FORMAT = "npuops-golden/1"


@dataclass(frozen=True)
class Generation:
    prompt: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclass(frozen=True)
class GenerationSet:
    source: str  # "endpoint http://...", "transformers", "golden FILE"
    model: str
    dtype: str
    max_tokens: int
    generations: tuple[Generation, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"format": GOLDEN_FORMAT, "source": self.source, "model": self.model, "dtype": self.dtype,
                "max_tokens": self.max_tokens, "meta": dict(self.meta),
                "generations": [{**asdict(g), "prompt_token_ids": list(g.prompt_token_ids),
                                 "token_ids": list(g.token_ids), "logprobs": list(g.logprobs)}
                                for g in self.generations]}


@dataclass(frozen=True)
class ServedConfig:
    prompts: tuple[str, ...]
    max_tokens: int
    bounds: Mapping[str, Mapping[str, float]]

    def bounds_for(self, dtype: str) -> Mapping[str, float]:
        if dtype not in self.bounds:
            raise BadInputError(f"no served-precision bounds for dtype {dtype!r}",
                                f"use one of: {', '.join(sorted(self.bounds))}")
        return self.bounds[dtype]


def load_served_config() -> ServedConfig:
    data = load_data_toml("served_precision.toml")
    return ServedConfig(tuple(data["prompts"]), int(data["max_tokens"]),
                        {k: {kk: float(vv) for kk, vv in v.items()} for k, v in data["bounds"].items()})


# --- parsing (pure) ------------------------------------------------------------------------------------------------

def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ParseError("served generations", f"{what} is not a list of token ids")
    return tuple(value)


def _floats(value: Any, what: str) -> tuple[float, ...]:
    if not isinstance(value, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                              for v in value):
        raise ParseError("served generations", f"{what} is not a list of numbers")
    return tuple(float(v) for v in value)


def parse_completion(body: bytes | str, prompt: str) -> Generation:
    """One choice of a vLLM /v1/completions answer asked with logprobs=1 and return_token_ids."""
    try:
        data = loads_json(body)
        choice = data["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ParseError("a completions answer", "not an OpenAI completions answer") from None
    if not isinstance(choice, dict):
        raise ParseError("a completions answer", "not an OpenAI completions answer")
    token_ids = _ints(choice.get("token_ids"), "choices[0].token_ids (the server ignored return_token_ids)")
    prompt_ids = _ints(choice.get("prompt_token_ids") or [], "choices[0].prompt_token_ids")
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        raise ParseError("a completions answer", "choices[0].logprobs is missing (the server ignored logprobs)")
    values = _floats(logprobs.get("token_logprobs"), "choices[0].logprobs.token_logprobs")
    if len(values) != len(token_ids):
        raise ParseError("served generations", f"{len(token_ids)} tokens but {len(values)} logprobs")
    return Generation(prompt, prompt_ids, token_ids, values)


def parse_generation_set(data: Any, where: str) -> GenerationSet:
    """A golden file or a reference script's output."""
    if not isinstance(data, dict) or not isinstance(data.get("generations"), list):
        raise ParseError(where, "no generations")
    generations = []
    for i, g in enumerate(data["generations"]):
        if not isinstance(g, dict) or not isinstance(g.get("prompt"), str):
            raise ParseError(where, f"generation {i} has no prompt")
        token_ids = _ints(g.get("token_ids"), f"{where}: generation {i} token_ids")
        logprobs = _floats(g.get("logprobs"), f"{where}: generation {i} logprobs")
        if len(token_ids) != len(logprobs):
            raise ParseError(where, f"generation {i} has {len(token_ids)} tokens but {len(logprobs)} logprobs")
        generations.append(Generation(g["prompt"], _ints(g.get("prompt_token_ids", []), "prompt_token_ids"),
                                      token_ids, logprobs))
    meta = data.get("meta")
    return GenerationSet(str(data.get("source", where)), str(data.get("model", "")), str(data.get("dtype", "")),
                         int(data.get("max_tokens") or max((len(g.token_ids) for g in generations), default=0)),
                         tuple(generations), meta if isinstance(meta, dict) else {})


# --- comparing (pure) -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PromptComparison:
    prompt: str
    agreed: int  # exact-match prefix of generated token ids
    length: int
    max_logprob_diff: float  # on the agreed prefix
    prompt_tokens_match: bool
    first_difference: tuple[int, int] | None  # (reference id, served id) at the first disagreement


@dataclass(frozen=True)
class Comparison:
    prompts: tuple[PromptComparison, ...]
    agreement: float
    max_logprob_diff: float
    bounds: Mapping[str, float]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "agreement": round(self.agreement, 4),
                "max_logprob_diff": self.max_logprob_diff, "bounds": dict(self.bounds), "problems": list(self.problems),
                "prompts": [{"prompt": p.prompt, "agreed": p.agreed, "length": p.length,
                             "max_logprob_diff": p.max_logprob_diff, "prompt_tokens_match": p.prompt_tokens_match,
                             "first_difference": list(p.first_difference) if p.first_difference else None}
                            for p in self.prompts]}


def compare(reference: GenerationSet, served: GenerationSet, bounds: Mapping[str, float]) -> Comparison:
    by_prompt = {g.prompt: g for g in reference.generations}
    rows = []
    problems = []
    for gen in served.generations:
        ref = by_prompt.get(gen.prompt)
        if ref is None:
            problems.append(f"the reference has no answer for prompt {gen.prompt!r}")
            continue
        length = min(len(ref.token_ids), len(gen.token_ids))
        agreed = 0
        while agreed < length and ref.token_ids[agreed] == gen.token_ids[agreed]:
            agreed += 1
        diffs = [abs(ref.logprobs[i] - gen.logprobs[i]) for i in range(agreed)]
        max_diff = max(diffs, default=0.0)
        prompt_match = not ref.prompt_token_ids or not gen.prompt_token_ids or \
            ref.prompt_token_ids == gen.prompt_token_ids
        first = (ref.token_ids[agreed], gen.token_ids[agreed]) if agreed < length else None
        rows.append(PromptComparison(gen.prompt, agreed, length, max_diff, prompt_match, first))
    if not rows:
        problems.append("no prompt in common between the reference and the served answers")
    agreement = sum(r.agreed / r.length for r in rows if r.length) / max(1, len(rows))
    max_diff = max((r.max_logprob_diff for r in rows), default=0.0)
    mismatched = [r.prompt for r in rows if not r.prompt_tokens_match]
    if mismatched:
        problems.append(f"the prompt tokenizes differently for {len(mismatched)} prompt(s) (first: {mismatched[0]!r})")
    if rows and agreement < bounds["min_agreement"]:
        worst = min(rows, key=lambda r: r.agreed / max(1, r.length))
        problems.append(f"token agreement {agreement:.1%} is below {bounds['min_agreement']:.0%} (worst: "
                        f"{worst.prompt!r} agrees for {worst.agreed} of {worst.length} tokens)")
    if max_diff > bounds["max_logprob_diff"]:
        problems.append(f"the largest logprob difference on agreed tokens is {max_diff:.3g}, above "
                        f"{bounds['max_logprob_diff']:g}")
    return Comparison(tuple(rows), agreement, max_diff, bounds, tuple(problems))


# --- effects: the endpoint, the reference script, golden files ----------------------------------------------------

def served_model_name(url: str, api_key: str | None, timeout: float = 10.0) -> str:
    answer = http_request(url.rstrip("/") + "/v1/models", timeout=timeout, api_key=api_key)
    if answer is None:
        raise EnvironmentMissingError(f"nothing answers at {url}",
                                      "start the engine (`npuops launch`) or fix --endpoint")
    status, body = answer
    try:
        return str(loads_json(body)["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise BadInputError(f"{url}/v1/models answered HTTP {status} without a model",
                            "pass --model NAME, or check --endpoint and --api-key-file") from None


def query_endpoint(url: str, model: str, prompts: Sequence[str], max_tokens: int, *, api_key: str | None,
                   dtype: str, timeout: float = 120.0) -> GenerationSet:
    generations = []
    started = time.monotonic()
    for prompt in prompts:
        request = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1,
                   "ignore_eos": True, "return_token_ids": True}
        answer = http_request(url.rstrip("/") + "/v1/completions", data=request, timeout=timeout, api_key=api_key)
        if answer is None:
            raise EnvironmentMissingError(f"nothing answers at {url}", "start the engine or fix --endpoint")
        status, body = answer
        if status != 200:
            raise BadInputError(f"{url} answered HTTP {status}: {body[:200].decode('utf-8', 'replace')}",
                                "check --model and --api-key-file")
        try:
            generations.append(parse_completion(body, prompt))
        except ParseError as exc:
            raise BadInputError(f"{url}: {exc}",
                                "serve with vLLM (it supports logprobs and return_token_ids)") from None
    return GenerationSet(f"endpoint {url}", model, dtype, max_tokens, tuple(generations),
                         {"seconds": round(time.monotonic() - started, 2), "npuops": __version__})


def reference_source() -> str:
    return Path(__file__).with_name("reference_script.py").read_text(encoding="utf-8")


def transformers_reference(runner: CommandRunner, python: str, model_dir: Path, dtype: str, prompts: Sequence[str],
                           max_tokens: int, *, env: Mapping[str, str], timeout: float = 600.0) -> GenerationSet:
    """Greedy answers computed with transformers on the CPU, in the serving stack's interpreter."""
    if not (model_dir / "config.json").is_file():
        raise BadInputError(f"{model_dir} is not a model directory (no config.json)", "pass the model's directory")
    config = {"model": str(model_dir), "dtype": dtype, "prompts": list(prompts), "max_tokens": max_tokens}
    run_env = dict(env)
    run_env.setdefault("HF_HUB_OFFLINE", "1")
    result: CommandResult = runner.run(
        (python, "-c", reference_source(), json.dumps(config)), timeout=timeout, env=run_env)
    if not result.ok:
        said = (result.stderr or result.error or "").strip().splitlines()
        last = said[-1] if said else f"exit status {result.returncode}"
        if "No module named" in last:
            raise EnvironmentMissingError(f"{python} cannot compute a reference: {last}",
                                          "use the serving stack's interpreter (NPUOPS_STACK_PYTHON) with torch and "
                                          "transformers, or compare against a golden file (--golden)")
        raise EnvironmentMissingError(f"the transformers reference failed: {last}",
                                      "compare against a golden file (--golden) instead")
    try:
        return parse_generation_set(json.loads(result.stdout), "the transformers reference")
    except (ValueError, ParseError) as exc:
        raise EnvironmentMissingError(f"the transformers reference printed no result ({exc})",
                                      "compare against a golden file (--golden) instead") from None


def write_golden(path: Path, generations: GenerationSet) -> None:
    write_text_atomic(path, json.dumps(generations.to_json(), indent=1) + "\n", mode=0o644)


def load_golden(path: Path) -> GenerationSet:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInputError(f"cannot read golden file {path}: {exc.strerror}",
                            "record one with `npuops golden record --endpoint URL --output FILE`") from None
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != GOLDEN_FORMAT:
            raise ParseError("served generations", f"not a {GOLDEN_FORMAT} file")
        golden = parse_generation_set(data, str(path))
    except (ValueError, ParseError) as exc:
        raise ConfigError(f"{path} is not an npuops golden file ({exc})",
                          "record it again with `npuops golden record`") from None
    return replace_source(golden, f"golden {path}")


def replace_source(generations: GenerationSet, source: str) -> GenerationSet:
    return GenerationSet(source, generations.model, generations.dtype, generations.max_tokens,
                         generations.generations, generations.meta)


def model_dtype(model_dir: Path) -> str:
    """The dtype a model directory declares (config.json torch_dtype / dtype), float32 when it says nothing."""
    try:
        config = loads_json((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "float32"
    value = config.get("dtype") or config.get("torch_dtype") or "float32"
    return str(value)

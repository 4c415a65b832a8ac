"""Served-model precision: the model behind an endpoint answers like the reference (npuops/precision/served.py)."""

from __future__ import annotations

from typing import Any

from npuops.doctor.context import CheckContext
from npuops.doctor.model import Check, Result, Severity
from npuops.errors import EnvironmentMissingError
from npuops.hardware.python_stack import stack_interpreter
from npuops.precision.served import (
    GenerationSet,
    compare,
    load_golden,
    load_served_config,
    model_dtype,
    query_endpoint,
    served_model_name,
    transformers_reference,
)

# dtype spellings vLLM accepts, as the bounds name them.
_DTYPES = {"half": "float16", "fp16": "float16", "float16": "float16", "bf16": "bfloat16", "bfloat16": "bfloat16",
           "float": "float32", "fp32": "float32", "float32": "float32"}
REFERENCE_TIMEOUT_S = 900.0

FIX = ("the served model does not answer like the reference: compare the model directory's files with their source "
       "(sha256 of the safetensors), check the dtype suits the chip (bf16 needs A2/A3), and check the kernels with "
       "`npuops doctor --level 3 --only op-precision`; record a golden file only from a run you trust")


def normalize_dtype(value: str | None) -> str | None:
    return _DTYPES.get(value.lower()) if value else None


class ServedPrecision(Check):
    """Greedy answers of the endpoint to fixed prompts match a golden file or a transformers reference."""

    id = "served-precision"
    area = "precision"
    severity = Severity.HIGH
    level = 3
    tags = ("verify",)

    def run(self, ctx: CheckContext) -> Result:
        options = ctx.options
        if not options.endpoint:
            return Result.skip("no endpoint given", "pass --endpoint URL with --golden FILE or --reference-model DIR")
        if options.golden is None and options.reference_model is None:
            return Result.skip("no reference to compare with",
                               "pass --golden FILE (from `npuops golden record`) or --reference-model DIR")
        config = load_served_config()
        golden = load_golden(options.golden) if options.golden is not None else None
        prompts = [g.prompt for g in golden.generations] if golden else list(config.prompts)
        max_tokens = golden.max_tokens if golden else config.max_tokens
        declared = golden.dtype if golden else model_dtype(options.reference_model)  # type: ignore[arg-type]
        dtype = normalize_dtype(options.served_dtype) or normalize_dtype(declared) or "float32"
        bounds = config.bounds_for(dtype)
        try:
            model = options.served_model or served_model_name(options.endpoint, options.api_key)
            served = query_endpoint(options.endpoint, model, prompts, max_tokens, api_key=options.api_key,
                                    dtype=dtype)
        except EnvironmentMissingError as exc:
            return Result.fail(exc.problem, exc.fix, endpoint=options.endpoint)
        reference: GenerationSet
        if golden is not None:
            reference = golden
        else:
            assert options.reference_model is not None
            try:
                reference = transformers_reference(
                    ctx.probe.runner, stack_interpreter(ctx.probe), options.reference_model, "float32", prompts,
                    max_tokens, env=dict(ctx.settings.environ), timeout=REFERENCE_TIMEOUT_S)
            except EnvironmentMissingError as exc:
                return Result.skip(exc.problem, exc.fix, endpoint=options.endpoint)
        result = compare(reference, served, bounds)
        evidence: dict[str, Any] = {"endpoint": options.endpoint, "model": model, "dtype": dtype,
                                    "reference": reference.source, "max_tokens": max_tokens, **result.to_json()}
        summary = (f"{len(result.prompts)} prompts x {max_tokens} tokens: agreement {result.agreement:.1%}, largest "
                   f"logprob difference {result.max_logprob_diff:.2g} (bounds for {dtype}: "
                   f">= {bounds['min_agreement']:.0%}, <= {bounds['max_logprob_diff']:g}) against {reference.source}")
        if result.ok:
            return Result.passed(summary, **evidence)
        return Result.fail(f"{'; '.join(result.problems)} ({summary})", FIX, **evidence)

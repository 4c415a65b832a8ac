"""The operator precision suite: LLM kernels in float16/bfloat16 on a device against a float64 reference.

This file is a script, not a module npuops imports: its text is sent to the serving stack's interpreter
(`python -c <this source> <config JSON>`), which has torch (and torch_npu on an Ascend node) but maybe not npuops.
So it needs only the standard library and torch, and keeps every line of torch code npuops has.

For each op and dtype it draws fixed, seeded inputs in float64 on the CPU, rounds them to the dtype, runs the op
on the device in that dtype, and computes the reference in float64 on the CPU *from the rounded inputs*: the
difference is then the kernel's arithmetic, not the quantization of its inputs. One JSON document goes to stdout:

    {"suite": 1, "torch": ..., "torch_npu": ..., "device": "cpu"|"npu", "device_name": ..., "size": ...,
     "seed": ..., "inject": ..., "results": [{op, dtype, impl, dims, shape, elements, max_abs_err, max_rel_err,
     cosine, ref_max_abs, normalized_err, nonfinite, seconds, injected}, ...], "errors": [{op, dtype, error}]}

An op that raises is an entry of "errors", not a crash. When torch (or torch_npu) cannot be imported, or the
config is bad, the document is {"suite": 1, "fatal": {"stage": ..., "error": ...}} and the exit code is 3 (2 for
a bad config).

Config (argv[1], JSON): {"device": "cpu"|"npu", "device_index": 0, "dtypes": ["bfloat16", "float16"],
"ops": null (all) or a list, "size": "small"|"full"|null (small on cpu, full on npu), "seed": 0,
"threads": null or the CPU threads for the reference, "inject": null or "<op>:<fault>"}.

"inject" is the check's self-test: it swaps in a deliberately wrong kernel so a test can prove the check fails
(FAULTS below). It is off unless a config asks for it, and every result it touched says so ("injected").
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

SUITE_FORMAT = 1
OPS = ("matmul", "bmm", "softmax", "layer_norm", "rms_norm", "rotary", "sdpa", "silu", "gelu")
DTYPES = ("bfloat16", "float16")
SIZES = ("small", "full")

# Shapes. "full" is what an LLM runs on an NPU (a 4096-hidden model: Llama-3-8B / Qwen-7B class, 2048-token
# prefill chunks, 4096-token attention). "small" keeps every reduction length realistic (K = 4096 for matmul,
# head_dim 128, hidden 4096 for the norms, 1024 keys for attention) but has fewer rows and heads, so the float64
# reference takes seconds on a 2-core CPU. Rounding error depends on the reduction length and the value
# distribution, not on how many rows there are, so "small" judges the arithmetic as well as "full" does.
SHAPES: dict[str, dict[str, tuple[int, ...]]] = {
    "small": {
        "matmul": (128, 4096, 4096),  # tokens, in features (K), out features
        "bmm": (8, 256, 128),  # heads, sequence, head_dim: q @ k^T
        "softmax": (32, 32000),  # rows, vocabulary (Llama-2)
        "layer_norm": (512, 4096),  # tokens, hidden
        "rms_norm": (512, 4096),
        "rotary": (1024, 8, 128),  # tokens (positions 0..n-1), heads, head_dim
        "sdpa": (4, 1024, 128),  # heads, sequence, head_dim (causal)
        "silu": (128, 14336),  # tokens, intermediate (Llama-3-8B)
        "gelu": (128, 14336),
    },
    "full": {
        "matmul": (2048, 4096, 4096),
        "bmm": (32, 1024, 128),
        "softmax": (256, 152064),  # Qwen2 vocabulary
        "layer_norm": (4096, 4096),
        "rms_norm": (4096, 4096),
        "rotary": (4096, 32, 128),
        "sdpa": (32, 4096, 128),
        "silu": (2048, 14336),
        "gelu": (2048, 14336),
    },
}

# What each number of a shape is, for the report.
DIMS: dict[str, tuple[str, ...]] = {
    "matmul": ("tokens", "in", "out"), "bmm": ("heads", "seq", "head_dim"), "softmax": ("rows", "vocab"),
    "layer_norm": ("tokens", "hidden"), "rms_norm": ("tokens", "hidden"), "rotary": ("tokens", "heads", "head_dim"),
    "sdpa": ("heads", "seq", "head_dim"), "silu": ("tokens", "intermediate"), "gelu": ("tokens", "intermediate"),
}

# max_rel_err divides |out - ref| by max(|ref|, REL_FLOOR * max|ref|): elements far below the output's scale
# (softmax tails, activations near zero, fp16 subnormals) are judged against that floor instead of exploding.
REL_FLOOR = 1e-3

RMS_EPS = 1e-6  # Llama/Qwen rms_norm_eps
LN_EPS = 1e-5  # torch.nn.LayerNorm's default (GPT-NeoX, Falcon)
ROPE_BASE = 1e6  # rope_theta of Qwen2/Qwen3; the highest frequency (the hardest to round) is 1 for any base
SOFTMAX_LOGIT_STD = 4.0  # LM logits: the largest of 32k draws is about +17, beyond fp16's exp() range
ACTIVATION_STD = 3.0  # gate projections spread over the nonlinear part of SiLU/GELU

# The self-test faults: a wrong kernel each, for the op before the colon.
PERTURB_DELTA = 16.0  # matmul:perturb adds 16 (16 sigma) to one element of the activation
ACCUMULATE_CHUNK = 16  # matmul:fp16-accumulate rounds the running sum to the dtype after every 16 products of K
FAULTS: dict[str, tuple[str, ...]] = {
    "matmul": ("perturb", "fp16-accumulate"),
    "softmax": ("no-max-subtraction",),
    "rotary": ("low-precision-angles",),
}


class ConfigError(ValueError):
    pass


def read_config(text: str) -> dict[str, Any]:
    """The config with its defaults filled in; ConfigError on anything unknown."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"config is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError("config is not a JSON object")
    device = raw.get("device", "cpu")
    if device not in ("cpu", "npu"):
        raise ConfigError(f"unknown device {device!r} (cpu or npu)")
    dtypes = raw.get("dtypes") or list(DTYPES)
    ops = raw.get("ops") or list(OPS)
    for dtype in dtypes:
        if dtype not in DTYPES:
            raise ConfigError(f"unknown dtype {dtype!r} ({', '.join(DTYPES)})")
    for op in ops:
        if op not in OPS:
            raise ConfigError(f"unknown op {op!r} ({', '.join(OPS)})")
    size = raw.get("size") or ("full" if device == "npu" else "small")
    if size not in SIZES:
        raise ConfigError(f"unknown size {size!r} ({', '.join(SIZES)})")
    inject = raw.get("inject")
    if inject is not None:
        op, _, fault = str(inject).partition(":")
        if fault not in FAULTS.get(op, ()):
            known = ", ".join(f"{o}:{f}" for o, fs in FAULTS.items() for f in fs)
            raise ConfigError(f"unknown fault {inject!r} ({known})")
    threads = raw.get("threads")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"threads must be a positive integer, not {threads!r}")
    return {"device": device, "device_index": int(raw.get("device_index") or 0), "dtypes": list(dtypes),
            "ops": list(ops), "size": size, "seed": int(raw.get("seed") or 0), "threads": threads,
            "inject": inject}


class Suite:
    """Inputs, the device op and the float64 reference for each op; `run(op, dtype)` returns a result dict."""

    def __init__(self, torch: Any, torch_npu: Any, config: dict[str, Any]) -> None:
        self.torch = torch
        self.torch_npu = torch_npu
        self.F = torch.nn.functional
        self.config = config
        self.shapes = SHAPES[config["size"]]
        self.device = torch.device("cpu") if config["device"] == "cpu" else torch.device(
            f"npu:{config['device_index']}")
        op, _, fault = (config["inject"] or "").partition(":")
        self.fault_op, self.fault = (op, fault) if config["inject"] else ("", "")
        self.ops: dict[str, Callable[[Any, str], tuple[Any, Any, str]]] = {
            "matmul": self.matmul, "bmm": self.bmm, "softmax": self.softmax, "layer_norm": self.layer_norm,
            "rms_norm": self.rms_norm, "rotary": self.rotary, "sdpa": self.sdpa, "silu": self.silu,
            "gelu": self.gelu,
        }

    # --- inputs -----------------------------------------------------------------------------------------------

    def generator(self, op: str) -> Any:
        """One generator per op, seeded from the seed and the op's name: an op draws the same inputs whatever
        other ops run, and both dtypes round the same float64 draws."""
        seed = (self.config["seed"] * 1_000_003 + zlib.crc32(op.encode())) % (2**63)
        return self.torch.Generator(device="cpu").manual_seed(seed)

    def normal(self, gen: Any, *shape: int, std: float = 1.0, mean: float = 0.0) -> Any:
        return self.torch.randn(*shape, generator=gen, dtype=self.torch.float64) * std + mean

    def rounded(self, x: Any, dtype: Any) -> tuple[Any, Any]:
        """(x in the dtype on the device, the same values in float64 on the CPU for the reference)."""
        low = x.to(dtype)
        return low.to(self.device), low.to(self.torch.float64)

    def faulty(self, op: str, fault: str) -> bool:
        return self.fault_op == op and self.fault == fault

    # --- the ops: each returns (device output, float64 reference, which implementation ran) ----------------------

    def matmul(self, dtype: Any, name: str) -> tuple[Any, Any, str]:
        """A linear layer as vLLM runs it (F.linear, weight [out, in]); weights ~ N(0, 1/fan_in)."""
        F = self.F
        m, k, n = self.shapes["matmul"]
        gen = self.generator("matmul")
        x, w = self.normal(gen, m, k), self.normal(gen, n, k, std=1 / math.sqrt(k))
        xd, xr = self.rounded(x, dtype)
        wd, wr = self.rounded(w, dtype)
        ref = xr @ wr.T
        impl = "F.linear"
        if self.faulty("matmul", "perturb"):
            xd = xd.clone()
            xd[0, 0] += PERTURB_DELTA
            impl += f" with x[0,0] += {PERTURB_DELTA:g}"
        if self.faulty("matmul", "fp16-accumulate"):
            out = None
            for start in range(0, k, ACCUMULATE_CHUNK):
                part = F.linear(xd[:, start:start + ACCUMULATE_CHUNK], wd[:, start:start + ACCUMULATE_CHUNK])
                out = part if out is None else out + part  # the running sum is rounded to the dtype each time
            impl = f"F.linear over K in chunks of {ACCUMULATE_CHUNK}, summed in {name}"
            return out, ref, impl
        return F.linear(xd, wd), ref, impl

    def bmm(self, dtype: Any, name: str) -> tuple[Any, Any, str]:
        """Attention scores q @ k^T, batched over heads (a reduction over head_dim)."""
        torch = self.torch
        heads, seq, dim = self.shapes["bmm"]
        gen = self.generator("bmm")
        qd, qr = self.rounded(self.normal(gen, heads, seq, dim), dtype)
        kd, kr = self.rounded(self.normal(gen, heads, seq, dim), dtype)
        return torch.bmm(qd, kd.transpose(1, 2)), torch.bmm(qr, kr.transpose(1, 2)), "torch.bmm"

    def softmax(self, dtype: Any, name: str) -> tuple[Any, Any, str]:
        """Softmax over LM logits (last dim)."""
        torch = self.torch
        rows, vocab = self.shapes["softmax"]
        xd, xr = self.rounded(self.normal(self.generator("softmax"), rows, vocab, std=SOFTMAX_LOGIT_STD), dtype)
        ref = torch.softmax(xr, dim=-1)
        if self.faulty("softmax", "no-max-subtraction"):
            e = torch.exp(xd)
            return e / e.sum(dim=-1, keepdim=True), ref, f"exp(x) / sum(exp(x)) in {name}, no max subtraction"
        return torch.softmax(xd, dim=-1), ref, "torch.softmax"

    def layer_norm(self, dtype: Any, name: str) -> tuple[Any, Any, str]:
        F = self.F
        tokens, hidden = self.shapes["layer_norm"]
        gen = self.generator("layer_norm")
        xd, xr = self.rounded(self.normal(gen, tokens, hidden, std=2.0, mean=0.5), dtype)
        wd, wr = self.rounded(self.normal(gen, hidden, std=0.1, mean=1.0), dtype)
        bd, br = self.rounded(self.normal(gen, hidden, std=0.1), dtype)
        return (F.layer_norm(xd, (hidden,), wd, bd, LN_EPS), F.layer_norm(xr, (hidden,), wr, br, LN_EPS),
                "F.layer_norm")

    def rms_norm(self, dtype: Any, name: str) -> tuple[Any, Any, str]:
        """vllm-ascend's AscendRMSNorm on an NPU (torch_npu.npu_rms_norm); elsewhere vLLM's forward_native:
        normalise in float32, cast to the dtype, multiply by the weight in the dtype."""
        torch = self.torch
        tokens, hidden = self.shapes["rms_norm"]
        gen = self.generator("rms_norm")
        xd, xr = self.rounded(self.normal(gen, tokens, hidden, std=2.0), dtype)
        wd, wr = self.rounded(self.normal(gen, hidden, std=0.1, mean=1.0), dtype)
        ref = xr * torch.rsqrt(xr.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS) * wr
        fused = getattr(self.torch_npu, "npu_rms_norm", None) if self.torch_npu is not None else None
        if fused is not None:
            return fused(xd, wd, RMS_EPS)[0], ref, "torch_npu.npu_rms_norm"
        xf = xd.float()
        out = (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS)).to(xd.dtype) * wd
        return out, ref, "vLLM forward_native (float32, then * weight)"

    def rotary(self, dtype: Any, name: str) -> tuple[Any, Any, str]:
        """Neox-style rotary embedding of q for positions 0..n-1 (a prefill), as vLLM's RotaryEmbedding does it:
        the cos/sin cache in float32, cast to the dtype, then x1*cos - x2*sin, x2*cos + x1*sin. The reference
        takes cos/sin exactly in float64, so the cache's own rounding counts (it is part of what is served)."""
        torch = self.torch
        tokens, heads, dim = self.shapes["rotary"]
        half = dim // 2
        qd, qr = self.rounded(self.normal(self.generator("rotary"), tokens, heads, dim), dtype)
        exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
        angles = torch.outer(torch.arange(tokens, dtype=torch.float64), 1.0 / (ROPE_BASE ** exponents))
        cos_r, sin_r = angles.cos()[:, None, :], angles.sin()[:, None, :]
        x1, x2 = qr[..., :half], qr[..., half:]
        ref = torch.cat((x1 * cos_r - x2 * sin_r, x2 * cos_r + x1 * sin_r), dim=-1)

        positions = torch.arange(tokens, device=self.device)
        impl = "vLLM forward_native (float32 cache)"
        if self.faulty("rotary", "low-precision-angles"):
            inv_freq = (1.0 / (ROPE_BASE ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))).to(dtype)
            freqs = positions.to(dtype)[:, None] * inv_freq.to(self.device)[None, :]
            impl = f"angles computed in {name}"
        else:
            inv_freq = 1.0 / (ROPE_BASE ** (torch.arange(0, dim, 2, dtype=torch.float32, device=self.device) / dim))
            freqs = torch.outer(positions.float(), inv_freq)
        cos, sin = freqs.float().cos().to(dtype), freqs.float().sin().to(dtype)  # [tokens, half]
        fused = getattr(self.torch_npu, "npu_rotary_mul", None) if self.torch_npu is not None else None
        if fused is not None:
            # torch_npu's RotaryMul, "half" mode: x * r1 + cat(-x2, x1) * r2 with x [B, S, N, D], r [1, S, 1, D].
            r1 = torch.cat((cos, cos), dim=-1)[None, :, None, :]
            r2 = torch.cat((sin, sin), dim=-1)[None, :, None, :]
            return fused(qd[None], r1, r2)[0], ref, impl.replace("vLLM forward_native", "torch_npu.npu_rotary_mul")
        c, s = cos[:, None, :], sin[:, None, :]
        q1, q2 = qd[..., :half], qd[..., half:]
        return torch.cat((q1 * c - q2 * s, q2 * c + q1 * s), dim=-1), ref, impl

    def sdpa(self, dtype: Any, name: str) -> tuple[Any, Any, str]:
        """Causal scaled-dot-product attention (prefill), reference head by head in float64."""
        torch, F = self.torch, self.F
        heads, seq, dim = self.shapes["sdpa"]
        gen = self.generator("sdpa")
        qd, qr = self.rounded(self.normal(gen, 1, heads, seq, dim), dtype)
        kd, kr = self.rounded(self.normal(gen, 1, heads, seq, dim), dtype)
        vd, vr = self.rounded(self.normal(gen, 1, heads, seq, dim), dtype)
        out = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True)
        mask = torch.ones(seq, seq, dtype=torch.bool).tril()
        ref = torch.empty(1, heads, seq, dim, dtype=torch.float64)
        for h in range(heads):  # one [seq, seq] score matrix at a time keeps "full" within memory
            scores = (qr[0, h] @ kr[0, h].T) / math.sqrt(dim)
            ref[0, h] = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ vr[0, h]
        return out, ref, "F.scaled_dot_product_attention(is_causal=True)"

    def silu(self, dtype: Any, name: str) -> tuple[Any, Any, str]:
        F = self.F
        tokens, inter = self.shapes["silu"]
        xd, xr = self.rounded(self.normal(self.generator("silu"), tokens, inter, std=ACTIVATION_STD), dtype)
        return F.silu(xd), xr * self.torch.sigmoid(xr), "F.silu"

    def gelu(self, dtype: Any, name: str) -> tuple[Any, Any, str]:
        """GELU with the tanh approximation: the one LLMs that use GELU run (Gemma's gelu_pytorch_tanh, GPT-2's
        gelu_new); the reference evaluates the same formula in float64, so only arithmetic is measured."""
        torch, F = self.torch, self.F
        tokens, inter = self.shapes["gelu"]
        xd, xr = self.rounded(self.normal(self.generator("gelu"), tokens, inter, std=ACTIVATION_STD), dtype)
        ref = 0.5 * xr * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (xr + 0.044715 * xr.pow(3))))
        return F.gelu(xd, approximate="tanh"), ref, "F.gelu(approximate='tanh')"

    # --- measuring ------------------------------------------------------------------------------------------------

    def synchronize(self) -> None:
        if self.config["device"] == "npu":
            self.torch.npu.synchronize()

    def run(self, op: str, name: str) -> dict[str, Any]:
        torch = self.torch
        start = time.monotonic()
        with torch.no_grad():
            out, ref, impl = self.ops[op](getattr(torch, name), name)
            self.synchronize()
            result = measure(torch, out.detach().to("cpu"), ref)
        result.update(op=op, dtype=name, impl=impl, dims={n: self.shapes[op][i] for i, n in enumerate(DIMS[op])},
                      seconds=round(time.monotonic() - start, 3),
                      injected=self.config["inject"] if self.fault_op == op else None)
        return result


def measure(torch: Any, out: Any, ref: Any) -> dict[str, Any]:
    """The error metrics of one output against its float64 reference. Non-finite outputs leave the error
    metrics null (JSON has no inf/nan) and are counted."""
    got = out.to(torch.float64)
    if tuple(got.shape) != tuple(ref.shape):
        raise ValueError(f"output shape {tuple(got.shape)} differs from the reference's {tuple(ref.shape)}")
    ref_max = float(ref.abs().max())
    result: dict[str, Any] = {"shape": list(ref.shape), "elements": int(ref.numel()), "ref_max_abs": ref_max,
                              "nonfinite": int((~torch.isfinite(got)).sum())}
    if result["nonfinite"]:
        result.update(max_abs_err=None, max_rel_err=None, cosine=None, normalized_err=None)
        return result
    diff = (got - ref).abs()
    max_abs = float(diff.max())
    floor = max(ref_max * REL_FLOOR, sys.float_info.min)
    got_flat, ref_flat = got.flatten(), ref.flatten()
    norms = float(got_flat.norm()) * float(ref_flat.norm())
    cosine = float(got_flat @ ref_flat) / norms if norms > 0 else (1.0 if max_abs == 0 else 0.0)
    result.update(max_abs_err=max_abs, max_rel_err=float((diff / ref.abs().clamp_min(floor)).max()),
                  cosine=cosine, normalized_err=max_abs / ref_max if ref_max > 0 else max_abs)
    return result


def fatal(stage: str, exc: BaseException | str, code: int) -> int:
    error = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    print(json.dumps({"suite": SUITE_FORMAT, "fatal": {"stage": stage, "error": error}}))
    return code


def main(argv: list[str]) -> int:
    # A torch_npu source checkout in the working directory must not shadow the installed one (Ascend/pytorch#24).
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    try:
        config = read_config(argv[0] if argv else "{}")
    except (ValueError, TypeError) as exc:  # ConfigError, or a value of the wrong type
        return fatal("config", str(exc), 2)
    try:
        import torch  # type: ignore[import-not-found]
    except Exception as exc:  # noqa: BLE001 - any import failure means "no usable torch here"
        return fatal("import torch", exc, 3)
    torch_npu = None
    if config["device"] == "npu":
        try:
            import torch_npu  # type: ignore[import-not-found,no-redef]
        except Exception as exc:  # noqa: BLE001
            return fatal("import torch_npu", exc, 3)
        try:
            torch.npu.set_device(config["device_index"])
            device_name = str(torch.npu.get_device_name(config["device_index"]))
        except Exception as exc:  # noqa: BLE001
            return fatal("open npu", exc, 3)
    else:
        device_name = platform.processor() or platform.machine() or "cpu"
    if config["threads"]:
        torch.set_num_threads(config["threads"])
    suite = Suite(torch, torch_npu, config)
    results: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for op in config["ops"]:
        for name in config["dtypes"]:
            try:
                results.append(suite.run(op, name))
            except Exception as exc:  # noqa: BLE001 - one broken kernel must not hide the others
                errors.append({"op": op, "dtype": name, "error": f"{type(exc).__name__}: {exc}"[:500]})
    npu_version = getattr(torch_npu, "__version__", None) if torch_npu is not None else None
    print(json.dumps({
        "suite": SUITE_FORMAT,
        "torch": str(torch.__version__),
        "torch_npu": str(npu_version) if npu_version else None,
        "device": config["device"],
        "device_name": device_name,
        "size": config["size"],
        "seed": config["seed"],
        "threads": int(torch.get_num_threads()),
        "inject": config["inject"],
        "results": results,
        "errors": errors,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

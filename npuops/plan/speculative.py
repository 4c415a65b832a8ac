"""Speculative decoding: which method a plan uses, with how many draft tokens, and what it costs and gains.

`plan_speculative` turns `--speculative METHOD[:K]` (or nothing: the plan takes the model's own MTP layers where it
ships them) into one `SpeculativePlan`, gated by the release (npuops/data/speculative.toml) and vllm-ascend's
limits; its `config()` is vLLM's `speculative_config`. The memory plan adds the draft's weights and KV layers, the
performance model the draft's forwards and the tokens a step yields: 1 + k x the draft acceptance rate (vLLM's
accepted / draft tokens, the figure its /metrics report and `npuops bench` measures).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from npuops.datafiles import load_data_toml
from npuops.errors import BadInputError
from npuops.plan.catalog import catalog_entry
from npuops.plan.environment import parse_release
from npuops.plan.memory import kv_bytes_per_token, kv_page_bytes_per_layer
from npuops.plan.model import ModelArch, ModelSpec, dtype_bytes, mtp_layer_parameters

NONE = "none"
# Draft tokens a plan proposes when the operator names a method without K: one for MTP (what vllm-ascend's
# tutorials run for DeepSeek and GLM), three for the others (their tutorials' choice).
_DEFAULT_TOKENS = {"mtp": 1}
_DEFAULT_OTHER_TOKENS = 3
# What the CPU engine's proposers run here (vLLM's ngram proposer is plain Python and numpy; the others need a
# draft forward the CPU model runner does not schedule).
_CPU_METHODS = ("ngram",)


@dataclass(frozen=True)
class SpecMethod:
    name: str
    since: str
    draft: str  # "none" | "model" | "mtp_head"
    acceptance: float  # default chance one draft position is accepted
    why: str
    source: str
    legacy_name: str | None = None
    legacy_since: str | None = None
    parallel: bool = False  # the proposer drafts all k tokens in one forward (block diffusion)
    # The draft a plan assumes without --draft-model (a capacity plan is made before the draft is downloaded):
    # "eagle3_head" or "eagle_head" (usual_draft_head); "" for a method whose draft has no usual shape.
    usual_draft: str = ""


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    return load_data_toml("speculative.toml")


@lru_cache(maxsize=1)
def spec_methods() -> dict[str, SpecMethod]:
    return {name: SpecMethod(name=name, since=str(raw["since"]), draft=str(raw["draft"]),
                             acceptance=float(raw["acceptance"]), why=str(raw["why"]), source=str(raw["source"]),
                             legacy_name=raw.get("legacy_name"), legacy_since=raw.get("legacy_since"),
                             parallel=bool(raw.get("parallel", False)), usual_draft=str(raw.get("usual_draft", "")))
            for name, raw in _table()["methods"].items()}


def max_tokens_per_step() -> int:
    return int(_table()["max_tokens_per_step"])


def parse_speculative(text: str) -> tuple[str, int | None]:
    """`mtp`, `eagle3:3`, `none` -> (method, K or None)."""
    name, _, count = text.strip().lower().partition(":")
    aliases = {"deepseek_mtp": "mtp", "qwen3_next_mtp": "mtp", "qwen3_5_mtp": "mtp", "glm4_moe_mtp": "mtp",
               "draft": "draft_model"}
    name = aliases.get(name, name)
    if name != NONE and name not in spec_methods():
        raise BadInputError(f"unknown speculative method {text!r}",
                            f"use one of {', '.join(spec_methods())} (optionally :K draft tokens), or none")
    if not count:
        return name, None
    if not count.isdigit() or int(count) < 1:
        raise BadInputError(f"--speculative {text}: K must be a whole number of draft tokens, at least 1",
                            f"write it like {name}:2")
    return name, int(count)


def expected_acceptance(position_acceptance: float, tokens: int) -> float:
    """vLLM's draft acceptance rate for a per-position chance: position i is accepted only after the i-1 before
    it, so the rate is the mean of a^1 .. a^K."""
    return sum(position_acceptance ** i for i in range(1, tokens + 1)) / tokens


@dataclass(frozen=True)
class SpeculativePlan:
    method: str
    config_method: str  # the name this release's vLLM takes (deepseek_mtp before the generic mtp)
    num_tokens: int
    draft_model: str | None
    acceptance: float  # draft tokens accepted / proposed (vLLM's rate)
    # "default" (the method's) or "flag" (--spec-acceptance); `npuops bench` predicts with the rate it measures.
    acceptance_source: str
    draft_layers: int  # decoder layers one draft forward runs (0: no forward, the proposer works on text)
    draft_weight_bytes: int  # the draft's own weights (MTP layers or draft model), whole
    draft_kv_bytes_per_token: int  # the draft's KV per token, unsplit
    why: str
    chosen_by_plan: bool = False
    # Without --draft-model, what the plan assumed the draft is (usual_draft_head), "" when it read the real one.
    draft_assumed: str = ""
    # One draft forward proposes all k tokens (a block-diffusion method, or a draft model whose config carries
    # vLLM's parallel-drafting mask token, e.g. PARD); otherwise k forwards run one after another.
    parallel: bool = False

    @property
    def tokens_per_step(self) -> float:
        """Tokens a request gains per verified step: the bonus token plus the accepted drafts."""
        return 1.0 + self.num_tokens * self.acceptance

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "num_tokens": self.num_tokens, "acceptance": round(self.acceptance, 4),
                "acceptance_source": self.acceptance_source, "tokens_per_step": round(self.tokens_per_step, 4),
                "draft": {"model": self.draft_model, "assumed": bool(self.draft_assumed),
                          "what": self.draft_assumed or None, "layers": self.draft_layers,
                          "weight_bytes": self.draft_weight_bytes,
                          "kv_bytes_per_token": self.draft_kv_bytes_per_token}}

    def config(self) -> dict[str, Any]:
        """vLLM's speculative_config."""
        out: dict[str, Any] = {"method": self.config_method, "num_speculative_tokens": self.num_tokens}
        if self.draft_model:
            out["model"] = self.draft_model
        if self.parallel and not spec_methods()[self.method].parallel:
            out["parallel_drafting"] = True  # a PARD-style draft: vLLM's flag for one forward of k mask tokens
        return out


def _release_name(method: SpecMethod, release: str | None) -> str:
    """The method's name for this release, or a refusal naming the first release that has it."""
    if release is None or parse_release(release) >= parse_release(method.since):
        return method.name
    if method.legacy_name and method.legacy_since and parse_release(release) >= parse_release(method.legacy_since):
        return method.legacy_name
    first = method.legacy_since or method.since
    raise BadInputError(f"--speculative {method.name} needs vllm-ascend {first} or later (the plan is for {release})",
                        f"use --vllm-ascend-version {first} or later, or drop --speculative")


def _draft_sizes(method: SpecMethod, model: ModelSpec, draft: ModelSpec | None, kv_dtype_bytes: float
                 ) -> tuple[int, int, int]:
    """(layers per draft forward, draft weight bytes, draft KV bytes per token)."""
    arch = model.arch
    if method.draft == "mtp_head":
        per_layer = mtp_layer_parameters(arch)
        # MTP layers ship unquantized beside quantized checkpoints (DeepSeek's "float MTP weight").
        weights = int(arch.mtp_layers * per_layer.total * 2)
        return arch.mtp_layers, weights, kv_page_bytes_per_layer(arch, 1, kv_dtype_bytes, 1) * arch.mtp_layers
    if method.draft == "model" and draft is not None:
        d = draft.arch
        weights = draft.weight_bytes or 0
        if is_eagle3_head(d) and draft.weight_bytes_source == "architecture":
            weights = int(eagle3_head_parameters(d) * dtype_bytes(d.torch_dtype))
        return d.num_layers, weights, kv_bytes_per_token(d, kv_dtype_bytes)
    if method.draft == "model" and method.usual_draft:
        head, _ = usual_draft_head(method.usual_draft, arch)
        count = eagle3_head_parameters(head) if is_eagle3_head(head) else eagle_head_parameters(head)
        return head.num_layers, int(count * dtype_bytes(head.torch_dtype)), kv_bytes_per_token(head, kv_dtype_bytes)
    return 0, 0, 0


def usual_draft_head(kind: str, target: ModelArch) -> tuple[ModelArch, str]:
    """(the draft, what it is) a plan assumes for an EAGLE method without --draft-model: the shape published heads
    share, one Llama-style decoder layer of the target's width (its attention and KV heads, head size and dense FFN
    width; an MoE target's active experts' width where it has no dense one), in the target's dtype. EAGLE-3's head
    also has its own LM head, here over the target's whole vocabulary (published heads often keep fewer rows, e.g.
    32k for Llama-3.1-8B's: the plan errs towards memory); EAGLE-1's shares the target's."""
    ffn = target.intermediate_size or target.moe_intermediate_size * max(target.num_experts_per_tok, 1)
    eagle3 = kind == "eagle3_head"
    head = ModelArch(
        model_type="llama", architectures=("Eagle3LlamaForCausalLM" if eagle3 else "EagleLlamaForCausalLM",),
        num_layers=1, hidden_size=target.hidden_size, num_attention_heads=target.num_attention_heads,
        num_kv_heads=target.num_kv_heads, head_dim=target.head_dim, vocab_size=target.vocab_size,
        intermediate_size=ffn, max_position_embeddings=target.max_position_embeddings, tie_word_embeddings=False,
        torch_dtype=target.torch_dtype)
    what = (f"no draft on disk: assumed the usual {'EAGLE-3' if eagle3 else 'EAGLE'} head, one decoder layer of the "
            f"target's width ({target.hidden_size} hidden, FFN {ffn})"
            + (f" with its own LM head over {target.vocab_size} tokens" if eagle3 else " sharing its LM head")
            + "; --draft-model DIR plans with the real one")
    return head, what


def _llama_layer_parameters(d: ModelArch, width: int) -> int:
    """One Llama decoder layer whose attention reads `width`-wide inputs: q/k/v and o projections, the gated
    MLP, three norms."""
    h = d.hidden_size
    q_out, kv_out = d.num_attention_heads * d.head_dim, d.num_kv_heads * d.head_dim
    return width * (q_out + 2 * kv_out) + q_out * h + 3 * h * d.intermediate_size + 3 * h


def eagle_head_parameters(d: ModelArch) -> int:
    """Parameters of an EAGLE-1 head: fc fuses [embedding; hidden] (2h -> h) into its decoder layers; the embedding
    and LM head are the target's."""
    return 2 * d.hidden_size * d.hidden_size + d.num_layers * _llama_layer_parameters(d, d.hidden_size)


def is_eagle3_head(arch: ModelArch) -> bool:
    return any("eagle3" in name.lower() for name in arch.architectures)


def eagle3_head_parameters(d: ModelArch) -> int:
    """Parameters of an EAGLE-3 head as vLLM loads it (Eagle3LlamaForCausalLM): fc fuses three of the target's
    hidden states (3h -> h); the first layer's attention reads [embedding; hidden] (2h wide); the LM head has the
    head's own draft vocabulary; the input embedding is the target's (vLLM shares it), so it is not counted."""
    h = d.hidden_size
    layers = _llama_layer_parameters(d, 2 * h) + max(d.num_layers - 1, 0) * _llama_layer_parameters(d, h)
    return 3 * h * h + layers + (d.draft_vocab_size or d.vocab_size) * h + h


def _tokens(method: SpecMethod, asked: int | None) -> int:
    tokens = asked or _DEFAULT_TOKENS.get(method.name, _DEFAULT_OTHER_TOKENS)
    limit = max_tokens_per_step()
    if tokens + 1 > limit:
        raise BadInputError(f"--speculative {method.name}:{tokens}: vllm-ascend verifies at most {limit} tokens of a "
                            f"request per step (K + 1 <= {limit})", f"use K of at most {limit - 1}")
    return tokens


def plan_speculative(model: ModelSpec, *, npu: bool, release: str | None, asked: str | None,
                     draft: ModelSpec | None, acceptance: float | None, kv_dtype_bytes: float
                     ) -> SpeculativePlan | None:
    """The plan's speculative decoding, or None. Without --speculative an NPU plan takes the model's MTP layers
    (k=1) when the checkpoint ships them and the release runs MTP."""
    chosen = asked is None
    if asked is None:
        if not (npu and model.arch.mtp_layers > 0):
            return None
        name, count = "mtp", None
        try:
            _release_name(spec_methods()["mtp"], release)
        except BadInputError:
            return None
    else:
        name, count = parse_speculative(asked)
        if name == NONE:
            return None
    method = spec_methods()[name]
    if not npu and name not in _CPU_METHODS:
        raise BadInputError(f"--speculative {name} does not run on the CPU engine",
                            f"use --speculative {' or '.join(_CPU_METHODS)} with --hardware cpu")
    config_name = _release_name(method, release)
    if method.draft == "mtp_head" and model.arch.mtp_layers == 0:
        raise BadInputError(f"{model.served_name} ships no MTP layers (config.json's num_nextn_predict_layers / "
                            "mtp_num_hidden_layers is 0)",
                            "use --speculative ngram, or eagle3 / draft_model with --draft-model DIR")
    if method.draft == "model" and draft is None and not method.usual_draft:
        raise BadInputError(f"--speculative {name} needs its draft model",
                            "add --draft-model DIR (a local model directory or a catalog name)")
    if method.draft != "model" and draft is not None:
        raise BadInputError(f"--draft-model goes with a draft-model method, not {name}",
                            "drop --draft-model, or use --speculative eagle3 / draft_model")
    tokens = _tokens(method, count)
    if acceptance is not None and not 0.0 < acceptance <= 1.0:
        raise BadInputError(f"--spec-acceptance {acceptance} is not a rate", "give a number in (0, 1], e.g. 0.7")
    rate = acceptance if acceptance is not None else expected_acceptance(method.acceptance, tokens)
    layers, weights, kv = _draft_sizes(method, model, draft, kv_dtype_bytes)
    parallel = method.parallel or (method.draft == "model" and draft is not None and draft.arch.parallel_draft)
    return SpeculativePlan(method=name, config_method=config_name, num_tokens=tokens, draft_model=_draft_ref(draft),
                           acceptance=rate, acceptance_source="flag" if acceptance is not None else "default",
                           draft_layers=layers, draft_weight_bytes=weights, draft_kv_bytes_per_token=kv,
                           why=method.why, chosen_by_plan=chosen, parallel=parallel,
                           draft_assumed=usual_draft_head(method.usual_draft, model.arch)[1]
                           if method.draft == "model" and draft is None else "")


def require_draft_on_disk(spec: SpeculativePlan | None) -> None:
    """A launch needs the draft itself: vLLM loads it (speculative_config.model). A plan with an assumed draft is
    for capacity only."""
    if spec is not None and spec.draft_assumed:
        raise BadInputError(f"--speculative {spec.method} has no draft to load: the plan assumed one (no "
                            "--draft-model)", "download the draft and add --draft-model DIR")


def _draft_ref(draft: ModelSpec | None) -> str | None:
    """What speculative_config.model names: the draft's directory (absolute: the unit runs elsewhere), or for a
    catalog model its Hugging Face id (the plan then says the weights are not here)."""
    if draft is None:
        return None
    if draft.path is not None:
        return str(draft.path.resolve())
    entry = catalog_entry(draft.catalog_name) if draft.catalog_name else None
    return entry.hf_id if entry is not None else draft.served_name


def capture_sizes_for(sizes: tuple[int, ...], spec: SpeculativePlan | None, max_num_seqs: int) -> tuple[int, ...]:
    """Full-graph capture sizes with speculation: each a multiple of K + 1 (a step carries K + 1 tokens of each
    request), the largest max_num_seqs x (K + 1) (the v0.16.0rc1 MTP workaround,
    max_cudagraph_capture_size = max concurrency x (1 + k))."""
    if spec is None or not sizes:
        return sizes
    width = spec.num_tokens + 1
    return tuple(sorted({size * width for size in sizes} | {max_num_seqs * width}))

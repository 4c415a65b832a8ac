"""Small Llama models made locally (no hub): the demo's and the end-to-end tests' model, and one for benches.

`make_tiny_model(dest, seed=..., noise=..., size=...)` writes a complete Hugging Face model directory that vLLM (CPU
engine) and transformers both load: `config.json` (LlamaConfig, float32), random weights from the seed as
`model.safetensors`, and a byte-level BPE tokenizer (vocab 1024) trained on deterministic generated text, saved as a
`PreTrainedTokenizerFast` with bos/eos/pad tokens and a simple chat template. Two sizes (SHAPES):

- "tiny" (the default): hidden 64, 2 layers, 2 heads of 32. About 1 MB, a few seconds.
- "small": hidden 1024, 8 layers, 16 heads of 64, intermediate 2816: ~105 M parameters, about 420 MB on disk, made
  in well under a minute. Big enough that a benchmark measures the model rather than the framework's overhead
  (`npuops bench`), small enough for 2 CPU cores.

- Deterministic: the same seed and size give byte-identical files; the tokenizer does not depend on the seed or
  the size at all, so models made with different seeds, noise or sizes share it.
- `noise > 0` adds seeded Gaussian noise to every weight tensor, of that size relative to the tensor's RMS
  (||Δ|| / ||W|| ≈ noise): a "corrupted" copy of the seed's model, for precision checks that must fail.
- Weights are scaled so the model's next-token distribution is peaked rather than flat (greedy decoding then has
  clear winners, which keeps vLLM and transformers in agreement on an honest float32 run). Random weights still
  produce gibberish, often partial UTF-8: compare token ids and logprobs, never text.

torch, transformers and tokenizers are imported only inside the functions: they live in the engine venv
(scripts/engine-venv.sh), not in npuops' own dependencies.

Command line: `python -m npuops.demo_model DEST [--seed N] [--noise X] [--size tiny|small]`.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_POSITION_EMBEDDINGS = 2048
VOCAB_SIZE = 1024


@dataclass(frozen=True)
class ModelShape:
    """The Llama dimensions of one model size (all float32, untied LM head, one tokenizer for all)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int

    @property
    def head_dim(self) -> int:
        # The CPU attention backend needs head_dim in {32, 64, 80, 96, ...}.
        return self.hidden_size // self.num_heads


SHAPES: dict[str, ModelShape] = {
    # The tests' model: ~1 MB. Its files must stay byte-identical (golden files and expectations depend on them).
    "tiny": ModelShape(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=2),
    # A benchmark-sized model: ~105 M parameters, ~420 MB of float32, heads of 64; on 2 CPU cores a batch of 4
    # decodes at a few tens of ms a step, so a bench of a few dozen requests takes a minute or so.
    "small": ModelShape(hidden_size=1024, intermediate_size=2816, num_layers=8, num_heads=16, num_kv_heads=16),
}

BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)  # ids 0, 1, 2

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# Fixed, so every model shares one tokenizer whatever its weight seed.
_CORPUS_SEED = 20240611
_NOISE_SEED_OFFSET = 1_000_003

_WORD_TEXT = (
    "the a an of to in on for with by from and or but not is are was were be been has have had do does did "
    "model engine token tokens cache block blocks memory device devices chip chips node nodes server servers "
    "request requests batch latency throughput prompt prompts answer answers layer layers head heads weight "
    "weights tensor tensors kernel kernels precision float half bfloat int8 quant scale error errors check "
    "checks health ready start stop restart launch plan doctor status metrics log logs driver firmware toolkit "
    "ascend npu cpu gpu vllm llama tiny demo test tests hello world user assistant system you we they it this "
    "that what why how when where which who fast slow small large first last next one two three four five"
)
_WORDS = tuple(_WORD_TEXT.split())
_PUNCT = (".", ".", ".", "?", "!", ",")


def _corpus(n_sentences: int = 4000) -> Iterator[str]:
    """Deterministic generated text: words, numbers, punctuation, a few chat-looking lines, some non-ASCII."""
    rng = random.Random(_CORPUS_SEED)  # noqa: S311 - reproducible text, not cryptography
    extras = ("<|user|>", "<|assistant|>", "<|system|>", "é", "ü", "中文", "→", "°C", "{", "}", "[", "]", "=", ":")
    for _ in range(n_sentences):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words) + 1), str(rng.randint(0, 4096)))
        if rng.random() < 0.15:
            words.insert(rng.randrange(len(words) + 1), rng.choice(extras))
        sentence = " ".join(words)
        if rng.random() < 0.5:
            sentence = sentence[0].upper() + sentence[1:]
        yield sentence + rng.choice(_PUNCT)


def _train_tokenizer() -> Any:
    from tokenizers import (  # type: ignore[import-not-found]
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    bos_id = tok.token_to_id(BOS_TOKEN)
    # Like Llama: encoding a prompt puts BOS in front (vLLM and transformers both tokenize through this file).
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B", special_tokens=[(BOS_TOKEN, bos_id)]
            ),
        ]
    )
    return tok


def _init_weights(model: Any, seed: int) -> None:
    """Overwrite every parameter from one seeded generator, in sorted name order (independent of transformers'
    own init order). Linear weights ~ N(0, 1/fan_in) keep activations O(1); embeddings ~ N(0, 1); norms ~ 1 ± 0.1;
    the LM head ~ N(0, 4/hidden) makes logits ~ N(0, 4): a peaked next-token distribution."""
    import torch  # type: ignore[import-not-found]

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            values = torch.randn(param.shape, generator=gen, dtype=torch.float64)
            if name.endswith("norm.weight"):
                values = 1.0 + 0.1 * values
            elif "embed_tokens" in name:
                pass
            elif name.startswith("lm_head"):
                values = values * (2.0 / param.shape[1] ** 0.5)
            else:
                values = values / param.shape[-1] ** 0.5
            param.copy_(values.to(param.dtype))


def _add_noise(model: Any, seed: int, noise: float) -> None:
    import torch  # type: ignore[import-not-found]

    gen = torch.Generator().manual_seed(seed + _NOISE_SEED_OFFSET)
    with torch.no_grad():
        for _name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            values = param.detach().to(torch.float64)
            rms = values.pow(2).mean().sqrt()
            delta = torch.randn(param.shape, generator=gen, dtype=torch.float64) * (noise * rms)
            param.copy_((values + delta).to(param.dtype))


def make_tiny_model(dest: Path, *, seed: int = 0, noise: float = 0.0, size: str = "tiny") -> Path:
    """Write the Llama model directory of `size` (a key of SHAPES) to `dest` (created if needed; files already
    there are overwritten) and return it."""
    if size not in SHAPES:
        raise ValueError(f"size must be one of {', '.join(SHAPES)}, not {size!r}")
    shape = SHAPES[size]
    if seed < 0:
        raise ValueError(f"seed must be >= 0, not {seed}")
    if not noise >= 0.0:  # also rejects NaN
        raise ValueError(f"noise must be >= 0, not {noise}")

    import torch  # type: ignore[import-not-found]
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # type: ignore[import-not-found]

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(),
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=MAX_POSITION_EMBEDDINGS,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    _init_weights(model, seed)
    if noise > 0.0:
        _add_noise(model, seed, noise)
    model.eval()

    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    # transformers writes model.safetensors 0600; a service user (not the one who made the model) must read it.
    mode = 0o666 & ~_umask()
    for path in dest.iterdir():
        if path.is_file():
            path.chmod(mode)
    return dest


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m npuops.demo_model",
        description="Create the tiny Llama model of the demo and the end-to-end tests, or a larger one for benches "
        "(no download).",
    )
    parser.add_argument("dest", type=Path, help="model directory to write")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument(
        "--noise", type=float, default=0.0, help="relative Gaussian noise added to every weight (default 0: none)"
    )
    parser.add_argument(
        "--size", choices=tuple(SHAPES), default="tiny", help="tiny (default, ~1 MB) or small (~420 MB, for benches)"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        path = make_tiny_model(args.dest, seed=args.seed, noise=args.noise, size=args.size)
    except ValueError as exc:
        parser.error(str(exc))
    except ImportError as exc:
        print(
            f"npuops.demo_model: {exc}; run it with the engine venv's python (scripts/engine-venv.sh)",
            file=sys.stderr,
        )
        return 2
    print(path.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())

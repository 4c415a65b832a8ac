"""Greedy reference generations with transformers on the CPU: sent as source to the serving stack's interpreter.

Self-contained (standard library, torch and transformers only): the stack's interpreter may not have npuops. One
JSON argument: {"model": DIR, "dtype": "float32", "prompts": [...], "max_tokens": N}. For each prompt it tokenizes
as vLLM's completions endpoint does (the tokenizer's default special tokens), then decodes greedily with a KV cache
for exactly max_tokens tokens (end-of-sequence is not special, like `ignore_eos`), recording each chosen token's
log-probability from a float32 log_softmax of the logits (as vLLM computes them). Prints one JSON document.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> None:
    config = json.loads(argv[1])
    started = time.monotonic()
    import torch  # type: ignore[import-not-found]
    import transformers  # type: ignore[import-not-found]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    dtype = getattr(torch, config.get("dtype", "float32"))
    tokenizer = AutoTokenizer.from_pretrained(config["model"])
    model = AutoModelForCausalLM.from_pretrained(config["model"], dtype=dtype)
    model.eval()
    generations = []
    with torch.no_grad():
        for prompt in config["prompts"]:
            prompt_ids = list(tokenizer(prompt)["input_ids"])
            current = torch.tensor([prompt_ids])
            past = None
            token_ids: list[int] = []
            logprobs: list[float] = []
            for _ in range(int(config["max_tokens"])):
                out = model(input_ids=current, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
                chosen = int(torch.argmax(logp))
                token_ids.append(chosen)
                logprobs.append(float(logp[chosen]))
                current = torch.tensor([[chosen]])
            generations.append({"prompt": prompt, "prompt_token_ids": prompt_ids, "token_ids": token_ids,
                                "logprobs": logprobs})
    print(json.dumps({"source": "transformers", "torch": torch.__version__,
                      "transformers": transformers.__version__, "dtype": config.get("dtype", "float32"),
                      "seconds": round(time.monotonic() - started, 2), "generations": generations}))


if __name__ == "__main__":
    main(sys.argv)

"""Streamed completions read chunk by chunk from a test thread: what a client sees of a drain or a restart."""

from __future__ import annotations

import http.client
import json
import re
import threading
import time

# Long answers (within the tiny model plans' max_model_len, 512, with the prompt), many at once: enough that the
# engine is still generating them when a stop begins (a few would be generated before their streams end).
DRAIN_TOKENS = 480
DRAIN_STREAMS = 32


class StreamedAnswer(threading.Thread):
    """One streamed completion (ignore_eos: exactly `tokens` tokens) to 127.0.0.1:`port`."""

    def __init__(self, port: int, key: str | None, prompt: str, tokens: int, model: str = "tiny-llama") -> None:
        super().__init__(daemon=True)
        self.port, self.key, self.prompt, self.tokens, self.model = port, key, prompt, tokens, model
        self.chunks = 0
        self.finish_reason: str | None = None
        self.completion_tokens: int | None = None
        self.error: str | None = None
        self.ended_at: float | None = None

    def run(self) -> None:
        body = json.dumps({"model": self.model, "prompt": self.prompt, "max_tokens": self.tokens,
                           "ignore_eos": True, "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True}}).encode()
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            connection.request("POST", "/v1/completions", body=body, headers=headers)
            answer = connection.getresponse()
            if answer.status != 200:
                self.error = f"HTTP {answer.status}"
                return
            for raw in answer:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                self.chunks += 1
                for choice in chunk.get("choices") or []:
                    self.finish_reason = choice.get("finish_reason") or self.finish_reason
                if chunk.get("usage"):
                    self.completion_tokens = chunk["usage"]["completion_tokens"]
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ended_at = time.monotonic()
            connection.close()

    def whole(self) -> bool:
        """The answer arrived complete: every token asked for, ended by its length."""
        return self.error is None and self.finish_reason == "length" and self.completion_tokens == self.tokens


def drained_as_the_engine_said(engine_log: str, supervisor_log: str, name: str) -> bool:
    """The supervisor's "draining (N requests in flight)" lines agree with the engine's own shutdown lines: the
    count vLLM drains first, none at the end; nothing said when the engine had nothing left to generate."""
    engine = [int(n) for n in re.findall(r"draining in-flight requests count=(\d+)", engine_log)]
    said = [int(n) for n in re.findall(rf"npuops\[{re.escape(name)}\]: draining \((\d+) requests in flight\)",
                                       supervisor_log)]
    if not engine:
        return said == []
    return said[:1] == engine[:1] and said[-1] == 0 and 1 <= engine[0] <= DRAIN_STREAMS


class StreamingClients:
    """`clients` threads, each streaming one answer after another through 127.0.0.1:`port` until stopped: what
    the users of an endpoint see while it changes under them (every answer kept, whole or cut)."""

    def __init__(self, port: int, key: str | None, clients: int = 4, tokens: int = 64, pause_s: float = 2.0,
                 model: str = "tiny-llama") -> None:
        # A pause between a client's answers, as a user reads one before asking again: four clients streaming
        # back to back would take both cores of a CI machine, and a replica's new engine would not start.
        self.port, self.key, self.tokens, self.pause_s, self.model = port, key, tokens, pause_s, model
        self.answers: list[StreamedAnswer] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def _client(self, index: int) -> None:
        turn = 0
        while not self._stop.is_set():
            answer = StreamedAnswer(self.port, self.key, f"client {index} asks question {turn}:", self.tokens,
                                    self.model)
            answer.run()  # in this client's thread: one answer after another
            with self._lock:
                self.answers.append(answer)
            turn += 1
            self._stop.wait(self.pause_s)

    def __enter__(self) -> StreamingClients:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=300)

    def cut(self) -> list[StreamedAnswer]:
        """The answers that did not arrive whole (an error, or fewer tokens than asked)."""
        with self._lock:
            return [a for a in self.answers if not a.whole()]

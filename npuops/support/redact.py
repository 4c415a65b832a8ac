"""Secrets kept out of a support bundle: every byte that enters it passes one `Redactor` (pure).

What is secret: the values npuops knows (an instance's API key, a serving group's Ray token, and every variable of
an instance's env file whose name marks it secret: KEY, TOKEN, SECRET, PASSWORD, PASSWD, CREDENTIAL(S) or AUTH as
a word of its name, as HF_TOKEN, AWS_SECRET_ACCESS_KEY, VLLM_API_KEY, RAY_AUTH_TOKEN; not MAX_NUM_BATCHED_TOKENS),
replaced wherever they appear, also as the JSON and URL escapings of themselves; and what has the shape of a secret
whatever its value: an `Authorization:` header's credentials, the value after `--api-key`, `--token` or
`--password` on a command line, NAME=value where NAME marks it secret (an env file, `systemctl show`'s
Environment=, a journal line) and "api_key": value (JSON, YAML).
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterable, Mapping

MARK = "[REDACTED]"
# A variable name that marks its value secret: one of these words between its underscores.
SECRET_WORD = r"(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?|AUTH)"
SECRET_NAME = re.compile(rf"(?:^|_){SECRET_WORD}(?:_|$)")
# Values shorter than this are not replaced where they merely appear (a 3-character "key" would blank every
# occurrence of those letters); the shapes below still catch them after their name or flag.
MIN_SECRET_CHARS = 6

_SHAPES = (
    # Authorization: Bearer X / Basic X (HTTP headers, curl -H, logged requests)
    re.compile(r"(?i)(\bauthorization\s*[:=]\s*\"?(?:bearer|basic|token)?\s*)([^\s\"',;]+)"),
    # --api-key X, --api-key=X, --token X, --password=X (a command line, a unit's ExecStart=)
    re.compile(r"(?i)(--(?:api[-_]key|token|password|passwd|auth[-_]token)(?:=|\s+)[\"']?)([^\s\"']+)"),
    # NAME=value where NAME marks it secret (env files, systemctl show's Environment=, journal lines)
    re.compile(rf"(\b(?:[A-Z0-9]+_)*{SECRET_WORD}(?:_[A-Z0-9]+)*=[\"']?)([^\s\"']+)"),
    # "api_key": "value", api-key: value (JSON, YAML)
    re.compile(r"(?i)(\"?\b(?:api[-_]?key|auth[-_]?token|access[-_]?token|password|secret)\"?\s*[:=]\s*[\"']?)"
               r"([^\s\"',;}]+)"),
)


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of the variables of an env file whose names mark them secret."""
    return [value for name, value in env.items() if SECRET_NAME.search(name.upper()) and value]


class Redactor:
    """Replaces known secret values (and their escaped forms) and secret-shaped text with MARK."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if len(secret) < MIN_SECRET_CHARS:
                continue
            forms.add(secret)
            forms.add(json.dumps(secret)[1:-1])  # as it appears inside a JSON string
            forms.add(urllib.parse.quote(secret, safe=""))  # in a URL
            forms.add(urllib.parse.quote_plus(secret))
        # Longest first, so a secret containing another is replaced whole.
        self._forms = sorted((f for f in forms if f), key=len, reverse=True)
        self._known = (re.compile("|".join(re.escape(f) for f in self._forms)) if self._forms else None)

    @property
    def known(self) -> int:
        return len(self._forms)

    def text(self, text: str) -> str:
        if self._known is not None:
            text = self._known.sub(MARK, text)
        for shape in _SHAPES:
            text = shape.sub(lambda m: m.group(1) + MARK if m.group(2) != MARK else m.group(0), text)
        return text

    def data(self, data: bytes) -> bytes:
        """Bytes redacted as text: undecodable bytes pass through unchanged (surrogateescape)."""
        return self.text(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")

"""Which names mark a value secret: one rule for env variables, JSON/YAML/ini keys, HTTP headers and flags (pure).

A name is cut into words at `_`, `-`, `.` and camelCase (`hfToken` is HF_TOKEN, `--redis-password` is
REDIS_PASSWORD). It marks its value secret when
- a word is TOKEN, SECRET(S), PASSWORD(S), PASSWD, PASSPHRASE, APIKEY, SECRETKEY, PRIVATEKEY or ACCESSKEY, also
  glued to what comes before it (PGPASSWORD, identitytoken, clientSecret); or CREDENTIAL(S), CRED(S) (skopeo's
  --src-creds USER:PASSWORD), AUTH, AUTHORIZATION, COOKIE or DSN (SENTRY_DSN);
- KEY or KEYS is one of at least two words (VLLM_API_KEY, x-api-key, ssh.private.key; a bare `key` is a dict's
  key, a sort key, a YAML selector's key);
- its last word is PWD, PASS or SK after another word (MYSQL_PWD, SMTP_PASS, OBS_SK; not PWD, the shell's working
  directory);
- it is DATABASE_URL or DB_URL (a connection URL with its password).
It does not when its last word names where or what a secret is rather than the secret: a location (SSL_KEY_PATH,
API_KEY_FILE, TOKEN_DIR, TOKEN_URL, docker login's --password-stdin), an identifier or kind (AWS_ACCESS_KEY_ID,
token_type, RAY_AUTH_MODE), a count, size or rate (token_ids, num_key_value_heads, key_head_dim, token_budget), a
switch (AUTH_ENABLED), a time in a code field's name (moe_prefill_token_us; not in an env name in capitals, where
US may be a region); nor when a word makes TOKEN a tokenizer's token or a count (bos_token, pad_token, max_token,
kv_bytes_per_token, HF_HUB_DISABLE_IMPLICIT_TOKEN). TOKENS (MAX_NUM_BATCHED_TOKENS, max_tokens) and TOKENIZER are
counts and models.
"""

from __future__ import annotations

import re

_SEP = r"[_.\-]"
_GLUED = r"(?:PASSWORDS?|PASSWD|PASSPHRASE|TOKEN|SECRETS?|APIKEY|SECRETKEY|PRIVATEKEY|ACCESSKEY)"
_WORDS = r"(?:CREDENTIALS?|CREDS?|AUTH|AUTHORIZATION|COOKIE|DSN)"
# Words that make the name a tokenizer's token, a count or a switch: the value is no secret.
_NOT_SECRET_WORDS = (r"(?:BOS|EOS|PAD|UNK|SEP|CLS|MASK|SPECIAL|ADDED|ADDITIONAL|PER|NUM|MAX|MIN|TOTAL|DISABLE|"
                     r"ENABLE)")
# Last words that name where or what a secret is, or a property of it, rather than the secret.
_NOT_SECRET_LAST = (r"(?:PATHS?|FILES?|FILENAME|DIRS?|DIRECTORY|LOCATION|URL|URI|ENDPOINT|IDS?|TYPES?|MODE|METHOD|"
                    r"SCHEME|KIND|COUNTS?|LEN|LENGTH|SIZE|DIMS?|HEADS?|INDEX|IDX|BUDGET|LIMIT|ENABLED|DISABLED|"
                    r"REQUIRED|FORMAT|PREFIX|SUFFIX|NAMES?|HEADER|ENV|VAR|FIELD|TTL|EXPIRY|EXPIRES|EXPIRATION|"
                    r"TIMEOUT|LIFETIME|AGE|LOGPROBS?|BYTES|RATE|RATIO|SHARE|PCT|PERC|STDIN)")
# A measure's unit as the last word of a field in code (moe_prefill_token_us); an env name in capitals may end in a
# region (OPENAI_API_KEY_US), so these count only in a name with small letters.
_UNIT_LAST = re.compile(rf"{_SEP}(?:US|MS|NS|S|SEC|SECS|SECONDS)$")

# Matched (search, fullmatch or match) against a name as `secret_name_words` spells it: upper case, words apart.
SECRET_NAME = re.compile(
    rf"^(?:(?:.*{_SEP})?(?:DATABASE|DB){_SEP}URL$"
    rf"|(?!(?:.*{_SEP})?{_NOT_SECRET_WORDS}(?:{_SEP}|$))(?!.*{_SEP}{_NOT_SECRET_LAST}$)"
    rf"(?:(?:.*{_SEP})?(?:[A-Z0-9]*{_GLUED}|{_WORDS})(?:{_SEP}.*)?"
    rf"|.*{_SEP}KEYS?(?:{_SEP}.*)?|KEYS?{_SEP}.+"
    rf"|.+{_SEP}(?:PWD|PASS|SK)))$", re.DOTALL)

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
# A piece every secret name holds: most names (a log's `word:`) are passed over without the rule's regex.
_HINT = re.compile(r"(?i)key|tok|secret|pass|pwd|auth|cred|cookie|sk|dsn|url")
MAX_NAME_CHARS = 128


def secret_name_words(name: str) -> str:
    """`name` as SECRET_NAME reads it: camelCase words apart, upper case (hfToken -> HF_TOKEN)."""
    return _CAMEL.sub("_", name).upper()


def is_secret_name(name: str) -> bool:
    """Whether a variable, key, header or flag name marks its value secret (the rule in the module's docstring)."""
    if not name or len(name) > MAX_NAME_CHARS or not _HINT.search(name):
        return False
    words = secret_name_words(name.lstrip("-"))
    if name != name.upper() and _UNIT_LAST.search(words):
        return False
    return SECRET_NAME.match(words) is not None


def is_authorization_name(name: str) -> bool:
    """Authorization, Proxy-Authorization: the value is a scheme (kept) and its credentials (masked)."""
    return secret_name_words(name).endswith("AUTHORIZATION")


def is_cookie_name(name: str) -> bool:
    """Cookie, Set-Cookie: the whole rest of the header is the secret."""
    return secret_name_words(name).endswith("COOKIE")

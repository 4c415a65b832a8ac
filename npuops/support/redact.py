"""Secrets kept out of a support bundle: every byte that enters it passes one `Redactor` (pure: no file I/O).

A secret is found in two ways.

**By its value.** npuops learns the values it can know: `secrets_in_env_text` reads an env file as tolerantly as
systemd does and more (a line systemd ignores, a dashed name, a stray word, `export `, quotes and escapes, an
unterminated quote: each line is read on its own too, so no line turns learning off for the others);
`secrets_in_json` walks a record or a revision's launch.json (keys, `NAME=VALUE` strings such as `--env` pairs,
env dicts and `{"name": ..., "value": ...}` lists, argv lists and command lines with a secret flag's argument);
`secret_values` takes a parsed env mapping. Which names mark a value secret is one rule
(npuops/support/secret_names.py: TOKEN, SECRET, PASSWORD, PASSWD, API_KEY, AUTH, CREDENTIALS, *_KEY, *_SK, *_PASS,
*_PWD, *_APIKEY, *_SECRET_KEY, DATABASE_URL, ...; not MAX_NUM_BATCHED_TOKENS, token_ids, KEY_PATH). The password of
every `scheme://user:password@host` in any value is learned too.

A learned value is replaced wherever it appears, in each form a file may hold it in: raw; URL-encoded (quote,
quote_plus, upper- or lower-case hex); shell-quoted (shlex.quote, and inside double quotes for a shell, for an
EnvironmentFile= and for a unit's command line with % and $ doubled); Python's repr and ascii; each of these also
applied to the value JSON-escaped up to COMBINED_DEPTH (2) times; and every one of them JSON-escaped any number of
times, with or without \\u escapes (JSON only adds backslashes: each form is matched with any run of them where
JSON would put one, `_form_regex`). Values of any length are learned, but a value shorter than
MIN_SECRET_CHARS (6) is matched only as a token: not where a letter, digit or `_` touches it on a side where it
has one (`ab1` goes from `pass ab1.` and `"ab1"`, not from `cab1e`), since short runs of letters occur
everywhere. A value that hides nothing, because anyone guesses it (GUESSABLE: a single character; 0, 1, true,
false, yes, no, on, off, none, null, nil; token, key, auth, basic, such as a cluster's RAY_AUTH_MODE), is not
replaced as free text; its named places below still mask it (null, true, false and None aside: there they say
no secret is set). A value over LONG_VALUE_CHARS (1 KiB) is looked
for raw and JSON-escaped only, and one over MAX_VALUE_CHARS (64 KiB: a file's content) not at all, so that no
learned value makes the pattern huge.

**By its shape**, whatever the value (npuops/support/secret_shapes.py, XML and query strings in
secret_markup.py); what names the secret stays, the secret
becomes MARK:
- PEM private keys: `-----BEGIN ... PRIVATE KEY-----` to its END, the whole body; a BEGIN without an END masks to
  the end (and `Redactor.stream` carries that into the next piece); an END without its BEGIN (a tail read cut it)
  masks the key material before it; a base64'd PEM (`LS0tLS1CRUdJTi...`, Kubernetes' tls.key);
- a Kubernetes Secret's `data:`/`stringData:` entries (YAML or JSON), whatever their names;
- URL credentials `scheme://user:password@host` (the user stays);
- a secret name's value (the names above, also HTTP headers, JSON/YAML/ini keys, query strings, camelCase):
  NAME=value, NAME="value with spaces", "NAME=value with spaces" (systemctl show's Environment=, several on a
  line), export NAME=value, name: value (YAML: at a line's start the value runs to the line's end and on over
  the lines indented under it, as PyYAML folds a long one; `name: |` masks the block under it; `name:` alone masks
  the plain scalar or the list of scalars under it, not a mapping, whose keys decide), "name": "value" and
  'name': 'value' (JSON, a Python dict's repr, also JSON-escaped any number of times), name = value (ini:
  aws_secret_access_key; `name =` alone: its indented continuation lines), os.environ['NAME'] = value,
  ?token=value&; a name and its value apart by Unicode blanks (no-break, ideographic) or a full-width colon or
  equals sign (`API_KEY：x`), or by a line break before the `=` or `:` (`PASSWORD` / `=x`, as a wrapping tool
  leaves it; not a heading's `===`); a list's items each (vLLM's `'api_key': ['k1', 'k2']`, its argparse
  `Namespace(api_key=['k1'])`, YAML's `api-key: [k1, k2]`); a value at a line's start stops before a connection
  string's next pair (`password=x;user=bob`; ODBC's `;Pwd=x` is a password, a bare PWD the working directory);
  `Authorization:` and `Proxy-Authorization:` keep their scheme (Bearer, Basic, Token, ...) and lose the rest,
  `Cookie:`/`Set-Cookie:` lose their whole value. What stays: null, true, false, None as the value (`:` or `=`:
  they say no secret is set, api_key=None), a `{`/`[` structure after `:` (its keys are looked at one by one), a
  shell variable as the whole value (`--api-key ${VLLM_API_KEY}`, `"$VLLM_API_KEY"`: where the secret is; not
  ${NAME:-default}, not $lower), and a word of prose (the, no, and, above, expired, ...) after `name: ` or
  `Name= ` inside a line (systemd's "Failed to determine user credentials: No such process", "see
  LoadCredential= and ...");
- code and commands that set a secret-named variable: `setenv`/`setdefault`/`putenv`-style calls
  (`("HF_TOKEN", "x")` as a call's first two arguments), Windows' `setx NAME x`, fish's `set -gx NAME x`,
  Dockerfile's `ENV NAME value` (`export`, `set NAME=x`, `$env:NAME = "x"`, `ARG NAME=x` are NAME=value);
- XML: an element named as a secret (`<password>x</password>`, `<ns:ClientSecret>`, CDATA too), an entry whose
  `key` or `name` attribute is a secret name (`<add key="ApiKey" value="x"/>`: its value attribute, else its text:
  `<entry name="token">x</entry>`), Hadoop's `<name>...secret.key</name><value>x</value>`, a plist's
  `<key>password</key><string>x</string>`;
- a URL-encoded query inside a URL (`%3Fclient_secret%3Dx%26`, encoded up to 5 times: `%253D`), up to the `&` of
  its own depth; a signed URL's signature and credential whatever the name says: `sig=` (Azure SAS), `Signature=`,
  `X-Amz-Signature=`, `X-Amz-Credential=` (an access key id), `X-Goog-Signature=`, `AWSAccessKeyId=`; `code=` of
  16+ characters (an OAuth code, an Azure Functions key; `code=200` is a status);
- prose: `NAME is VALUE` / `NAME was [set to] VALUE` where NAME holds a strong secret word (password, passwd,
  passphrase, secret, token, api key, access key, private key, credential) and is a secret name (`the API key
  is`, `apikey is`, `DB_PASSWORD is now`; not `max tokens is`), VALUE one word of 6+ characters with a digit or
  of 20+ (`the token is expired`, `is 32 bytes` stay);
- a secret flag's argument (`--api-key`, `--token`, `--password`, `--hf-token`, `--redis-password`, any
  `--*-token`, `--*-password`, `--*-secret`, `--*-key`; not `--max-num-batched-tokens`, `--api-key-file`):
  `--flag X`, `--flag=X`, `--flag "X Y"`, `"--flag=X Y"`, `"--flag" "X"`, `"--flag", "X"` (argv lists),
  `--flag \\<newline> X`; whatever shell word follows the flag goes, its quoted parts glued together too
  (`'it'"'"'s'`; a flag that takes no value, such as a bare `--hf-token`, costs the next word);
- a registry or cluster login's `-p X`, `-p=X`, `-pX` (on a line that runs a `login`: docker, podman, oc, az, cf,
  helm registry), the word echoed into a `--password-stdin`, skopeo's `--creds user:password`;
- `curl -u user:password` (and --user, --proxy-user), `mysql ... -pPASSWORD` (mysql's tools only: `-p` is a port
  or a path elsewhere), `sshpass -p X`, .netrc's `password X`;
- `bearer X` or `Basic X` with no header (X: 8+ characters with a digit, a symbol or mixed case, or 20+: a word
  of prose after "bearer" is no credential);
- tokens whose prefix says what they are: GitHub (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_), GitLab (glpat-,
  ...), Hugging Face (hf_ and 30+ letters and digits), AWS access key ids (AKIA, ASIA), Slack (xox?-), OpenAI-style
  sk-, Stripe, PyPI (pypi-AgE...), npm_, Google (AIza), JWTs (eyJ....eyJ....sig).

What is no secret and stays (tests/fixtures/secrets/negative/): model names and hub paths, sha256 sums, commit ids,
paths, UUIDs, ports, counts named with TOKENS (MAX_NUM_BATCHED_TOKENS=4096, --max-num-batched-tokens 4096,
max_tokens, num_tokens), tokenizer settings, token ids, HCCL_* variables, npu-smi's tables, Prometheus metric
names; a name that says where a secret is kept (KEY_PATH, --api-key-file, TOKEN_URL): the path is what a support
engineer needs, and the file's content is not in the bundle; `Authorization` as a word of prose, without `:` or
`=` and a value after it. What cannot be caught at all is in docs/support.md ("What redaction cannot catch").
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping

from npuops.envfile import env_assignments
from npuops.support.secret_mask import MARK, is_variable_reference
from npuops.support.secret_names import SECRET_NAME, is_secret_name
from npuops.support.secret_shapes import redact_shapes

__all__ = ["GUESSABLE", "MARK", "MIN_SECRET_CHARS", "PIECE_BYTES", "SECRET_NAME", "Redactor", "is_secret_name",
           "secret_values", "secrets_in_env_text", "secrets_in_json"]

# Values shorter than this are replaced only where they stand as a token (see the module's docstring).
MIN_SECRET_CHARS = 6
COMBINED_DEPTH = 2  # the other escapings are looked for in a value JSON-escaped up to this many times
# Values anyone guesses: replacing them wherever they appear would blank a bundle and hide nothing (all shorter
# than MIN_SECRET_CHARS: a longer value is always replaced).
GUESSABLE = frozenset({"0", "1", "true", "false", "yes", "no", "on", "off", "none", "null", "nil", "token", "key",
                       "auth", "basic"})
LONG_VALUE_CHARS = 1024  # a longer value is looked for in fewer forms (secret_forms)
MAX_VALUE_CHARS = 64 * 1024  # a longer "value" is a file's content, not a secret to look for (its shapes still are)
# A stream is redacted in pieces of whole lines of about this size (memory stays bounded; see Redactor.stream).
PIECE_BYTES = 4 * 2**20

_WORD = re.compile(r"\w")
_NAME_VALUE = re.compile(r"([A-Za-z_][A-Za-z0-9_.\-]{0,127})=(.*)", re.DOTALL)
_URL_PASSWORD = re.compile(r"://[^\s/?#@:'\"<>\\]{0,256}+:([^\s/?#'\"<>\\]{1,1024})@")
_LINES = re.compile(r"\r\n|[\n\r]")


# --- learning ---------------------------------------------------------------------------------------------------
def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of an env mapping's secret variables, and the passwords of the URLs in any of its values."""
    found = [value for name, value in env.items() if value and is_secret_name(name)]
    for value in env.values():
        found += _url_passwords(value)
    return list(dict.fromkeys(found))


def secrets_in_env_text(text: str) -> list[str]:
    """Every secret value of an env file's text: the values of its secret-named variables (any length), the
    passwords of the URLs in any value, the arguments of secret flags in any value. The file is read as systemd
    reads it (npuops.envfile.env_assignments) and each line on its own, so a line systemd would ignore, or an
    unterminated quote, does not hide the lines after it."""
    pairs = env_assignments(text)
    for line in _LINES.split(text):
        pairs += env_assignments(line)
    found: list[str] = []
    for name, value in pairs:
        if is_secret_name(name):
            found += [value, value.strip()]
        found += _url_passwords(value)
        if "--" in value:
            found += _secrets_in_argv(_words(value))
    return [v for v in dict.fromkeys(found) if v]


def secrets_in_json(data: object) -> list[str]:
    """Every secret value in parsed JSON (a record, a revision's launch.json): the string values of secret-named
    keys; `{"name": NAME, "value": V}` with a secret NAME; `NAME=VALUE` strings with a secret NAME (--env pairs);
    the argument after a secret flag in argv lists and in command-line strings; URL passwords; and the same in a
    string that is itself JSON (vLLM's --additional-config)."""
    found: list[str] = []
    stack: list[object] = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if isinstance(key, str) and isinstance(value, str) and is_secret_name(key):
                    found.append(value)
                stack.append(value)
            name, value = item.get("name"), item.get("value")
            if isinstance(name, str) and isinstance(value, str) and is_secret_name(name):
                found.append(value)
        elif isinstance(item, (list, tuple)):
            found += _secrets_in_argv([x if isinstance(x, str) else "" for x in item])
            stack.extend(item)
        elif isinstance(item, str):
            found += _secrets_in_string(item)
            if item.lstrip().startswith(("{", "[")):
                with contextlib.suppress(ValueError, RecursionError):  # not JSON; nested too deep to matter
                    stack.append(json.loads(item))
    return [v for v in dict.fromkeys(found) if v]


def _secrets_in_string(text: str) -> list[str]:
    found = _name_value_secret(text) + _url_passwords(text)
    if "--" in text:
        found += _secrets_in_argv(_words(text))
    return found


def _name_value_secret(word: str) -> list[str]:
    pair = _NAME_VALUE.fullmatch(word)
    return [pair.group(2)] if pair and is_secret_name(pair.group(1)) else []


def _secrets_in_argv(words: list[str]) -> list[str]:
    """The arguments of secret flags (`--api-key X`, `--hf-token=X`) and secret NAME=VALUE words (`--env`); not
    a shell variable (`--api-key ${VLLM_API_KEY}`: the shell or systemd puts the secret there, and the
    variable's own value is learned from where it is set)."""
    found: list[str] = []
    for index, word in enumerate(words):
        found += _name_value_secret(word)
        if not word.startswith("--"):
            continue
        name, eq, value = word[2:].partition("=")
        if is_secret_name(name):
            if eq:
                found.append(value)
            elif index + 1 < len(words) and not words[index + 1].startswith("--"):
                # (A flag that takes no value, as a bare --hf-token: the next flag is no secret to replace
                # wherever it appears.)
                found.append(words[index + 1])
    return [value for value in found if not is_variable_reference(value)]


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote: its words as they stand
        return text.split()


def _url_passwords(text: str) -> list[str]:
    found: list[str] = []
    for password in _URL_PASSWORD.findall(text):
        found += [password, urllib.parse.unquote(password)]
    return found


# --- the forms of a value ---------------------------------------------------------------------------------------
def _json_escapings(value: str, depth: int) -> set[str]:
    """`value` inside a JSON string escaped 1..depth times, with \\u escapes or without."""
    out: set[str] = set()
    for ensure_ascii in (True, False):
        current = value
        for _level in range(depth):
            current = json.dumps(current, ensure_ascii=ensure_ascii)[1:-1]
            out.add(current)
    return out


def _other_escapings(value: str) -> set[str]:
    """`value` URL-encoded, shell-, systemd- and env-file-quoted, and as Python's repr shows it."""
    quoted = {urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value), urllib.parse.quote(value)}
    quoted |= {re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), q) for q in quoted}
    shell = shlex.quote(value)
    env_file = value.replace("\\", "\\\\").replace('"', '\\"')
    return quoted | {
        shell, shell[1:-1] if len(shell) > 1 and shell[0] == shell[-1] == "'" else shell,
        re.sub(r'([\\"$`])', r"\\\1", value),  # inside "..." for a shell
        env_file,  # inside "..." of an EnvironmentFile=
        env_file.replace("%", "%%").replace("$", "$$"),  # inside "..." of a unit's command line
        repr(value)[1:-1], ascii(value)[1:-1],
    }


def secret_forms(value: str) -> tuple[set[str], set[str]]:
    """The forms of `value` the Redactor looks for: (the value and its other escapings, each also looked for
    JSON-escaped any number of times by `_form_regex`; those escapings of the value JSON-escaped 1 to
    COMBINED_DEPTH times, looked for as they are). A value longer than LONG_VALUE_CHARS (a key file's content, a
    config blob) is looked for raw and JSON-escaped only: its other forms would make the pattern huge."""
    if len(value) > LONG_VALUE_CHARS:
        return {value}, set()
    nested = {value} | _other_escapings(value)
    combined: set[str] = set()
    for escaped in _json_escapings(value, COMBINED_DEPTH):
        combined |= _other_escapings(escaped)
    return {f for f in nested if f}, {f for f in combined - nested if f}


_JSON_SHORT_ESCAPES = {"\n": "n", "\r": "r", "\t": "t", "\b": "b", "\f": "f"}


def _json_escape_tail(char: str) -> str | None:
    """What follows the backslashes where JSON escapes `char` (u00e9, n, a surrogate pair), or None: JSON writes
    it as it is (`"` and `\\` aside, which `_form_regex` handles)."""
    if " " <= char <= "~":
        return None
    if ord(char) > 0xFFFF:
        high, low = divmod(ord(char) - 0x10000, 0x400)
        return rf"u{0xD800 + high:04x}\\++u{0xDC00 + low:04x}"
    short = _JSON_SHORT_ESCAPES.get(char)
    return f"(?:{short}|u{ord(char):04x})" if short else f"u{ord(char):04x}"


def _form_branches(form: str, short: bool) -> list[tuple[str, str]]:
    """`form` JSON-escaped any number of times (0 too), as regexes by the character they start with: (first
    character, regex of the rest). JSON escaping only adds backslashes before `"` and `\\` (doubling each level)
    and before the escape of a control or non-ASCII character, so every such character takes any run of
    backslashes before it; each run is possessive and a run at the start begins where the text's run begins (not
    inside it), so matching is linear. A short value must not touch a word character on a side where its form
    has one."""
    first = form[0]
    after_backslash = r"(?<!\\\\)"  # the backslash just matched is the first of its run
    if first == "\\":
        run = len(form) - len(form.lstrip("\\"))
        rest, index = _after_run(form, run)
        branches = [("\\", after_backslash + rf"\\{{{run - 1},}}+" + rest)]
    else:
        index = 1
        tail = re.escape(first) if first in '"/' else _json_escape_tail(first)
        guard = rf"(?<!\w{re.escape(first)})" if short and _WORD.match(first) else ""
        branches = [(first, guard)] + ([("\\", after_backslash + r"\\*+" + tail)] if tail else [])
    parts: list[str] = []
    while index < len(form):
        char = form[index]
        if char == "\\":
            run = len(form) - index - len(form[index:].lstrip("\\"))
            rest, index = _after_run(form, index + run)
            parts.append(rf"\\{{{run},}}+" + rest)
            continue
        tail = re.escape(char) if char in '"/' else _json_escape_tail(char)
        parts.append(f"(?:{re.escape(char)}|\\\\++{tail})" if tail else re.escape(char))
        index += 1
    if short and _WORD.match(form[-1]):
        parts.append(r"(?!\w)")
    return [(char, start + "".join(parts)) for char, start in branches]


def _after_run(form: str, index: int) -> tuple[str, int]:
    """The character after a run of backslashes in `form` (at `index`), whose own escape merges into the run."""
    if index >= len(form):
        return "", index
    char = form[index]
    tail = _json_escape_tail(char)
    return (re.escape(char) if tail is None else f"(?:{re.escape(char)}|(?<=\\\\){tail})"), index + 1


def _literal_branches(form: str, short: bool) -> list[tuple[str, str]]:
    """`form` as it is, as _form_branches gives it (a short value's form must not touch a word character)."""
    first = form[0]
    before = rf"(?<!\w{re.escape(first)})" if short and _WORD.match(first) else ""
    after = r"(?!\w)" if short and _WORD.match(form[-1]) else ""
    return [(first, before + re.escape(form[1:]) + after)]


def _guessable(value: str) -> bool:
    return len(value.strip()) <= 1 or value.strip().lower() in GUESSABLE


class Redactor:
    """Replaces learned secret values (in every form) and secret-shaped text with MARK."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = {s for raw in secrets if isinstance(raw, str) and len(raw) <= MAX_VALUE_CHARS
                  for s in (raw, raw.strip()) if not _guessable(s)}
        # By the character it starts with (the regex engine then skips any other position at once): the rest of
        # each form's regex -> the length of its value (the longest is tried first: a value that contains another
        # goes whole).
        branches: dict[str, dict[str, int]] = {}
        for value in values:
            nested, combined = secret_forms(value)
            short = len(value) < MIN_SECRET_CHARS
            for form in nested | combined:
                for first, rest in (_form_branches(form, short) if form in nested else
                                    _literal_branches(form, short)):
                    lengths = branches.setdefault(first, {})
                    lengths[rest] = max(lengths.get(rest, 0), len(value))
        self._count = sum(len(rests) for rests in branches.values())
        self._known = None
        if branches:
            self._known = re.compile("|".join(
                re.escape(first) + "(?:" + "|".join(sorted(rests, key=lambda r: (-rests[r], -len(r)))) + ")"
                for first, rests in sorted(branches.items())))

    @property
    def known(self) -> int:
        """How many forms of learned values it replaces."""
        return self._count

    def text(self, text: str) -> str:
        return self._redact(text, False)[0]

    def data(self, data: bytes) -> bytes:
        """Bytes redacted as text: undecodable bytes pass through unchanged (surrogateescape)."""
        return self.text(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")

    def stream(self, chunks: Iterable[bytes], piece_bytes: int = PIECE_BYTES) -> Iterator[bytes]:
        """A file's chunks redacted in pieces of whole lines of about `piece_bytes` (memory stays bounded): a
        private key's body that runs on into the next piece is masked there too. A line longer than a piece is
        cut at a blank where it has one (a secret cut in two by that is not found); a multi-line shape (a YAML
        block, a Kubernetes Secret) is found within a piece."""
        pending = bytearray()
        in_pem = False
        for chunk in chunks:
            pending += chunk
            while len(pending) >= piece_bytes:
                cut = pending.rfind(b"\n", 0, piece_bytes) + 1 or pending.rfind(b" ", 0, piece_bytes) + 1 \
                    or piece_bytes
                out, in_pem = self._redact(bytes(pending[:cut]).decode("utf-8", "surrogateescape"), in_pem)
                del pending[:cut]
                yield out.encode("utf-8", "surrogateescape")
        if pending:
            yield self._redact(bytes(pending).decode("utf-8", "surrogateescape"), in_pem)[0].encode(
                "utf-8", "surrogateescape")

    def _redact(self, text: str, in_pem: bool) -> tuple[str, bool]:
        return redact_shapes(self._known_values(text), in_pem)

    def _known_values(self, text: str) -> str:
        return text if self._known is None else self._known.sub(MARK, text)

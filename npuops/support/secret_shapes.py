"""Text that has the shape of a secret, whatever its value, masked with MARK (pure).

Each pass keeps what names the secret (a header, a key, a flag, a URL's user) and replaces the secret itself;
the passes and the shapes they know are listed in npuops/support/redact.py's docstring. Every pattern is linear in
its input: it starts where nothing of its own kind precedes it (a lookbehind), its repetitions are bounded or
possessive, and where a value must be looked for further (a closing quote, a line's end), the text looked through
is consumed, so no byte is scanned again and again (tests/collect/test_redact_corpus.py runs MiBs of `a`, `=`, `:`
and the shapes' own openings through it).
"""

from __future__ import annotations

import functools
import re

from npuops.support.secret_names import is_authorization_name, is_cookie_name, is_secret_name

MARK = "[REDACTED]"

_PEM = re.compile(r"-----(BEGIN|END) [ A-Z0-9]{0,40}?PRIVATE KEY(?: BLOCK)?-----")
# What a PEM body (base64 lines, also with JSON's `\n` escapes) is made of, walked back from an END whose BEGIN
# a tail read cut off.
_NOT_PEM_BODY = re.compile(r"[^A-Za-z0-9+/=\r\n\\]")
_EDGE_SPACE = re.compile(r"\A(?:\s|\\[nr])*+")
_EDGE_SPACE_END = re.compile(r"(?:\s|\\[nr])*+\Z")

_K8S_SECRET = re.compile(r"""(?m)^[ \t]*kind:[ \t]*["']?Secret["']?[ \t]*\r?$|"kind"[ \t]*:[ \t]*"Secret\"""")
_K8S_DATA_LINE = re.compile(r"(?m)^([ \t]*)(?:data|stringData):[ \t]*\r?$")
_K8S_ENTRY = re.compile(r"([ \t]*[^:\n]{1,253}:[ \t]*)(\S[^\n]*?)(\r?)$")
_K8S_JSON_DATA = re.compile(r'"(?:data|stringData)"[ \t\r\n]*:[ \t\r\n]*\{([^{}]*+)\}')
_JSON_ENTRY = re.compile(r'("(?:[^"\\\n]|\\.)*+"[ \t\r\n]*:[ \t\r\n]*")((?:[^"\\\n]|\\.)++)(")')

# scheme://user:password@host (an env file's URL, a log, pip freeze's VCS URLs): the password goes, the user stays.
_URL_CREDENTIALS = re.compile(r"://[^\s/?#@:'\"<>\\]{0,256}+:([^\s/?#'\"<>\\]{1,1024})@")

# NAME=value, name: value, "name": "value", 'name': 'value', \"name\": \"value\", name = value (ini): the name
# decides (npuops/support/secret_names.py), the value is found after it.
_NAMED = re.compile(
    r"(?P<bol>^[ \t]{0,32}(?:export[ \t]{1,8}|-[ \t]{1,8})?)?(?P<open>(?<!\\)\\{0,64}[\"']|)"
    r"(?<![A-Za-z0-9_.\-])(?P<name>[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}+)(?P<close>(?P=open)|)"
    r"(?P<sep>[ \t]{0,8}[:=][ \t]{0,8})", re.M)
# --api-key X, --hf-token=X, "--redis-password=X Y", ["--api-key", "X"], "--token" "X", --token \<newline> X:
# the flag's name decides.
_FLAG = re.compile(r"(?P<open>(?<!\\)\\{0,64}[\"']|)(?<![A-Za-z0-9_\-])--(?P<name>[A-Za-z0-9][A-Za-z0-9_\-]{0,63}+)"
                   r"(?P<close>(?P=open)|)(?P<sep>=|[ \t]{0,8}\\\r?\n[ \t]{0,64}|[ \t]{1,8}|[ \t]{0,8},[ \t]{0,8})")
# A quoted value's opening: a quote after 0..64 backslashes (inside a JSON string escaped that many times), or a
# Python bytes or raw string's (b'...').
_QUOTE_OPEN = re.compile(r"(?:[bBrRuU]{1,2}(?=[\"']))?\\{0,64}[\"']")
_UNQUOTED = re.compile(r"[^\s\"'&,;<>(){}\[\]|\\`]*+")
_REST_OF_LINE = re.compile(r"[^\n]*+")
_SHELL_SINGLE_QUOTED = re.compile(r"[^'\n]*+")
# A shell word (and a systemd env value): quoted and unquoted parts glued together, 'it'"'"'s' or a\ b'c d'.
_SHELL_WORD = re.compile(r"(?:'[^'\n]*+'|\"(?:[^\"\\\n]|\\.)*+\"|\\.|[^\s'\"\\])++")
# A list of strings only (JSON, a Python repr): ["a", 'b'].
_STRING_LIST = re.compile(r"""\[[ \t]*+(?:(?:'(?:[^'\\\n]|\\.)*+'|"(?:[^"\\\n]|\\.)*+")[ \t]*+,?+[ \t]*+)++\]""")
_JSON_LITERAL = re.compile(r"(?:null|true|false|None|True|False|~)(?![^\s,;})\]])")
_YAML_BLOCK = re.compile(r"(?:![^\s]{1,64}[ \t]+)?[|>][-+0-9]{0,3}[ \t]*\r?$", re.M)
# Words that go on a sentence, not a secret: after `name: ` or `Name= ` inside a line of prose ("Failed to
# determine user credentials: No such process", "see LoadCredential= and SetCredential= above").
_PROSE = re.compile(r"(?i)(?:the|an|and|or|is|are|was|were|be|been|not|no|none|missing|invalid|expired|required|"
                    r"empty|unset|given|provided|see|above|below|for|to|of|in|on|at|with|from|by|as|if|then|must|"
                    r"should|can|will|such|this|that|it)(?=[.,;:!?)\"']*+(?:\s|$))")
_SCHEME = re.compile(r"(?i)(?:bearer|basic|token|digest|negotiate|ntlm|apikey|api-key|hmac|aws4-hmac-sha256|"
                     r"sso-key)[ \t]+")

# Credentials of a command line whose tool takes them in its own way.
_USER_PASSWORD = re.compile(r"(?<![A-Za-z0-9_\-])(?:-u|-U|--user|--proxy-user)(?:[ \t]{1,8}|=)"
                            r"(?:\"[^\s:\"@]{0,256}+:([^\"\n]++)|'[^\s:'@]{0,256}+:([^'\n]++)"
                            r"|[^\s:\"'@]{0,256}+:([^\s\"']++))")
_ATTACHED_VALUE = r"(?:'([^'\n]++)'|\"([^\"\n]++)\"|(\S++))"
# A line that runs one of mysql's tools, from the tool's name on (found once per line: linear), and its -pVALUE.
_MYSQL_LINE = re.compile(r"(?m)^[^\n]*?(?<![A-Za-z0-9_.\-/])(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlcheck|"
                         r"mysqlshow|mariadb|mariadb-dump)\b([^\n]*+)")
_MYSQL_PASSWORD = re.compile(r"(?<=[ \t])-p" + _ATTACHED_VALUE)
_SSHPASS = re.compile(r"(?<![A-Za-z0-9_.\-/])sshpass[ \t]{1,8}-p[ \t]{0,8}" + _ATTACHED_VALUE)
_NETRC = re.compile(r"(?m)^[ \t]{0,32}(?:(?:machine|default|login)\b[^\n]{0,512}?[ \t])?password[ \t]{1,8}(\S++)")
# A bearer or basic credential without its header (a client's log, an error message). A word of prose after
# "bearer" is no credential: the credential has 8+ characters with a digit, a symbol or mixed case, or 20+.
_BARE_CREDENTIAL = re.compile(
    r"(?<![A-Za-z0-9_\-])(?:[Bb][Ee][Aa][Rr][Ee][Rr]|Basic)[ \t]{1,8}"
    r"((?=[A-Za-z0-9._~+/=\-]{20}|[A-Za-z0-9._~+/=\-]{0,64}?(?:[0-9._~+/=\-]|[a-z][A-Z]))[A-Za-z0-9._~+/=\-]{8,}+)")
# Tokens whose prefix says what they are (GitHub, GitLab, Hugging Face, AWS access key ids, Slack, OpenAI-style
# sk-, PyPI, npm, Google API keys, Stripe, JWTs, base64 of a PEM block).
_PREFIXED_TOKEN = re.compile(
    r"(?=[ghAxsprneLG])(?<![A-Za-z0-9_\-])(?:"
    r"gh[pousr]_[A-Za-z0-9]{30,}+|github_pat_[A-Za-z0-9_]{30,}+"
    r"|gl(?:pat|dt|rt|ptt|ft|soat|cbt|oas)-[A-Za-z0-9_\-]{20,}+|GR1348941[A-Za-z0-9_\-]{20,}+"
    r"|hf_[A-Za-z0-9]{30,}+"
    r"|(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"
    r"|xox[baprse]-[A-Za-z0-9\-]{10,}+"
    r"|sk-[A-Za-z0-9_\-]{20,}+|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}+"
    r"|pypi-AgE[A-Za-z0-9_\-]{50,}+|npm_[A-Za-z0-9]{30,}+|AIza[A-Za-z0-9_\-]{30,}+"
    r"|eyJ[A-Za-z0-9_\-]{8,}+\.[A-Za-z0-9_\-]{8,}+\.[A-Za-z0-9_\-]*+"
    r"|LS0tLS1CRUdJTi[A-Za-z0-9+/]{16,}+={0,2})")


def redact_shapes(text: str, in_pem_block: bool = False) -> tuple[str, bool]:
    """`text` with every secret shape masked; and whether it ends inside a PEM private-key block (the next piece
    of a stream then starts masked: `in_pem_block`)."""
    text, in_pem_block = _pem_blocks(text, in_pem_block)
    if _K8S_SECRET.search(text):
        text = _kubernetes_secret_data(text)
    text = _replace_groups(_URL_CREDENTIALS, text)
    text = _named_values(text, _NAMED)
    text = _named_values(text, _FLAG)
    text = _MYSQL_LINE.sub(lambda line: line.group(0)[:line.start(1) - line.start()]
                           + _replace_groups(_MYSQL_PASSWORD, line.group(1)), text)
    for pattern in (_USER_PASSWORD, _SSHPASS, _NETRC, _BARE_CREDENTIAL):
        text = _replace_groups(pattern, text)
    return _PREFIXED_TOKEN.sub(MARK, text), in_pem_block


def _replace_groups(pattern: re.Pattern[str], text: str) -> str:
    """Every match with the group that matched last (the value, of the alternatives that matched) replaced by
    MARK."""
    def replace(match: re.Match[str]) -> str:
        group = match.lastindex or 0
        start, end = match.span(group)
        if match.group(group).startswith(MARK):
            return match.group(0)
        base = match.start()
        return match.group(0)[:start - base] + MARK + match.group(0)[end - base:]

    return pattern.sub(replace, text)


# --- PEM private keys ------------------------------------------------------------------------------------------
def _pem_blocks(text: str, in_block: bool) -> tuple[str, bool]:
    """BEGIN ... END of a private key: the body masked; a BEGIN with no END masks to the end; an END with no BEGIN
    (a tail read cut it off) masks the key material before it."""
    out: list[str] = []
    last = 0  # text[:last] is in out
    floor = 0  # a walk back from an orphan END stops here (the previous marker's end)
    block_start: int | None = 0 if in_block else None
    for marker in _PEM.finditer(text):
        if marker.group(1) == "BEGIN":
            if block_start is None:
                block_start = marker.end()
        elif block_start is not None:
            out += [text[last:block_start], _masked_body(text[block_start:marker.start()])]
            last, block_start = marker.start(), None
        else:
            # The key material is what precedes the END back to the first character no PEM body holds
            # (searched in the reversed text: linear).
            before = _NOT_PEM_BODY.search(text[floor:marker.start()][::-1])
            start = marker.start() - (before.start() if before else marker.start() - floor)
            out += [text[last:start], _masked_body(text[start:marker.start()])]
            last = marker.start()
        floor = marker.end()
    if block_start is not None:
        out += [text[last:block_start], _masked_body(text[block_start:])]
        last = len(text)
    out.append(text[last:])
    return "".join(out), block_start is not None


def _masked_body(body: str) -> str:
    """MARK in place of a key's body; the line breaks around it (real or JSON's `\\n`) stay."""
    lead = _EDGE_SPACE.match(body)
    trail = _EDGE_SPACE_END.search(body, lead.end() if lead else 0)
    head = lead.group() if lead else ""
    tail = trail.group() if trail else ""
    if len(head) + len(tail) >= len(body):
        return body
    return head + MARK + tail


# --- Kubernetes Secrets ----------------------------------------------------------------------------------------
def _kubernetes_secret_data(text: str) -> str:
    """A Secret's `data:`/`stringData:` entries (YAML and JSON) masked whatever their names: the names are the
    application's own."""
    lines = text.split("\n")
    block_indent: int | None = None
    for number, line in enumerate(lines):
        if block_indent is not None:
            indent = len(line) - len(line.lstrip(" \t"))
            if line.strip() and indent <= block_indent:
                block_indent = None
            elif line.strip():
                entry = _K8S_ENTRY.match(line)
                if entry is None:  # a line of a block scalar (`key: |` above it)
                    lines[number] = line[:indent] + MARK
                elif not _YAML_BLOCK.fullmatch(entry.group(2)):
                    lines[number] = entry.group(1) + MARK + entry.group(3)
                continue
        header = _K8S_DATA_LINE.match(line)
        if header:
            block_indent = len(header.group(1))
    text = "\n".join(lines)
    return _K8S_JSON_DATA.sub(lambda m: m.group(0).replace(m.group(1), _JSON_ENTRY.sub(
        lambda e: e.group(1) + MARK + e.group(3), m.group(1))), text)


# --- named values and flags ------------------------------------------------------------------------------------
def _named_values(text: str, pattern: re.Pattern[str]) -> str:
    """The value after every secret name (or flag) that `pattern` finds, masked; a name that marks nothing
    secret consumes only itself, so a secret name inside its value is still found (FOO=BAR_TOKEN=x)."""
    out: list[str] = []
    last = pos = 0
    while True:
        match = pattern.search(text, pos)
        if match is None:
            break
        span = _secret_value_span(text, match) if is_secret_name(match.group("name")) else None
        if span is None:
            pos = match.end()
            continue
        start, end, resume = span
        out += [text[last:start], MARK]
        last = end
        pos = max(resume, match.end())
    out.append(text[last:])
    return "".join(out)


def _secret_value_span(text: str, match: re.Match[str]) -> tuple[int, int, int] | None:
    """(start, end, where to look on) of the secret value after `match`'s name, or None where there is none."""
    name, opener, sep = match.group("name"), match.group("open"), match.group("sep")
    at_line_start = match.groupdict().get("bol") is not None and not opener
    # A shell's or systemd's word: quoted parts may be glued together (not JSON's, YAML's, an argv list's).
    shell_like = "=" in sep or (match.re is _FLAG and "," not in sep)
    header = is_cookie_name(name) or is_authorization_name(name)  # its value runs to the line's end
    start = match.end()
    if opener and not match.group("close"):
        # "NAME=value with spaces", "Authorization: Bearer x": the quote before the name closes the value.
        end = resume = _closing_quote(text, start, opener)
    elif quote := _QUOTE_OPEN.match(text, start):
        mark = quote.group().lstrip("bBrRuU")
        # In a shell's single quotes a backslash is a character like any other.
        end = resume = (_end_of(_SHELL_SINGLE_QUOTED, text, quote.end()) if shell_like and mark == "'"
                        else _closing_quote(text, quote.end(), mark))
        glued = (_glued_word_end(text, start, end + 1) if shell_like and mark in "'\"" and text.startswith(mark, end)
                 else end)
        # One quoted part: inside its quotes; parts glued together ('it'"'"'s'): the whole word.
        start, end = (quote.end(), end) if glued <= end + 1 else (start, glued)
        resume = max(resume, end)
    elif ":" in sep and not header and (strings := _STRING_LIST.match(text, start)):
        # vLLM's "non-default args: {..., 'api_key': ['sk-...'], ...}": the strings of the list.
        return start + 1, strings.end() - 1, strings.end()
    elif text.startswith(MARK, start) or (":" in sep and not header and (text.startswith(("{", "["), start)
                                                                         or _JSON_LITERAL.match(text, start))):
        return None  # done already; a structure whose keys are looked at one by one; null, true, false
    elif not at_line_start and not opener and not header and _is_prose(text, start, sep):
        return None  # "Failed to determine user credentials: No such process" (systemd), "per token: the ..."
    elif at_line_start and (block := _YAML_BLOCK.match(text, start)):
        return _yaml_block_span(text, len(match.group("bol")), block.end())
    elif at_line_start or header:
        end = resume = _end_of(_REST_OF_LINE, text, start)
        while end > start and text[end - 1] in " \t\r":
            end -= 1
    else:
        end = resume = _end_of(_UNQUOTED, text, start)
        if shell_like:
            end = resume = _glued_word_end(text, start, end)
    if is_authorization_name(name):
        scheme = _SCHEME.match(text, start, end)
        start = scheme.end() if scheme else start
    if end <= start or text.startswith(MARK, start):
        return None
    return start, end, resume


@functools.lru_cache(maxsize=130)
def _closing_pattern(opener: str) -> re.Pattern[str]:
    """The quote that closes a value opened with `opener` (a quote after 0..64 backslashes: a value inside a JSON
    string escaped that many times): the same quote after exactly as many backslashes."""
    quote, escapes = opener[-1], len(opener) - 1
    if escapes == 0:
        return re.compile(rf"(?:[^{quote}\\\n]++|\\.)*+")
    return re.compile(rf"[^\n]*?(?<!\\)(?=\\{{{escapes}}}{quote})")


def _closing_quote(text: str, start: int, opener: str) -> int:
    """Where the value opened by `opener` at `start` ends: before its closing quote, or at the line's end."""
    found = _closing_pattern(opener).match(text, start)
    if found is not None and (len(opener) > 1 or text.startswith(opener[-1], found.end())):
        return found.end()
    return _end_of(_REST_OF_LINE, text, start)


def _is_prose(text: str, start: int, sep: str) -> bool:
    """Whether the unquoted value at `start`, after `sep` inside a line, is a sentence's next word (`: the`,
    `= above`): a separator a sentence uses (`:`, or `=` with a blank after it and none before) and a word of
    prose after it."""
    return (":" in sep or (sep.startswith("=") and sep != "=")) and _PROSE.match(text, start) is not None


def _end_of(pattern: re.Pattern[str], text: str, start: int) -> int:
    """Where `pattern` (one that matches the empty string too) ends from `start`."""
    found = pattern.match(text, start)
    return found.end() if found else start


def _glued_word_end(text: str, start: int, end: int) -> int:
    """`end`, or where the shell word from `start` ends if a quoted part is glued on at `end` (a secret that
    holds a quote, as a shell or systemd quotes it: 'it'"'"'s', ab'c d'); an unterminated quote: the line's end."""
    if end >= len(text) or text[end] not in "'\"\\":
        return end
    word_end = _SHELL_WORD.match(text, start)
    stop = word_end.end() if word_end else start
    if stop < len(text) and text[stop] in "'\"":
        return _end_of(_REST_OF_LINE, text, stop)
    return max(end, stop)


def _yaml_block_span(text: str, indent: int, start: int) -> tuple[int, int, int] | None:
    """`password: |` and the lines under it indented deeper than the key (`indent`): all of them masked."""
    end = pos = start
    while pos < len(text) and text[pos] == "\n":
        line_end = text.find("\n", pos + 1)
        line_end = len(text) if line_end < 0 else line_end
        line = text[pos + 1:line_end]
        if line.strip() and len(line) - len(line.lstrip(" \t")) <= indent:
            break
        if line.strip():
            end = line_end
        pos = line_end
    if end == start:
        return None
    return start + 1, end, end

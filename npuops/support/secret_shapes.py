"""Text that has the shape of a secret, whatever its value, masked with MARK (pure).

Each pass keeps what names the secret (a header, a key, a flag, a URL's user) and replaces the secret itself
(how: npuops/support/secret_mask.py; XML and query strings: npuops/support/secret_markup.py); the passes and the
shapes they know are listed in npuops/support/redact.py's docstring. Every pattern is linear in its input: it
starts where nothing of its own kind precedes it (a lookbehind, put after the pattern's literal where it has one,
so that the regex engine skips to that literal at once), its repetitions are bounded or possessive, and where a
value must be looked for further (a closing quote, a line's end, the lines under a YAML key), the text looked
through is consumed, so no byte is scanned again and again (tests/collect/test_redact_corpus.py runs MiBs of `a`,
`=`, `:` and the shapes' own openings through it).
"""

from __future__ import annotations

import functools
import re

from npuops.support.secret_markup import query_values, xml_values
from npuops.support.secret_mask import (
    JSON_LITERAL,
    MARK,
    VARIABLE_REFERENCE,
    end_of,
    masked_group,
    masked_inside_blanks,
    masked_scalar,
    needs_no_mask,
    replace_groups,
)
from npuops.support.secret_names import is_authorization_name, is_cookie_name, is_secret_name

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

# The blanks and separators between a name and its value: also the no-break and ideographic spaces and the
# full-width colon and equals sign of text pasted from a web page or typed with a CJK input method.
_BLANK = "[ \t\u00a0\u2000-\u200a\u202f\u205f\u3000]"
_SEPARATOR_CHARS = str.maketrans({"\uff1a": ":", "\uff1d": "="})
# NAME=value, name: value, "name": "value", 'name': 'value', \"name\": \"value\", name = value (ini),
# os.environ['NAME'] = value, NAME and =value split over two lines by a wrapping tool (not a heading's `===`):
# the name decides (npuops/support/secret_names.py), the value is found after it.
_NAMED = re.compile(
    r"(?P<bol>^[ \t]{0,32}(?:export[ \t]{1,8}|-[ \t]{1,8})?)?(?P<open>(?<!\\)\\{0,64}[\"']|)"
    r"(?<![A-Za-z0-9_.\-])(?P<name>[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}+)(?P<close>(?P=open)|)(?:\](?<=[\"']\]))?"
    rf"(?P<sep>{_BLANK}{{0,8}}[:=\uff1a\uff1d]{_BLANK}{{0,8}}|[ \t]{{0,8}}\r?\n[ \t]{{0,8}}[:=](?![:=\-])[ \t]{{0,8}})",
    re.M)
# --api-key X, --hf-token=X, "--redis-password=X Y", ["--api-key", "X"], "--token" "X", --token \<newline> X:
# the flag's name decides.
_FLAG = re.compile(r"(?P<open>(?<!\\)\\{0,64}[\"']|)(?<![A-Za-z0-9_\-])--(?P<name>[A-Za-z0-9][A-Za-z0-9_\-]{0,63}+)"
                   r"(?P<close>(?P=open)|)(?P<sep>=|[ \t]{0,8}\\\r?\n[ \t]{0,64}|"
                   rf"{_BLANK}{{1,8}}|[ \t]{{0,8}},[ \t]{{0,8}})")
# A quoted value's opening: a quote after 0..64 backslashes (inside a JSON string escaped that many times), or a
# Python bytes or raw string's (b'...').
_QUOTE_OPEN = re.compile(r"(?:[bBrRuU]{1,2}(?=[\"']))?\\{0,64}[\"']")
_UNQUOTED = re.compile(r"[^\s\"'&,;<>(){}\[\]|\\`]*+")
_REST_OF_LINE = re.compile(r"[^\n]*+")
_BLANK_REST_OF_LINE = re.compile(r"[ \t]*+\r?+(?:\n|\Z)")
_SHELL_SINGLE_QUOTED = re.compile(r"[^'\n]*+")
# A shell word (and a systemd env value): quoted and unquoted parts glued together, 'it'"'"'s' or a\ b'c d'.
_SHELL_WORD = re.compile(r"(?:'[^'\n]*+'|\"(?:[^\"\\\n]|\\.)*+\"|\\.|[^\s'\"\\])++")
# A list of strings and plain scalars (JSON, a Python repr, YAML's flow style: a plain one may hold blanks and
# quotes): ["a", 'b'], [a b, c]; an item already masked stays one.
_LIST_ITEM = re.compile(r"""\[REDACTED\]|'(?:[^'\\\n]|\\.)*+'|"(?:[^"\\\n]|\\.)*+"|[^\s,\[\]{}'"#][^,\[\]{}\n]*+""")
_LIST = re.compile(rf"\[[^\S\n]*+(?:(?:{_LIST_ITEM.pattern})[^\S\n]*+,?+[^\S\n]*+)++\]")
# After `=`, a literal that says no secret is set (an argparse Namespace's api_key=None, an env file's
# HF_TOKEN=false); followed by more words it is a value's first word.
_EQ_LITERAL = re.compile(r"(?:None|True|False|null|true|false)(?=[,;&)\]}]|[ \t]*+(?:\r?\n|\Z))")
# The next pair of a connection string (password=x;user=bob): a value at a line's start stops before it.
_NEXT_PAIR = re.compile(r";[ \t]{0,8}[A-Za-z_][A-Za-z0-9_ .\-]{0,63}+=")
# A connection string's PWD (ODBC: Uid=bob;Pwd=x); a bare PWD elsewhere is the shell's working directory.
_AFTER_PAIR = re.compile(r";[ \t]{0,8}\Z")
# A YAML mapping entry, or an assignment (not a base64 value's trailing `=`), at the start of a line's content.
_ENTRY_LINE = re.compile(r"""(?:"[^"\n]{0,256}+"|'[^'\n]{0,256}+'|[^\s:=#'"][^\s:=]{0,255}+)[ \t]*+"""
                         r"(?::(?:[ \t]|$)|(?P<assignment>=[^=\s]))")
_YAML_BLOCK = re.compile(r"(?:![^\s]{1,64}[ \t]+)?[|>][-+0-9]{0,3}[ \t]*\r?$", re.M)
# Words that go on a sentence, not a secret: after `name: ` or `Name= ` inside a line of prose ("Failed to
# determine user credentials: No such process", "see LoadCredential= and SetCredential= above").
_PROSE_WORDS = (r"(?:the|an|and|or|is|are|was|were|be|been|not|no|none|missing|invalid|expired|required|empty|"
                r"unset|given|provided|see|above|below|for|to|of|in|on|at|with|from|by|as|if|then|must|should|can|"
                r"will|such|this|that|it)(?=[.,;:!?)\"']*+(?:\s|$))")
_PROSE = re.compile(rf"(?i:{_PROSE_WORDS})")
_SCHEME = re.compile(r"(?i)(?:bearer|basic|token|digest|negotiate|ntlm|apikey|api-key|hmac|aws4-hmac-sha256|"
                     r"sso-key)[ \t]+")

# Credentials of a command line whose tool takes them in its own way.
# (Each of these starts with its literal and looks behind it after: the regex engine skips to the literal at once.)
_USER_PASSWORD = re.compile(r"-(?<![A-Za-z0-9_\-]-)(?:u|U|-user|-proxy-user)(?:[ \t]{1,8}|=)"
                            r"(?:\"[^\s:\"@]{0,256}+:([^\"\n]++)|'[^\s:'@]{0,256}+:([^'\n]++)"
                            r"|[^\s:\"'@]{0,256}+:([^\s\"']++))")
_ATTACHED_VALUE = r"(?:'([^'\n]++)'|\"([^\"\n]++)\"|(\S++))"
# One of mysql's tools and the rest of its line (consumed: linear), and its -pVALUE there.
_MYSQL_LINE = re.compile(r"m(?<![A-Za-z0-9_.\-/]m)(?:ysql|ysqldump|ysqladmin|ysqlimport|ysqlcheck|ysqlshow|ariadb|"
                         r"ariadb-dump)\b([^\n]*+)")
_MYSQL_PASSWORD = re.compile(r"(?<=[ \t])-p" + _ATTACHED_VALUE)
_SSHPASS = re.compile(r"sshpass(?<![A-Za-z0-9_.\-/]sshpass)[ \t]{1,8}-p[ \t]{0,8}" + _ATTACHED_VALUE)
# .netrc's `password X` (not `password is X`, `password = X`: prose and ini, found by their own shapes).
_NETRC = re.compile(r"(?m)^[ \t]{0,32}(?:(?:machine|default|login)\b[^\n]{0,512}?[ \t])?password[ \t]{1,8}"
                    rf"(?![=:](?:\s|$)|(?i:{_PROSE_WORDS}))(\S++)")
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

# docker/podman/oc/az/cf ... login's -p X, -p=X, -pX (found on a line that runs a login, from `login` on).
_LOGIN_LINE = re.compile(r"login(?<![A-Za-z0-9_.\-/]login)\b([^\n]*+)")
# (The password a whole shell word: 'it'"'"'s' as shlex.quote writes it.)
_LOGIN_PASSWORD = re.compile(r"(?<=[ \t])-p(?:[ \t]{1,8}|=)?(?P<value>" + _SHELL_WORD.pattern + ")")
_ECHO_TO_STDIN = re.compile(r"echo(?<![A-Za-z0-9_.\-/]echo)[ \t]{1,8}(?:-[neE]{1,3}[ \t]{1,8})?(?P<value>"
                            + _SHELL_WORD.pattern + r")[ \t]{0,8}\|[^\n|]{0,256}?--password-stdin")
# A secret-named variable set by a command word: Windows' `setx NAME value`, fish's `set -gx NAME value`;
# Dockerfile's `ENV NAME value` (the value is the rest of the line).
_SET_COMMAND = re.compile(
    r"set(?<![A-Za-z0-9_.\-$]set)(?:x|(?:[ \t]{1,8}-[A-Za-z]{1,4}){1,3})[ \t]{1,8}"
    r"""(?P<name>[A-Za-z_][A-Za-z0-9_]{0,127}+)[ \t]{1,8}(?P<value>"(?:[^"\\\n]|\\.)*+"|'[^'\n]*+'|\S++)""")
_DOCKERFILE_ENV = re.compile(r"(?m)^[ \t]{0,32}ENV[ \t]{1,8}(?P<name>[A-Za-z_][A-Za-z0-9_]{0,127}+)[ \t]{1,8}"
                             r"(?P<value>[^\n]*+)")
# A secret name and its value as a call's first two arguments: os.environ.setdefault("HF_TOKEN", "x"),
# monkeypatch.setenv, PowerShell's SetEnvironmentVariable('HF_TOKEN', 'x', 'User').
_CALL_PAIR = re.compile(r"""\([ \t]{0,8}(?P<q>["'])(?P<name>[A-Za-z0-9_.\-]{1,128}+)(?P=q)[ \t]{0,8},[ \t]{0,8}"""
                        r"""(?P<v>["'])(?P<value>(?:(?!(?P=v))[^\\\n]|\\.)*+)(?P=v)""")
# Prose: a strong secret word, "is" or "was", a value of 6+ characters with a digit or of 20+ ("the apikey is
# x9...", "password is hunter2."); a word of prose after it (the token is expired) is none.
_PROSE_VALUE = re.compile(r"(?:is|was)[ \t]{1,8}(?:(?:now|still|set[ \t]{1,8}to)[ \t]{1,8})?[\"'`]?+"
                          r"(?P<value>(?=[^\s\"'`]{0,64}?\d|[^\s\"'`]{20})[^\s\"'`]{6,}+)")
_PROSE_NAME = re.compile(r"(?i)(?:^|(?<=[\s\"'`(]))(?:(?:api|access|secret|private)[ \t])?[\w.\-]{1,64}[ \t]{1,8}\Z")
_STRONG_SECRET_WORD = re.compile(r"(?i)pass(?:word|wd|phrase)|secret|token|api[ _\-]?key|access[ _\-]key|"
                                 r"private[ _\-]key|credential")


def redact_shapes(text: str, in_pem_block: bool = False) -> tuple[str, bool]:
    """`text` with every secret shape masked; and whether it ends inside a PEM private-key block (the next piece
    of a stream then starts masked: `in_pem_block`)."""
    text, in_pem_block = _pem_blocks(text, in_pem_block)
    if _K8S_SECRET.search(text):
        text = _kubernetes_secret_data(text)
    text = replace_groups(_URL_CREDENTIALS, text)
    text = query_values(xml_values(text))
    text = _named_values(text, _NAMED)
    text = _named_values(text, _FLAG)
    text = _CALL_PAIR.sub(_call_value, text)
    text = _SET_COMMAND.sub(_set_command_value, text)
    if "ENV" in text:
        text = _DOCKERFILE_ENV.sub(_set_command_value, text)
    text = _MYSQL_LINE.sub(lambda line: line.group(0)[:line.start(1) - line.start()]
                           + replace_groups(_MYSQL_PASSWORD, line.group(1)), text)
    text = _LOGIN_LINE.sub(lambda line: line.group(0)[:line.start(1) - line.start()] + _LOGIN_PASSWORD.sub(
        lambda password: masked_group(password, "value"), line.group(1)), text)
    text = _ECHO_TO_STDIN.sub(lambda echo: masked_group(echo, "value"), text)
    text = _PROSE_VALUE.sub(_prose_value, text)
    for pattern in (_USER_PASSWORD, _SSHPASS, _NETRC, _BARE_CREDENTIAL):
        text = replace_groups(pattern, text)
    return _PREFIXED_TOKEN.sub(MARK, text), in_pem_block


def _call_value(match: re.Match[str]) -> str:
    return masked_group(match, "value") if is_secret_name(match.group("name")) else match.group(0)


def _set_command_value(match: re.Match[str]) -> str:
    if not is_secret_name(match.group("name")):
        return match.group(0)
    if match.re is _SET_COMMAND:
        return masked_group(match, "value")
    # Dockerfile's ENV NAME value: the value is the rest of the line.
    return masked_inside_blanks(match, "value")


def _prose_value(match: re.Match[str]) -> str:
    """`NAME is VALUE` where NAME is a strong secret word and a secret name (the API key, apikey, DB_PASSWORD;
    not max tokens): VALUE masked, the sentence's punctuation after it kept."""
    before = match.string[max(0, match.start() - 80):match.start()]
    name = _PROSE_NAME.search(before)  # (None unless a blank is before the verb: not "this 123456")
    words = name.group().strip().replace(" ", "_").replace("\t", "_") if name else ""
    if not (words and _STRONG_SECRET_WORD.search(words) and is_secret_name(words)):
        return match.group(0)
    value = match.group("value")
    kept = len(value) - len(value.rstrip(".,;:!?)"))
    if needs_no_mask(value[:len(value) - kept]):
        return match.group(0)
    return match.group(0)[:match.start("value") - match.start()] + MARK + value[len(value) - kept:]


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
# (start, end, where to look on, what replaces text[start:end]) of a secret value.
_Span = tuple[int, int, int, str]


def _named_values(text: str, pattern: re.Pattern[str]) -> str:
    """The value after every secret name (or flag) that `pattern` finds, masked; a name that marks nothing
    secret consumes only itself, so a secret name inside its value is still found (FOO=BAR_TOKEN=x)."""
    out: list[str] = []
    last = pos = 0
    while True:
        match = pattern.search(text, pos)
        if match is None:
            break
        span = _secret_value_span(text, match) if _names_a_secret(text, match) else None
        if span is None:
            pos = match.end()
            continue
        start, end, resume, replacement = span
        out += [text[last:start], replacement]
        last = end
        pos = max(resume, match.end())
    out.append(text[last:])
    return "".join(out)


def _names_a_secret(text: str, match: re.Match[str]) -> bool:
    name = match.group("name")
    if is_secret_name(name):
        return True
    start = match.start("name")
    return name.upper() == "PWD" and _AFTER_PAIR.search(text, max(0, start - 9), start) is not None


def _secret_value_span(text: str, match: re.Match[str]) -> _Span | None:
    """Where the secret value after `match`'s name is and what replaces it, or None where there is none."""
    name, opener = match.group("name"), match.group("open")
    sep = "".join(" " if c.isspace() else c for c in match.group("sep").translate(_SEPARATOR_CHARS))
    at_line_start = match.groupdict().get("bol") is not None and not opener
    # A shell's or systemd's word: quoted parts may be glued together (not JSON's, YAML's, an argv list's).
    shell_like = "=" in sep or (match.re is _FLAG and "," not in sep)
    header = is_cookie_name(name) or is_authorization_name(name)  # its value runs to the line's end
    start = match.end()
    if opener and not match.group("close"):
        # "NAME=value with spaces", "Authorization: Bearer x": the quote before the name closes the value.
        end = resume = _closing_quote(text, start, opener)
    elif _QUOTE_OPEN.match(text, start):
        start, end, resume = _quoted_value(text, start, shell_like)
    elif not header and (items := _LIST.match(text, start)):
        # vLLM's "non-default args: {..., 'api_key': ['sk-...'], ...}", its Namespace(api_key=['k1', 'k2']),
        # vllm.yaml's api-key: [k1, k2]: each item of the list.
        return start, items.end(), items.end(), _LIST_ITEM.sub(lambda item: masked_scalar(item.group()), items.group())
    elif _says_no_secret(text, start, sep, header) or _is_reference(text, start, at_line_start or header):
        return None
    elif not at_line_start and not opener and not header and _is_prose(text, start, sep):
        return None  # "Failed to determine user credentials: No such process" (systemd), "per token: the ..."
    elif at_line_start and (block := _YAML_BLOCK.match(text, start)):
        span = _yaml_block_span(text, len(match.group("bol")), block.end())
        return None if span is None else (*span, MARK)
    elif at_line_start and _BLANK_REST_OF_LINE.match(text, start):
        return _value_below(text, len(match.group("bol")), start, ":" in sep)
    elif at_line_start or header:
        end = resume = end_of(_REST_OF_LINE, text, start)
        while end > start and text[end - 1] in " \t\r":
            end -= 1
        if not header and (pair := _NEXT_PAIR.search(text, start, end)):
            end = resume = pair.start()  # password=x;user=bob: a connection string's next pair
    else:
        end = resume = end_of(_UNQUOTED, text, start)
        if shell_like:
            end = resume = _glued_word_end(text, start, end)
    if is_authorization_name(name):
        scheme = _SCHEME.match(text, start, end)
        start = scheme.end() if scheme else start
    if end <= start or text.startswith(MARK, start) or VARIABLE_REFERENCE.fullmatch(text, start, end):
        return None
    if at_line_start and ":" in sep and _BLANK_REST_OF_LINE.match(text, end):
        # A YAML value that runs on over the lines under it (PyYAML folds a long one, plain or double-quoted).
        below = _value_below(text, len(match.group("bol")), end, True, continuation=True)
        if below is not None:
            return start, below[1], below[2], MARK + text[end:below[0]] + below[3]
    return start, end, resume, MARK


def _quoted_value(text: str, start: int, shell_like: bool) -> tuple[int, int, int]:
    """(start, end, where to look on) of the quoted value at `start`: inside its quotes, or the whole shell word
    where quoted parts are glued together."""
    quote = _QUOTE_OPEN.match(text, start)
    assert quote is not None
    mark = quote.group().lstrip("bBrRuU")
    # In a shell's single quotes a backslash is a character like any other.
    end = resume = (end_of(_SHELL_SINGLE_QUOTED, text, quote.end()) if shell_like and mark == "'"
                    else _closing_quote(text, quote.end(), mark))
    glued = (_glued_word_end(text, start, end + 1) if shell_like and mark in "'\"" and text.startswith(mark, end)
             else end)
    # One quoted part: inside its quotes; parts glued together ('it'"'"'s'): the whole word.
    start, end = (quote.end(), end) if glued <= end + 1 else (start, glued)
    return start, end, max(resume, end)


def _says_no_secret(text: str, start: int, sep: str, header: bool) -> bool:
    """Whether the value at `start` is masked already, or says no secret is set: null, true, false, None; after
    `:` a structure whose keys are looked at one by one ({...}, [...] that is no list of scalars)."""
    if text.startswith(MARK, start):
        return True
    if header:
        return False
    if ":" in sep:
        return text.startswith(("{", "["), start) or JSON_LITERAL.match(text, start) is not None
    return _EQ_LITERAL.match(text, start) is not None


def _is_reference(text: str, start: int, to_line_end: bool) -> bool:
    """Whether the unquoted value at `start` is a shell variable and nothing more (${VLLM_API_KEY})."""
    reference = VARIABLE_REFERENCE.match(text, start)
    if reference is None:
        return False
    if to_line_end:
        return _BLANK_REST_OF_LINE.match(text, reference.end()) is not None
    return end_of(_UNQUOTED, text, reference.end()) == reference.end()


def _value_below(text: str, indent: int, start: int, yaml: bool, continuation: bool = False) -> _Span | None:
    """`name:` or `name =` that ends its line (at `start`), its value on the lines under it indented deeper: a
    YAML plain scalar (over one line or several) or a list of scalars (`- x`, also at the key's indent), an ini
    value's continuation lines; or (`continuation`) the rest of a value begun on the name's line. Each is masked;
    a mapping under the name is left to its own keys."""
    out: list[str] = []
    skipped: list[str] = []  # blank and comment lines, kept if a line of the value follows them
    kind = ""  # "item" or "scalar": what the first line of the value is
    first = end = pos = text.find("\n", start) + 1
    while 0 < pos < len(text):
        line_end = text.find("\n", pos)
        line_end = len(text) if line_end < 0 else line_end
        line = text[pos:line_end]
        pos = line_end + 1
        body = line.strip(" \t\r")
        if not body or (body.startswith("#") and not continuation):
            skipped.append(line)
            continue
        depth = len(line) - len(line.lstrip(" \t"))
        line_kind = "item" if body.startswith("- ") or body == "-" else "scalar"
        if continuation:
            # Every line indented deeper is the value's (a quoted scalar's lines hold anything; a mapping or a
            # list there would make the YAML invalid).
            if depth <= indent:
                break
            line_kind, value = "scalar", body
        else:
            if depth < indent or (depth == indent and line_kind != "item") or kind not in ("", line_kind):
                break
            value = body[1:].lstrip(" \t") if line_kind == "item" else body
            entry = _ENTRY_LINE.match(value)
            if (entry and not (yaml and entry.group("assignment"))) or value.startswith(("{", "[")):
                break  # a mapping, or a list of mappings or lists: their keys decide
        kind = line_kind
        value_end = len(line.rstrip(" \t\r"))
        out += [*skipped, line[:value_end - len(value)] + masked_scalar(value) + line[value_end:]]
        skipped = []
        end = line_end
    if not kind:
        return None
    return first, end, end, "\n".join(out)


@functools.lru_cache(maxsize=130)
def _closing_pattern(opener: str) -> re.Pattern[str]:
    """The quote that closes a value opened with `opener` (a quote after 0..64 backslashes: a value inside a JSON
    string escaped that many times): the same quote after exactly as many backslashes. Inside single quotes, two
    of them are one (YAML's and SQL's 'it''s'; Python's repr writes 'it\\'s')."""
    quote, escapes = opener[-1], len(opener) - 1
    if escapes == 0:
        return re.compile(rf"(?:[^{quote}\\\n]++|\\.|'')*+" if quote == "'" else rf"(?:[^{quote}\\\n]++|\\.)*+")
    return re.compile(rf"[^\n]*?(?<!\\)(?=\\{{{escapes}}}{quote})")


def _closing_quote(text: str, start: int, opener: str) -> int:
    """Where the value opened by `opener` at `start` ends: before its closing quote, or at the line's end."""
    found = _closing_pattern(opener).match(text, start)
    if found is not None and (len(opener) > 1 or text.startswith(opener[-1], found.end())):
        return found.end()
    return end_of(_REST_OF_LINE, text, start)


def _is_prose(text: str, start: int, sep: str) -> bool:
    """Whether the unquoted value at `start`, after `sep` inside a line, is a sentence's next word (`: the`,
    `= above`): a separator a sentence uses (`:`, or `=` with a blank after it and none before) and a word of
    prose after it."""
    return (":" in sep or (sep.startswith("=") and sep != "=")) and _PROSE.match(text, start) is not None


def _glued_word_end(text: str, start: int, end: int) -> int:
    """`end`, or where the shell word from `start` ends if a part is glued on at `end`: a quoted one (a secret
    that holds a quote, as a shell or systemd quotes it: 'it'"'"'s', ab'c d'), or an unquoted one after a quoted
    ("ab"cd, ""0000); an unterminated quote: the line's end."""
    if end >= len(text) or (text[end] not in "'\"\\" and end_of(_UNQUOTED, text, end) == end):
        return end
    word_end = _SHELL_WORD.match(text, start)
    stop = word_end.end() if word_end else start
    if stop < len(text) and text[stop] in "'\"":
        return end_of(_REST_OF_LINE, text, stop)
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

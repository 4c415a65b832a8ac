"""Secrets in markup, masked with MARK (pure): XML entries and URL query strings, where the name that marks a value
secret is an element, an attribute or a query's field rather than NAME=value (npuops/support/secret_shapes.py
runs these passes; the names are npuops/support/secret_names.py's rule).

- XML: an element named as a secret (`<password>x</password>`, `<ns:ClientSecret>`, its text or CDATA), an entry
  whose `key` or `name` attribute is a secret name (`<add key="ApiKey" value="x"/>`: its value attribute, else its
  text: `<entry name="token">x</entry>`), Hadoop's `<name>...secret.key</name><value>x</value>` and a plist's
  `<key>password</key><string>x</string>`;
- a query inside a URL-encoded URL (`%3Fclient_secret%3Dx%26`, encoded up to 5 times: `%253D`), up to the `&` of
  its own depth;
- a signed URL's signature and credential whatever the name says (Azure's SAS `sig=`, S3's `X-Amz-Signature=` and
  `X-Amz-Credential=`, an access key id, CloudFront's `Signature=`, Google's `X-Goog-Signature=`), and `code=` of
  CODE_CHARS or more (an OAuth code, an Azure Functions key; `code=200` is a status).

Every pattern is linear: its repetitions are bounded or possessive and stop at the next `<` (XML) or `&` (a
query); a value is scanned only after a secret name, and then consumed.
"""

from __future__ import annotations

import functools
import re

from npuops.support.secret_mask import MARK, end_of, masked_group, masked_inside_blanks, needs_no_mask
from npuops.support.secret_names import is_secret_name

CODE_CHARS = 16
_SIGNED_URL_NAMES = frozenset({"sig", "signature", "x-amz-signature", "x-goog-signature", "x-amz-credential",
                               "x-goog-credential", "awsaccesskeyid"})
# A signed URL's field in a raw query (a secret name's raw pair is secret_shapes' _NAMED's, which knows its
# quoting). It starts with its character class: the regex engine skips to each ? & ; at once.
_SIGNED_QUERY = re.compile(r"(?i)[?&;](?P<name>sig|signature|x-amz-signature|x-goog-signature|x-amz-credential"
                           r"|x-goog-credential|awsaccesskeyid|code)=(?P<value>[^&;\s\"'<>#\\]++)")
# A query's name in a URL inside a URL (after %3F or %26); its value runs to the `&` of its own depth
# (_encoded_value). A name that is no secret consumes only itself: the URL inside its value is looked at too.
_ENCODED_QUERY = re.compile(
    r"%(?P<depth>(?:25){0,4}+)(?:3[Ff]|26)(?P<name>[A-Za-z][A-Za-z0-9_.\-]{0,63}+)%(?P=depth)3[Dd]")

_XML_ELEMENT = re.compile(
    r"<(?P<tag>[A-Za-z_][\w.\-]{0,63}+(?::[A-Za-z_][\w.\-]{0,63}+)?)(?P<attrs>[ \t\r\n][^<>]{0,1024}+)?>"
    r"(?:(?P<text>[^<]{1,4096}+)(?=</)|<!\[CDATA\[(?P<cdata>(?:[^\]<]|\](?!\]>)){1,4096}+)\]\]>)?")
_XML_ATTRIBUTE = re.compile(r"(?P<attr>[\w.:\-]{1,64}+)[ \t\r\n]*+=[ \t\r\n]*+"
                            r"""(?:"(?P<dq>[^"]*+)"|'(?P<sq>[^']*+)')""")
_XML_NAME_VALUE = re.compile(r"<(?P<n>name|key)>(?P<name>[^<]{1,128}+)</(?P=n)>[ \t\r\n]{0,256}+"
                             r"<(?P<v>value|string)>(?P<value>[^<]{1,4096}+)</(?P=v)>")


def query_values(text: str) -> str:
    """`text` with the secret values of its URL-encoded and signed query strings masked."""
    if "%" in text:
        text = _encoded_query_values(text)
    return _SIGNED_QUERY.sub(_signed_query_value, text)


def xml_values(text: str) -> str:
    """`text` with the secret values of its XML elements and entries masked."""
    if "<" not in text:
        return text
    text = _XML_NAME_VALUE.sub(lambda m: masked_group(m, "value") if is_secret_name(m.group("name").strip())
                               else m.group(0), text)
    return _XML_ELEMENT.sub(_xml_element, text)


def _signed_query_value(match: re.Match[str]) -> str:
    name = match.group("name").lower()
    if name in _SIGNED_URL_NAMES or (name == "code" and len(match.group("value")) >= CODE_CHARS):
        return masked_group(match, "value")
    return match.group(0)


def _encoded_query_values(text: str) -> str:
    """The value of every secret name (and signed URL's signature) in a URL-encoded query, masked."""
    out: list[str] = []
    last = pos = 0
    while match := _ENCODED_QUERY.search(text, pos):
        pos = match.end()
        name = match.group("name").lower()
        if not (name in _SIGNED_URL_NAMES or name == "code" or is_secret_name(name)):
            continue
        if text.startswith(MARK, pos):
            pos += len(MARK)  # masked already (its value is not scanned again: linear)
            continue
        end = end_of(_encoded_value(len(match.group("depth")) // 2), text, pos)
        if end > pos and not (name == "code" and end - pos < CODE_CHARS) and not needs_no_mask(text[pos:end]):
            out += [text[last:pos], MARK]
            last = pos = end
    out.append(text[last:])
    return "".join(out)


@functools.lru_cache(maxsize=8)
def _encoded_value(depth: int) -> re.Pattern[str]:
    """A value in a query URL-encoded `depth` + 1 times: up to the `&` encoded as often (%26, %2526, ...)."""
    return re.compile(rf"(?:[^%&\s\"'<>\\]|%(?!(?:25){{{depth}}}26))*+")


def _xml_element(match: re.Match[str]) -> str:
    """An element named as a secret: its text or CDATA masked; an entry whose key or name attribute is a secret
    name: its value attribute, or else its text or CDATA."""
    attrs = match.group("attrs") or ""
    secret_entry = is_secret_name(match.group("tag").rpartition(":")[2])
    value_attribute = None
    for attribute in _XML_ATTRIBUTE.finditer(attrs):
        name = attribute.group("attr").lower()
        if name in ("key", "name") and is_secret_name(attribute.group("dq") or attribute.group("sq") or ""):
            secret_entry = True
        elif name == "value":
            value_attribute = attribute
    if not secret_entry:
        return match.group(0)
    whole = match.group(0)
    if value_attribute is not None:
        group = "dq" if value_attribute.group("dq") is not None else "sq"
        start = match.start("attrs") - match.start() + value_attribute.start(group)
        end = match.start("attrs") - match.start() + value_attribute.end(group)
        return whole if needs_no_mask(whole[start:end]) else whole[:start] + MARK + whole[end:]
    if attrs.rstrip().endswith("/"):
        return whole  # <password />: no text of its own
    return masked_inside_blanks(match, "text" if match.group("text") is not None else "cdata")

"""One quoting function per sink: how a string from the user's data reaches an output.

A model name, a tokenizer folder, a file or tenant name, a field of a log row or of a
canonical file's metadata is data, and data must never become code or markup where it
lands. Each kind of output has one function here, and every place that writes that
kind of output calls it (docs/security.md lists the sinks):

==================  ==================================================================
sink                rule
==================  ==================================================================
shell (launch.sh,   :func:`shell`: one bash word, ``shlex.quote`` (ANSI-C ``$'...'``
pilot commands)     when the text holds a control character, so it stays on one line)
shell comment       :func:`comment`: control characters made ``?``, so a newline
                    cannot end the comment and start a command
Markdown text       :func:`md_text`: no raw HTML, links or code spans; controls ``?``
Markdown prose      :func:`md_prose`: :func:`md_text`, but a backtick span (the
                    program's own `kvpool ...` commands) is a code span
Markdown code       :func:`md_code`: a fence longer than any backtick run inside
dashboard text      :func:`st_text`: :func:`md_text`, and ``$`` escaped (Streamlit's
                    Markdown renders ``$...$`` as math)
Kubernetes fields   :func:`k8s_text`: ``$`` doubled, so ``$(VAR)`` is not expanded
YAML, ENV           their serializers (``yaml.safe_dump``, :func:`env_line`)
JSON                :func:`json_text`: ``json.dumps``, and every control character
                    written as a ``\\uXXXX`` escape (the value read back is unchanged)
terminal            :func:`terminal`: controls ``?``, then ``rich.markup.escape``
HTML                ``html.escape`` of :func:`scrub`'s text
==================  ==================================================================

Control characters are C0 (tab and newline included), DEL, C1, the Unicode line and
paragraph separators, and the bidirectional overrides and isolates, which can make a
terminal or a browser show text other than what a file holds.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

# every control character a name may not carry into an output
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CONTROL_LINES_RE = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def has_control(text: str) -> bool:
    """Whether ``text`` holds a character :func:`scrub` replaces."""
    return _CONTROL_RE.search(text) is not None


def scrub(text: str, *, lines: bool = False) -> str:
    """``text`` with every control character made ``?`` (newlines kept with ``lines``,
    for a multi-line block the program wrote itself)."""
    return (_CONTROL_LINES_RE if lines else _CONTROL_RE).sub("?", str(text))


def shell(text: str) -> str:
    """``text`` as one bash word that means exactly ``text``: single-quoted unless it
    needs no quotes; with a control character, ANSI-C quoted (``$'\\x1b...'``), so the
    word stays on one line and shows what it holds."""
    text = str(text)
    if not has_control(text):
        return shlex.quote(text)
    out = []
    for ch in text:
        if ch in "\\'":
            out.append("\\" + ch)
        elif has_control(ch) or not ch.isprintable():
            out.append("".join(f"\\x{b:02x}" for b in ch.encode("utf-8")))
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


def comment(text: str) -> str:
    """Text for after ``#`` in a script or a shell code block: one line, always."""
    return scrub(text)


_MD_ESCAPES = str.maketrans(
    # a backslash too: one in the text before a "[" would otherwise escape our escape
    {"\\": "\\\\", "&": "&amp;", "<": "&lt;", ">": "&gt;", "[": "\\[", "]": "\\]", "`": "\\`"}
)


def md_text(text: str) -> str:
    """Text as Markdown shows it and nothing more: no raw HTML (a ``<script>`` or
    ``<img onerror>`` in a prompt preview or a file name), no links
    (``[x](javascript:..)``), no code spans, no control characters. Entities and
    backslash escapes render as the characters themselves. A newline is a space: the
    text stays in its paragraph or table cell."""
    return scrub(str(text).replace("\n", " ")).translate(_MD_ESCAPES)


def st_text(text: str) -> str:
    """Text for Streamlit's Markdown (``st.markdown``, ``st.caption``, ``st.error``, ...)
    as itself: :func:`md_text`'s rule, and ``$`` escaped, since Streamlit renders
    ``$...$`` as LaTeX."""
    return md_text(text).replace("$", "\\$")


# A code span as the program writes one in its own sentences: `kvpool cost fit`.
CODE_SPAN_RE = re.compile(r"`([^`\n]+)`")


def prose_parts(text: str) -> list[tuple[bool, str]]:
    """``text`` cut into (is_code, part): backtick spans are code, the rest prose. A
    lone backtick stays prose; a name holding backticks can make a code span, which
    shows its text literally and carries no markup."""
    out: list[tuple[bool, str]] = []
    at = 0
    for m in CODE_SPAN_RE.finditer(text):
        if m.start() > at:
            out.append((False, text[at : m.start()]))
        out.append((True, m.group(1)))
        at = m.end()
    if at < len(text):
        out.append((False, text[at:]))
    return out


def md_prose(text: str) -> str:
    """A sentence for Markdown: :func:`md_text`'s prose, with each backtick span a code
    span (its text verbatim: no entity or escape inside a code span is read)."""
    return "".join(
        f"`{scrub(part.replace(chr(10), ' '))}`" if code else md_text(part)
        for code, part in prose_parts(str(text))
    )


def md_code(text: str, lang: str = "") -> str:
    """A fenced Markdown code block holding ``text`` verbatim: its fence is longer than
    any run of backticks inside, so nothing in ``text`` can close it."""
    body = scrub(text, lines=True).rstrip("\n")
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{re.sub(r'[^A-Za-z0-9_+-]', '', lang)}\n{body}\n{fence}"


def k8s_text(text: str) -> str:
    """A string for a Kubernetes ``command``, ``args`` or ``env`` value, where
    ``$(VAR)`` would be expanded: ``$`` is doubled (Kubernetes' own escape)."""
    return scrub(text).replace("$", "$$")


def env_line(key: str, value: str) -> str:
    """``KEY='value'`` for a file ``set -a; . FILE`` or systemd's ``EnvironmentFile``
    reads (both take single quotes)."""
    assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), key
    assert not has_control(value), (key, value)  # values are the program's own
    return f"{key}={shlex.quote(value)}"


# what json.dumps leaves raw of the control characters: it escapes C0 (and writes its
# own newlines and indents, which must stay)
_JSON_RAW_CONTROL_RE = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _json_escape(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


def json_text(doc: Any, **kwargs: Any) -> str:
    """``json.dumps(doc, **kwargs)`` with every control character of :func:`scrub`'s set
    written as a ``\\uXXXX`` escape: ``json.dumps`` escapes C0 itself, but leaves DEL,
    C1, the line separators and the bidirectional overrides raw when ``ensure_ascii`` is
    off, and those reorder or break the lines of a terminal or an editor showing the
    file. Lossless: ``json.loads`` reads back the very strings; outside strings JSON
    holds none of these characters."""
    return _JSON_RAW_CONTROL_RE.sub(_json_escape, json.dumps(doc, **kwargs))


def terminal(text: str) -> str:
    """A user-controlled string for ``rich`` with markup on: control characters ``?``
    and ``[`` escaped, so ``evil[/x]`` prints as itself and ``[link=...]`` is no link."""
    from rich.markup import escape

    return escape(scrub(text))

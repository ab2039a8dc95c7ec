"""report.html: the outline as one self-contained page (inline CSS and SVG charts, no
script, font or network), every text escaped, backtick spans as ``<code>``, and the
first use of each glossary term linked to its definition.
"""

from __future__ import annotations

import html
import re
from typing import Any

from analyzer.quoting import prose_parts, scrub
from analyzer.report.figures import VERDICT_COLOR, VERDICT_TEXT
from analyzer.report.log_sections import summary_of
from analyzer.report.outline import sections
from analyzer.report.plan_views import ReportView
from analyzer.report.summary import (
    GLOSSARY,
)

# -- glossary links -----------------------------------------------------------------------

_CASED = {"TTFT", "MFU", "SLO", "p90"}


def term_anchor(term: str) -> str:
    return "g-" + re.sub(r"[^a-z0-9]+", "-", term.lower()).strip("-")


def _term_pattern(term: str) -> re.Pattern[str]:
    flags = 0 if term in _CASED else re.IGNORECASE
    return re.compile(r"(?<![\w#-])(" + re.escape(term) + r")(?![\w-])", flags)


_TERM_RE = [(t, _term_pattern(t)) for t in sorted(GLOSSARY, key=len, reverse=True)]


def link_terms(text: str, link: Any, keep: tuple[tuple[int, int], ...] = ()) -> str:
    """``text`` with the first occurrence of each glossary term passed through
    ``link(term, matched)`` (links are not nested: a matched span is not searched again;
    nor is a ``keep`` span, such as inline code)."""
    spans: list[tuple[int, int, str]] = [(a, b, text[a:b]) for a, b in keep]
    for term, rx in _TERM_RE:
        for m in rx.finditer(text):
            if any(a < m.end() and m.start() < b for a, b, _ in spans):
                continue
            spans.append((m.start(), m.end(), link(term, m.group(1))))
            break
    out, at = [], 0
    for a, b, rep in sorted(spans):
        out += [text[at:a], rep]
        at = b
    return "".join(out) + text[at:]


# -- HTML ---------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
max-width:1100px;margin:0 auto;padding:24px;color:#1c1c1c;line-height:1.45}
h1{font-size:1.6em;margin-bottom:0}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:2em}
.verdict{border-radius:8px;padding:16px 20px;color:#fff;margin:16px 0}
.verdict .v{font-size:1.8em;font-weight:700}.verdict .t{font-size:1.1em}
table{border-collapse:collapse;margin:12px 0;font-size:.92em;width:100%}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f8}td{overflow-wrap:anywhere}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.92em;
background:#f0f2f5;padding:0 3px;border-radius:3px}pre code{background:none;padding:0}
pre{background:#f6f8fa;padding:10px;border-radius:6px;overflow-x:auto;font-size:.88em}
.chart{margin:12px 0}.chart svg{max-width:100%;height:auto}
nav a{margin-right:12px}.muted{color:#666;font-size:.9em}
.verdict .summary{margin:.6em 0 0;font-size:1em}.verdict a{color:#fff}
.verdict code{background:rgba(255,255,255,.22);color:#fff}
a.term{color:inherit;text-decoration:underline dotted}
"""


def _e(text: str) -> str:
    """Text as HTML shows it: escaped, control characters made '?'."""
    return html.escape(scrub(text))


def _coded(text: str) -> str:
    """Escaped HTML with backtick spans as ``<code>``."""
    return "".join(
        f"<code>{_e(part)}</code>" if code else _e(part) for code, part in prose_parts(text)
    )


def _linked(text: str) -> str:
    """:func:`_coded`'s HTML with glossary terms (outside code) linked to their
    definitions."""
    out = _coded(text)
    keep = tuple((m.start(), m.end()) for m in re.finditer(r"<code>.*?</code>", out))
    return link_terms(
        out,
        lambda term, m: f'<a class="term" href="#{term_anchor(term)}">{m}</a>',
        keep,
    )


def render_html_doc(doc: ReportView, charts: dict[str, str]) -> str:
    e = _e
    v = doc.verdict.verdict
    secs = sections(doc)
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>kvpool report: {e(v)}</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>kvpool: KV-cache pooling readiness</h1>",
        f'<div class="verdict" style="background:{VERDICT_COLOR.get(v, "#444")}">'
        f'<div class="v">{e(v)}</div><div class="t">{e(VERDICT_TEXT.get(v, ""))}</div>'
        f'<p class="summary">{_linked(" ".join(summary_of(doc)))}</p></div>',
        "<nav>" + "".join(f'<a href="#{s.id}">{e(s.title)}</a>' for s in secs[1:]) + "</nav>",
    ]
    for s in secs[1:]:
        out.append(f'<section id="{s.id}"><h2>{e(s.title)}</h2>')
        for p in s.paragraphs:
            if p:
                out.append(f"<p>{_linked(p)}</p>")
        for name in s.charts:
            if name in charts:
                out.append(f'<div class="chart">{charts[name]}</div>')
        for t in s.tables:
            out.append(
                "<table><thead><tr>"
                + "".join(f"<th>{e(h)}</th>" for h in t.header)
                + "</tr></thead><tbody>"
            )
            if s.id == "glossary":
                out += [
                    f'<tr id="{term_anchor(r[0])}"><td>{e(r[0])}</td><td>{_coded(r[1])}</td></tr>'
                    for r in t.rows
                ]
            else:
                out += [
                    "<tr>" + "".join(f"<td>{_linked(str(c))}</td>" for c in r) + "</tr>"
                    for r in t.rows
                ]
            out.append("</tbody></table>")
        for title, _lang, text in s.code:
            out.append(
                f"<h3>{e(title)}</h3><pre><code>{html.escape(scrub(text, lines=True))}</code></pre>"
            )
        if s.links:
            out.append(
                "<ul>"
                + "".join(
                    f'<li><a href="{e(path)}">{e(path)}</a> ({e(note)})</li>'
                    for path, note in s.links
                )
                + "</ul>"
            )
        out.append("</section>")
    out.append(
        '<p class="muted">Generated by kvpool from the report document '
        f"({e(doc.schema)}). Self-contained: no scripts, fonts or network.</p>"
    )
    out.append("</body></html>")
    return "\n".join(out) + "\n"

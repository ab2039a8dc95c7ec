"""report.md: the outline in Markdown, each text quoted for Markdown (no raw HTML or
links from the data; the program's backtick spans as code spans) and each code block
fenced so nothing inside can close it.
"""

from __future__ import annotations

from analyzer.quoting import md_code, md_prose, md_text
from analyzer.report.cells import Table
from analyzer.report.outline import sections
from analyzer.report.plan_views import ReportView

# -- Markdown -----------------------------------------------------------------------------


def _md_cell(x: str) -> str:
    return md_prose(x).replace("|", "\\|")


def _md_table(t: Table) -> str:
    lines = [
        "| " + " | ".join(_md_cell(h) for h in t.header) + " |",
        "|" + "|".join("---" for _ in t.header) + "|",
    ]
    lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in t.rows]
    return "\n".join(lines)


def render_markdown_doc(doc: ReportView) -> str:
    v = doc.verdict.verdict
    parts = [f"# kvpool report: **{v}**", ""]
    for s in sections(doc):
        parts += [f"## {md_text(s.title)}", ""]
        for p in s.paragraphs:
            if p:
                parts += [md_prose(p), ""]
        for t in s.tables:
            parts += [_md_table(t), ""]
        for title, lang, text in s.code:
            parts += [f"**{md_text(title)}**", "", md_code(text, lang), ""]
        if s.links:
            parts += [f"- [{path}]({path}) ({md_text(note)})" for path, note in s.links] + [""]
    return "\n".join(parts).rstrip() + "\n"

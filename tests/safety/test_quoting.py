"""One quoting function per sink (analyzer/quoting.py), each checked against the sink's
own reader on generated strings: bash for shell words, a CommonMark parser for code
blocks, rich for the terminal, PyYAML for Kubernetes values."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.quoting import (
    comment,
    has_control,
    json_text,
    k8s_text,
    md_code,
    md_prose,
    md_text,
    prose_parts,
    scrub,
    shell,
    st_text,
    terminal,
)

HOSTILE = [
    "$(touch PWNED)",
    "`touch PWNED`",
    "; touch PWNED ;",
    "a b'c\"d",
    "line\nnext",
    "esc\x1b[31mred",
    "evil[/x]",
    "[link=https://example.com]click[/link]",
    "back\\slash\\",
    "bidi\u202eevil",
    "c1\x85 del\x7f line\u2028sep isolate\u2066",
    "[x](https:attacker.example) <img src=x onerror=alert(1)> $x^2$ :red[y]",
    "\\[x\\](https://attacker.example) \\`code\\` \\$x\\$ a\\|b",  # our escapes escaped
    "```\nrm -rf /\n```",
    "",
]
text = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=40))


def _bash_word(word: str) -> str:
    """What bash makes of ``word`` as the argument of printf."""
    r = subprocess.run(
        ["bash", "--norc", "-c", f"printf %s {word}"],
        capture_output=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=10,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.decode("utf-8", "surrogateescape")


@settings(max_examples=60, deadline=None)
@given(text.filter(lambda s: "\x00" not in s))
def test_a_shell_word_is_exactly_its_text_on_one_line(word):
    quoted = shell(word)
    assert "\n" not in quoted and not has_control(quoted)
    assert _bash_word(quoted) == word


def test_a_hostile_shell_word_runs_nothing(tmp_path):
    for w in HOSTILE:
        r = subprocess.run(
            ["bash", "--norc", "-c", f"cd {shell(str(tmp_path))} && printf %s {shell(w)}"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert r.stdout == w
    assert not (tmp_path / "PWNED").exists()


@settings(deadline=None)
@given(text)
def test_a_comment_stays_one_line(s):
    c = comment(s)
    assert "\n" not in c and "\r" not in c and not has_control(c)


@settings(max_examples=80, deadline=None)
@given(text, st.sampled_from(["bash", "", "yaml", "x`y"]))
def test_a_code_block_cannot_be_closed_by_its_text(body, lang):
    from markdown_it import MarkdownIt

    block = md_code(body, lang)
    tokens = MarkdownIt("commonmark").parse(block + "\n\nafter")
    fences = [t for t in tokens if t.type == "fence"]
    assert len(fences) == 1
    assert fences[0].content.rstrip("\n") == scrub(body, lines=True).rstrip("\n")
    # the paragraph after the block is outside it
    assert any(t.type == "inline" and t.content == "after" for t in tokens)


def _md_markup(md: str) -> set[str]:
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    kinds = {c.type for t in tokens if t.children for c in t.children} | {t.type for t in tokens}
    return kinds & {"link_open", "code_inline", "html_inline", "html_block", "fence", "image"}


@settings(max_examples=80, deadline=None)
@given(text)
def test_markdown_text_has_no_markup(s):
    assert not _md_markup(md_text(s))


@pytest.mark.parametrize("s", HOSTILE)
def test_markdown_and_dashboard_text_of_each_hostile_name_has_no_markup(s):
    """Each of the names above, in a sentence and in a table cell (report.md escapes a
    cell's ``|`` after md_text): no link, code, HTML, and one cell stays one cell."""
    from markdown_it import MarkdownIt

    assert not _md_markup(f"see {md_text(s)} here") and not _md_markup(st_text(s))
    cell = md_text(s).replace("|", "\\|")
    table = (
        MarkdownIt("commonmark").enable("table").parse(f"| a | b |\n|---|---|\n| {cell} | x |\n")
    )
    assert sum(t.type == "td_open" for t in table) == 2, cell
    assert not _md_markup(f"| a | b |\n|---|---|\n| {cell} | x |\n")


@settings(max_examples=60, deadline=None)
@given(text.filter(lambda s: "\x00" not in s))
def test_dashboard_text_has_no_markup_and_no_formula(s):
    """Streamlit's Markdown is CommonMark with ``$...$`` formulas and ``:red[...]``
    colour directives: st_text leaves neither, nor a link, raw HTML or a code span."""
    from markdown_it import MarkdownIt

    out = st_text(s)
    tokens = MarkdownIt("commonmark").parse(out)
    kinds = {c.type for t in tokens if t.children for c in t.children} | {t.type for t in tokens}
    assert not kinds & {"link_open", "code_inline", "html_inline", "html_block", "fence"}
    assert "$" not in out.replace("\\$", "") and "[" not in out.replace("\\[", "")


@settings(max_examples=80, deadline=None)
@given(text, st.booleans())
def test_json_holds_the_text_itself_and_no_raw_control_character(s, ascii_only):
    """json_text reads back as the very string, and its bytes hold no control character
    but the serializer's own line breaks (a bidi override or a line separator would
    reorder or split what a terminal or an editor shows)."""
    import json

    out = json_text({"name": s, "n": [1, 2]}, indent=2, ensure_ascii=ascii_only)
    assert json.loads(out) == {"name": s, "n": [1, 2]}
    assert not has_control(out.replace("\n", ""))


@settings(max_examples=80, deadline=None)
@given(text)
def test_markdown_prose_has_code_spans_and_nothing_else(s):
    """A sentence with backtick spans: each span is a code span holding its text, the
    rest is text; a name with backticks can only make a code span, never markup."""
    from markdown_it import MarkdownIt

    sentence = f"calibrate with `kvpool cost fit` on {s} then `kvpool cost check`"
    tokens = MarkdownIt("commonmark").parse(md_prose(sentence))
    inline = [c for t in tokens if t.children for c in t.children]
    kinds = {c.type for c in inline} | {t.type for t in tokens}
    assert not kinds & {"link_open", "html_inline", "html_block", "fence"}
    spans = [c.content for c in inline if c.type == "code_inline"]
    assert len(spans) == sum(code for code, _ in prose_parts(sentence))
    if "`" not in s:
        assert spans == ["kvpool cost fit", "kvpool cost check"]


@settings(max_examples=80, deadline=None)
@given(text)
def test_the_terminal_prints_the_text_itself(s):
    from rich.console import Console

    console = Console(record=True, width=1000, color_system=None, soft_wrap=True)
    console.print(f"[bold]{terminal(s)}[/]", end="")
    assert console.export_text(styles=False) == scrub(s)
    assert "\x1b" not in console.export_text(styles=False)


@settings(deadline=None)
@given(text)
def test_kubernetes_values_expand_no_variable(s):
    import yaml

    value = k8s_text(s)
    assert yaml.safe_load(yaml.safe_dump({"v": value}))["v"] == value
    # Kubernetes expands $(VAR) and turns $$ into $: what the container sees is the text
    assert value.replace("$$", "$") == scrub(s)


@pytest.mark.parametrize("s", HOSTILE)
def test_scrub_leaves_no_control_character(s):
    assert not has_control(scrub(s))
    assert scrub("tab\there") == "tab?here"
    assert scrub("a\nb", lines=True) == "a\nb"


@pytest.mark.slow
def test_an_error_naming_a_hostile_file_prints_its_name_scrubbed(tmp_path):
    """Error messages print a file's name through the same rule: a bidirectional override
    or a carriage return in it cannot make the terminal show another name."""
    import os
    import sys

    name = "log\u202elmth.\r\x1b[2Kok\x9b.jsonl"
    (tmp_path / name).write_text("{not json\n")
    r = subprocess.run(
        [sys.executable, "-m", "analyzer.cli", "reuse", name, "--strict"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "KVPOOL_NO_PROGRESS": "1", "COLUMNS": "400"},
    )
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr
    assert not has_control(r.stderr.replace("\n", "")), repr(r.stderr)
    assert "log?lmth.??[2Kok?.jsonl" in r.stderr.replace("\n", "")

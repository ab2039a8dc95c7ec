"""The front door stays short, and docs/ keeps reference and design, not diaries."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_is_short_and_holds_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    blocks = re.findall(r"```bash\n(.*?)\n```", text, re.S)
    assert len(blocks) == 2, blocks
    assert "kvpool analyze traces/" in blocks[0]
    assert "pytest" in blocks[1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert blocks[1] in ci  # CI runs the README's test command unchanged


def test_no_dated_diaries_in_docs():
    dated = [
        f"{p.name}: {line}"
        for p in sorted((ROOT / "docs").glob("*.md"))
        for line in p.read_text(encoding="utf-8").splitlines()
        if line.startswith("#") and re.search(r"\b20\d\d-\d\d-\d\d\b", line)
    ]
    assert not dated, "dated measurement notes belong in bench/RESULTS.md: " + "; ".join(dated)


def test_every_linked_doc_exists():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in sorted(set(re.findall(r"\b((?:docs|bench|traces)/[\w.-]+\.md)\b", text))):
        assert (ROOT / name).is_file(), name

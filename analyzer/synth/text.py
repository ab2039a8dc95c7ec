"""Synthetic text: prose, documents, code, tool schemas, all from one seeded generator.

Speed matters (the generator must write tens of MB/s on one core), so text is built by
drawing word indices with numpy and joining precomputed strings; nothing is tokenized.
Token counts are known by construction: every vocabulary word is one cl100k token with
its leading space, every punctuation mark one more. Code lines come from a pool drawn once
per generator, with their token counts measured by a fixed characters-per-token ratio.
"""

from __future__ import annotations

import json
from typing import TypedDict

import numpy as np

from analyzer.synth.vocab import CAPITAL_TWO_TOKENS, WORDS

_SPACED = np.array([" " + w for w in WORDS], dtype=object)
_CAPS = np.array([" " + w.capitalize() for w in WORDS], dtype=object)
_CAP_EXTRA = np.array([1 if w in CAPITAL_TWO_TOKENS else 0 for w in WORDS], dtype=np.int64)
_SPACED_DOT = np.array([" " + w + "." for w in WORDS], dtype=object)
_CAPS_DOT = np.array([" " + w.capitalize() + "." for w in WORDS], dtype=object)
_BARE = np.array(WORDS, dtype=object)
# Zipf-like word popularity (rank order is the vocabulary order), drawn through a 2^16
# entry inverse-CDF table: one integer draw and one lookup per word.
_W = 1.0 / (np.arange(len(WORDS), dtype=np.float64) + 1.5) ** 1.2
_CDF = np.cumsum(_W / _W.sum())
_TABLE = np.minimum(
    np.searchsorted(_CDF, (np.arange(1 << 16) + 0.5) / (1 << 16), side="right"), len(WORDS) - 1
).astype(np.intp)

# cl100k averages close to 3.6 characters per token on the code lines below (measured
# with tiktoken in tests/synth/test_synth.py, which checks the estimate stays within 15%).
CODE_CHARS_PER_TOKEN = 3.6

_CODE_TEMPLATES = (
    "def {a}_{b}({c}, {d}):",
    "    {c} = {d}.{a}({b})",
    "    if {c} is None:",
    "        return {d}",
    "    for {c} in {d}_{a}:",
    "        {a}.append({c})",
    "    return {a}_{b}",
    "class {A}{B}:",
    "    def __init__(self, {c}):",
    "        self.{c} = {c}",
    "    # {a} the {b} before {c}",
    "{a}_{b} = {c}({d}, {b}=True)",
    "    {a}[{c}] = {d} + 1",
    "    while {c} < len({d}):",
    "import {a}.{b}",
    "    raise ValueError('{a} {b}')",
)


class ToolFunction(TypedDict):
    name: str
    description: str
    parameters: dict[str, object]


class ToolSchema(TypedDict):
    """One OpenAI function tool, as a request's ``tools`` list holds it."""

    type: str
    function: ToolFunction


class TextGen:
    """All text of one synthetic trace; deterministic given the numpy Generator."""

    def __init__(self, rng: np.random.Generator, code_pool: int = 8192) -> None:
        self.rng = rng
        self._code_lines, self._code_tokens = self._make_code_pool(code_pool)

    # -- words -----------------------------------------------------------------------
    def _word_idx(self, n: int) -> np.ndarray:
        return _TABLE[self.rng.integers(0, 1 << 16, size=n)]

    def words(self, n: int) -> list[str]:
        words: list[str] = _BARE[self._word_idx(n)].tolist()
        return words

    def prose(self, n_tokens: int) -> tuple[str, int]:
        """Sentences of about ``n_tokens`` tokens; returns (text, exact token estimate)."""
        n_tokens = max(2, int(n_tokens))
        # Sentences of 6-20 words, the last one cut to fit; a period is one more token.
        lengths = self.rng.integers(6, 21, size=n_tokens // 6 + 1)
        ends = np.cumsum(lengths + 1)
        n_sent = int(np.searchsorted(ends, n_tokens)) + 1
        n_words = max(n_sent, n_tokens - n_sent)
        idx = self._word_idx(n_words)
        last = np.minimum(np.cumsum(lengths[:n_sent]), n_words) - 1
        last = np.unique(last) if last.size > 1 and last[-1] == last[-2] else last
        first = np.concatenate(([0], last[:-1] + 1))
        pieces = _SPACED[idx]
        pieces[last] = _SPACED_DOT[idx[last]]
        pieces[first] = _CAPS[idx[first]]
        both = first[np.isin(first, last, assume_unique=True)] if first[-1] == last[-1] else ()
        if len(both):
            pieces[both] = _CAPS_DOT[idx[both]]
        text = "".join(pieces.tolist())[1:]
        tokens = n_words + last.size + int(_CAP_EXTRA[idx[first]].sum())
        return text, tokens

    def paragraphs(self, n_tokens: int, per_paragraph: int = 90) -> tuple[str, int]:
        """Prose in paragraphs separated by blank lines (documents, long answers)."""
        n_tokens = max(2, int(n_tokens))
        n_par = max(1, round(n_tokens / per_paragraph))
        sizes = np.full(n_par, n_tokens // n_par)
        sizes[: n_tokens - sizes.sum()] += 1
        parts = [self.prose(int(s)) for s in sizes]
        # The paragraph's first word loses its space and "\n\n" usually merges with it,
        # so the count stays the sum of the paragraphs' (checked against tiktoken).
        return "\n\n".join(p for p, _ in parts), sum(t for _, t in parts)

    def title(self, n_words: int = 4) -> str:
        return " ".join(w.capitalize() for w in self.words(n_words))

    def ident(self, n_words: int = 2) -> str:
        return "_".join(self.words(n_words))

    # -- code --------------------------------------------------------------------------
    def _make_code_pool(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        rng = self.rng
        t_idx = rng.integers(0, len(_CODE_TEMPLATES), size=n)
        w = _BARE[self._word_idx(4 * n)].reshape(n, 4)
        lines = []
        for k in range(n):
            a, b, c, d = w[k]
            lines.append(
                _CODE_TEMPLATES[t_idx[k]].format(
                    a=a, b=b, c=c, d=d, A=a.capitalize(), B=b.capitalize()
                )
            )
        arr = np.array(lines, dtype=object)
        tokens = np.array([(len(s) + 1) / CODE_CHARS_PER_TOKEN for s in lines])
        return arr, tokens

    def code(self, n_tokens: int) -> tuple[str, int]:
        """Python-like lines of about ``n_tokens`` tokens."""
        n_tokens = max(4, int(n_tokens))
        mean = float(self._code_tokens.mean())
        n_lines = max(1, round(n_tokens / mean))
        pick = self.rng.integers(0, self._code_lines.size, size=n_lines)
        text = "\n".join(self._code_lines[pick].tolist())
        return text, max(1, round(float(self._code_tokens[pick].sum())))

    # -- structured pieces -------------------------------------------------------------
    def tool_schema(self) -> ToolSchema:
        """One OpenAI function tool with a JSON schema of a few typed parameters."""
        n_params = int(self.rng.integers(1, 6))
        props: dict[str, dict[str, str]] = {}
        for _ in range(n_params):
            name = self.ident(2)
            kind = ("string", "integer", "boolean", "number")[int(self.rng.integers(0, 4))]
            props[name] = {
                "type": kind,
                "description": self.prose(int(self.rng.integers(6, 16)))[0],
            }
        required = list(props)[: max(1, n_params // 2)]
        return {
            "type": "function",
            "function": {
                "name": self.ident(2),
                "description": self.prose(int(self.rng.integers(15, 45)))[0],
                "parameters": {"type": "object", "properties": props, "required": required},
            },
        }

    def json_result(self, n_tokens: int) -> tuple[str, int]:
        """A tool result: a JSON object of records, about ``n_tokens`` tokens."""
        n_tokens = max(8, int(n_tokens))
        rows = []
        used = 0
        while used < n_tokens:
            k = self.words(3)
            note, t = self.prose(int(self.rng.integers(6, 20)))
            rows.append({"id": int(self.rng.integers(0, 10**6)), k[0]: k[1], "note": note})
            used += t + 12
        text = json.dumps({"status": "ok", "results": rows}, separators=(",", ":"))
        return text, used + 8


def estimate_tokens_json(obj: object) -> int:
    """Token estimate of a JSON value rendered compactly (tool schemas, arguments)."""
    return max(1, round(len(json.dumps(obj, separators=(",", ":"))) / 4.35))

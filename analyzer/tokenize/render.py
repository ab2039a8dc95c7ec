"""Render a chat request into token ids the way the serving engine frames it.

A prompt is a list of :class:`Part` s, one per message (plus template framing parts such
as Llama-3's ``<|begin_of_text|>`` and the generation prompt). Each part's token ids are
the tokenization of exactly the text chunk a server tokenizes between two special
tokens, so concatenating parts gives the server's token sequence and turn N+1 of a
conversation shares with turn N exactly the prefix it shares on a server:

* ChatML:  ``<|im_start|>`` ``{role}\\n{content}`` ``<|im_end|>`` ``\\n``, generation prompt
  ``<|im_start|>`` ``assistant\\n``.
* Llama-3: ``<|begin_of_text|>`` once, then per message ``<|start_header_id|>`` ``{role}``
  ``<|end_header_id|>`` ``\\n\\n{content}`` ``<|eot_id|>``; generation prompt
  ``<|start_header_id|>`` ``assistant`` ``<|end_header_id|>`` ``\\n\\n``.

Tool definitions are rendered as ``# Tools`` followed by one JSON object per line and
placed inside the system message (``in-system``, default), as their own system message
after it (``after-system``) or before it (``before-system``). Assistant ``tool_calls``
are appended to the assistant content as ``<tool_call>{json}</tool_call>`` lines; tool
results are messages of role ``tool``. Each image content part counts as
``image_tokens`` placeholder tokens (default 765, OpenAI's cost of a 1024x1024 image at
high detail); all placeholders of one image carry the same id, derived from the image
URL or data, so the same image shares and different images do not.

Every distinct part is tokenized once per run: parts are memoized by a blake2b digest of
their rendered text (never Python ``hash()``), in an LRU bounded by total tokens. A
gateway resends the same long system prompt and tool definitions with every request, so
the tool list's text is made once per distinct list (keyed by its pickle, which tells
apart every value the JSON encoder would write differently), and a system message with
the tools inside is recalled by its content and that key without rendering it again.
Retrieved documents come back in new messages, in new company: with a tokenizer whose
pieces never cross a blank line (cl100k), a long text is encoded paragraph by
paragraph, each distinct paragraph once (an LRU bounded by characters), which gives the
tokens encoding it whole gives.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from analyzer.tokenize.tokenizer import Tokenizer, paragraphs

TEMPLATES = ("chatml", "llama3")
TOOLS_POSITIONS = ("in-system", "after-system", "before-system")
IMAGE_TOKEN_BASE = 0xE000_0000  # placeholder ids live far above any vocabulary
_TEXT_TYPES = {"text", "input_text", "output_text"}
_IMAGE_TYPES = {"image_url", "input_image", "image"}


class RenderError(ValueError):
    """A request whose messages cannot be rendered.

    ``reason`` is a short category ("missing field", "mistyped field") and ``field`` the
    path of the offending field, e.g. ``messages[3].content``.
    """

    def __init__(self, reason: str, field: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


@dataclass(frozen=True, slots=True)
class Part:
    key: bytes  # 16-byte content address of the rendered chunk (template, role, text);
    # empty when the renderer keeps no memo
    tokens: np.ndarray  # uint32 token ids of the chunk, framing included
    role: str | None  # None for framing parts that have no text (BOS, generation prompt)
    text: str = ""  # the message text, kept only until the request is hashed


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


PREVIEW_CHARS = 80
# Texts shorter than this are encoded whole: a few paragraphs are not worth the lookups.
PARAGRAPHS_MIN_CHARS = 1024


def _preview(role: str, text: str, limit: int = PREVIEW_CHARS) -> str:
    flat = " ".join(text[: 2 * limit].split())
    out = f"{role}: {flat}"
    return out if len(out) <= limit else out[: limit - 1] + "…"


class Previews(Mapping[int, str]):
    """Block hash -> preview text, formatted when first read.

    Ingest takes a preview for every message-start block it meets (up to a bound) but a
    plain conversion reads none of them, so each is kept as (role, first characters) and
    written out as text only when asked for.
    """

    def __init__(self) -> None:
        self._raw: dict[int, tuple[str, str]] = {}

    def put(self, key: int, role: str, text: str) -> None:
        self._raw[key] = (role, text[: 2 * PREVIEW_CHARS])

    def __getitem__(self, key: int) -> str:
        return _preview(*self._raw[key])

    def __contains__(self, key: object) -> bool:
        return key in self._raw

    def __iter__(self) -> Iterator[int]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


class PromptRenderer:
    """Chat request bodies -> parts, with a content-addressed tokenization memo."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        template: str = "chatml",
        tools_position: str = "in-system",
        image_tokens: int = 765,
        memo_max_tokens: int = 16_000_000,
        memo: bool = True,
    ) -> None:
        assert template in TEMPLATES, template
        assert tools_position in TOOLS_POSITIONS, tools_position
        self.tok = tokenizer
        self.template = template
        self.tools_position = tools_position
        self.image_tokens = image_tokens
        self.memo_enabled = memo
        self.memo_max_tokens = memo_max_tokens
        self._memo: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._memo_tokens = 0
        # Fast path for plain string messages: (role, content) -> Part, skipping the
        # digest. In memory only (never persisted), bounded by the characters it holds.
        self._fast: OrderedDict[tuple[str, str], Part] = OrderedDict()
        self._fast_chars = 0
        self.fast_max_chars = 4 * memo_max_tokens  # about as many tokens again
        # A request's tool list: its pickle -> its rendered text; and a system message
        # with the tools inside: (role, content, tool list's pickle) -> its part. In
        # memory only, bounded by the characters (and bytes) they hold.
        self._tools: OrderedDict[bytes, str] = OrderedDict()
        self._tools_chars = 0
        self._fast_tools: OrderedDict[tuple[str, str, bytes], Part] = OrderedDict()
        self._fast_tools_chars = 0
        self.tools_max_chars = memo_max_tokens  # a quarter of the plain messages' bound
        # Paragraphs of long texts -> their tokens (see the module's docstring).
        self._paras: OrderedDict[str, np.ndarray] = OrderedDict()
        self._paras_chars = 0
        self.paras_max_chars = 2 * memo_max_tokens
        self._by_paragraph = memo and tokenizer.cuts_at_lines
        self.parts_seen = 0
        self.parts_tokenized = 0
        self.tokens_encoded = 0
        s = tokenizer.special
        if template == "chatml":
            self._pre = np.array([s("<|im_start|>")], dtype=np.uint32)
            self._post = np.concatenate(
                [np.array([s("<|im_end|>")], dtype=np.uint32), tokenizer.encode("\n")]
            )
        else:
            self._bos = np.array([s("<|begin_of_text|>")], dtype=np.uint32)
            self._sh = np.array([s("<|start_header_id|>")], dtype=np.uint32)
            self._eh = np.array([s("<|end_header_id|>")], dtype=np.uint32)
            self._eot = np.array([s("<|eot_id|>")], dtype=np.uint32)
        self._generation = self._part("assistant", [""], None, generation=True)
        self._bos_part = (
            Part(_digest(b"llama3:bos"), self._bos, None) if template == "llama3" else None
        )

    # -- memo ---------------------------------------------------------------------------

    def _lookup(self, key: bytes) -> np.ndarray | None:
        if not self.memo_enabled:
            return None
        hit = self._memo.get(key)
        if hit is not None:
            self._memo.move_to_end(key)
        return hit

    def _store(self, key: bytes, tokens: np.ndarray) -> None:
        if not self.memo_enabled:
            return
        self._memo[key] = tokens
        self._memo_tokens += tokens.size
        while self._memo_tokens > self.memo_max_tokens and len(self._memo) > 1:
            _, old = self._memo.popitem(last=False)
            self._memo_tokens -= old.size

    # -- rendering ----------------------------------------------------------------------

    def _part(
        self,
        role: str,
        pieces: list[str | bytes],
        preview_text: str | None,
        generation: bool = False,
    ) -> Part:
        """One framed message; ``pieces`` are text (str) or image digests (bytes)."""
        self.parts_seen += 1
        shown = None if preview_text is None else role
        # No memo, nothing to address: the key would be unused work.
        key = self._key(role, pieces, generation) if self.memo_enabled else b""
        tokens = self._lookup(key)
        if tokens is not None:
            return Part(key, tokens, shown, preview_text or "")
        self.parts_tokenized += 1
        tokens = self._frame(role, pieces, generation)
        self.tokens_encoded += int(tokens.size)
        self._store(key, tokens)
        return Part(key, tokens, shown, preview_text or "")

    def _key(self, role: str, pieces: list[str | bytes], generation: bool) -> bytes:
        """The content address of a framed message: template, kind, role and pieces."""
        h = hashlib.blake2b(digest_size=16)
        h.update(self.template.encode())
        h.update(b"\x00g" if generation else b"\x00m")
        h.update(b"\x00r")
        h.update(role.encode("utf-8", "surrogatepass"))
        for p in pieces:
            if isinstance(p, bytes):
                h.update(b"\x00i")
                h.update(p)
            else:
                h.update(b"\x00t")
                h.update(p.encode("utf-8", "surrogatepass"))
        return h.digest()

    def _encode_pieces(self, pieces: list[str | bytes]) -> list[np.ndarray]:
        out = []
        for p in pieces:
            if isinstance(p, bytes):
                tid = IMAGE_TOKEN_BASE | (int.from_bytes(p[:4], "little") & 0x0FFF_FFFF)
                out.append(np.full(self.image_tokens, tid, dtype=np.uint32))
            elif p:
                out.append(self._encode(p))
        return out

    def _encode(self, text: str) -> np.ndarray:
        """``self.tok.encode(text)``; a long text paragraph by paragraph, each distinct
        paragraph encoded once (the same tokens, see the module's docstring)."""
        if not self._by_paragraph or len(text) < PARAGRAPHS_MIN_CHARS:
            return self.tok.encode(text)
        pieces = paragraphs(text)
        if len(pieces) == 1:
            return self.tok.encode(text)
        memo, out = self._paras, []
        for p in pieces:
            tokens = memo.get(p)
            if tokens is None:
                tokens = self.tok.encode(p)
                memo[p] = tokens
                self._paras_chars += len(p)
                while self._paras_chars > self.paras_max_chars and len(memo) > 1:
                    old, _ = memo.popitem(last=False)
                    self._paras_chars -= len(old)
            else:
                memo.move_to_end(p)
            out.append(tokens)
        return np.concatenate(out)

    def _frame(self, role: str, pieces: list[str | bytes], generation: bool) -> np.ndarray:
        if self.template == "chatml":
            first = pieces[0] if pieces and isinstance(pieces[0], str) else ""
            rest = pieces[1:] if pieces and isinstance(pieces[0], str) else pieces
            body = self._encode_pieces([f"{role}\n{first}", *rest])
            if generation:  # the generation prompt has no end marker
                return np.concatenate([self._pre, *body])
            return np.concatenate([self._pre, *body, self._post])
        first = pieces[0] if pieces and isinstance(pieces[0], str) else ""
        rest = pieces[1:] if pieces and isinstance(pieces[0], str) else pieces
        head = [self._sh, self.tok.encode(role), self._eh]
        body = self._encode_pieces([f"\n\n{first}", *rest])
        if generation:
            return np.concatenate([*head, *body])
        return np.concatenate([*head, *body, self._eot])

    def _fast_part(self, role: str, content: str) -> Part:
        fk = (role, content)
        part = self._fast.get(fk)
        if part is not None:
            self.parts_seen += 1
            return part
        part = self._part(role, [content], content)
        self._fast[fk] = part
        self._fast_chars += len(content) + len(role)
        while self._fast_chars > self.fast_max_chars and len(self._fast) > 1:
            (r0, c0), _ = self._fast.popitem(last=False)
            self._fast_chars -= len(c0) + len(r0)
        return part

    def _content(self, content: object, field: str) -> tuple[list[str | bytes], str]:
        """Content (string or list of parts) -> pieces and plain text for the preview."""
        if content is None:
            return [""], ""
        if isinstance(content, str):
            return [content], content
        if not isinstance(content, list):
            raise RenderError("mistyped field", field)
        pieces: list[str | bytes] = []
        text: list[str] = []
        value: object
        for j, part in enumerate(content):
            if isinstance(part, str):
                kind, value = "text", part
            elif isinstance(part, dict):
                kind = part.get("type", "text")
                value = part.get("text")
                if not isinstance(kind, str):
                    raise RenderError("mistyped field", f"{field}[{j}].type")
            else:
                raise RenderError("mistyped field", f"{field}[{j}]")
            if kind in _TEXT_TYPES:
                if not isinstance(value, str):
                    raise RenderError("mistyped field", f"{field}[{j}].text")
                if pieces and isinstance(pieces[-1], str):
                    pieces[-1] += value
                else:
                    pieces.append(value)
                text.append(value)
            elif kind in _IMAGE_TYPES:
                ref = part.get(kind) if isinstance(part, dict) else None
                if isinstance(ref, dict):
                    ref = ref.get("url") or ref.get("file_id") or json.dumps(ref, sort_keys=True)
                if not isinstance(ref, str):
                    ref = json.dumps(part, sort_keys=True, ensure_ascii=False)
                pieces.append(_digest(ref.encode("utf-8", "surrogatepass")))
                text.append("[image]")
            else:  # audio, files, ...: count their JSON as text, the closest honest guess
                blob = json.dumps(part, sort_keys=True, ensure_ascii=False)
                if pieces and isinstance(pieces[-1], str):
                    pieces[-1] += blob
                else:
                    pieces.append(blob)
                text.append(blob)
        return pieces or [""], "".join(text)

    def _tools_text(self, tools: object, key: bytes | None) -> str:
        """``# Tools`` and one JSON object a line; made once per distinct list (``key``)."""
        if not isinstance(tools, list):
            raise RenderError("mistyped field", "tools")
        if key is not None and (hit := self._tools.get(key)) is not None:
            self._tools.move_to_end(key)
            return hit
        lines = [json.dumps(t, ensure_ascii=False) for t in tools]
        text = "# Tools\n\n" + "\n".join(lines)
        if key is not None:
            self._tools[key] = text
            self._tools_chars += len(key) + len(text)
            while self._tools_chars > self.tools_max_chars and len(self._tools) > 1:
                k, v = self._tools.popitem(last=False)
                self._tools_chars -= len(k) + len(v)
        return text

    def _tools_key(self, tools: object) -> bytes | None:
        """The tool list's exact content address, or None (no memo for it).

        ``json.dumps`` writes the same text for two lists whose pickles are equal (equal
        pickles unpickle to equal values of the same types; NaN and null, 1 and 1.0, a
        str and its subclass all pickle apart), and pickling is four times faster than
        writing the JSON (a gateway's 8 tools: 12 against 51 us)."""
        if not self.memo_enabled or not isinstance(tools, list):
            return None
        try:
            return pickle.dumps(tools, protocol=5)
        except (pickle.PicklingError, TypeError, ValueError, AttributeError, RecursionError):
            return None

    def render(self, body: Mapping[str, object]) -> tuple[list[Part], list[Part]]:
        """(message parts, generation-prompt parts) of a chat-completions request body."""
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise RenderError("missing field" if messages is None else "mistyped field", "messages")
        tools = body.get("tools") or body.get("functions")
        tools_done = not tools
        # Used only while tools_done is False, that is when there are tools.
        tools_key = self._tools_key(tools) if tools else None
        tools_text = self._tools_text(tools, tools_key) if tools else ""
        parts: list[Part] = [self._bos_part] if self._bos_part is not None else []
        if not tools_done and self.tools_position == "before-system":
            parts.append(self._part("system", [tools_text], tools_text))
            tools_done = True
        fast = self._fast
        for i, msg in enumerate(messages):
            if type(msg) is dict:
                role = msg.get("role")
                content = msg.get("content")
                # Hot path: a plain message seen before (most of a resent history).
                if tools_done and type(content) is str and type(role) is str:
                    hit = fast.get((role, content))
                    if hit is not None and "tool_calls" not in msg:
                        self.parts_seen += 1
                        parts.append(hit)
                        continue
            field = f"messages[{i}]"
            if not isinstance(msg, dict):
                raise RenderError("mistyped field", field)
            role = msg.get("role")
            if not isinstance(role, str):
                raise RenderError(
                    "missing field" if role is None else "mistyped field", f"{field}.role"
                )
            content = msg.get("content")
            if (
                tools_done
                and self.memo_enabled
                and type(content) is str
                and not msg.get("tool_calls")
            ):
                parts.append(self._fast_part(role, content))
                continue
            if (
                tools_key is not None
                and not tools_done
                and i == 0
                and role in ("system", "developer")
                and self.tools_position == "in-system"
                and type(content) is str
                and not msg.get("tool_calls")
            ):
                # The system prompt with the tools: most requests resend both unchanged.
                parts.append(self._system_with_tools(role, content, tools_key, tools_text))
                tools_done = True
                continue
            pieces, text = self._content(content, f"{field}.content")
            if not tools_done and (i > 0 or role not in ("system", "developer")):
                # No system message: the tools become one, in front.
                parts.append(self._part("system", [tools_text], tools_text))
                tools_done = True
            calls = msg.get("tool_calls")
            if calls:
                if not isinstance(calls, list):
                    raise RenderError("mistyped field", f"{field}.tool_calls")
                for c in calls:
                    fn = c.get("function", c) if isinstance(c, dict) else c
                    blob = json.dumps(
                        {"name": fn.get("name"), "arguments": fn.get("arguments")}
                        if isinstance(fn, dict)
                        else fn,
                        ensure_ascii=False,
                    )
                    empty = not text and pieces == [""]
                    add = ("" if empty else "\n") + f"<tool_call>\n{blob}\n</tool_call>"
                    if isinstance(pieces[-1], str):
                        pieces[-1] += add
                    else:
                        pieces.append(add)
                    text += add
            if not tools_done and role in ("system", "developer"):
                if self.tools_position == "in-system":
                    if isinstance(pieces[-1], str):
                        pieces[-1] += "\n\n" + tools_text
                    else:
                        pieces.append("\n\n" + tools_text)
                    parts.append(self._part(role, pieces, text))
                else:  # after-system
                    parts.append(self._part(role, pieces, text))
                    parts.append(self._part("system", [tools_text], tools_text))
                tools_done = True
                continue
            parts.append(self._part(role, pieces, text))
        if not tools_done:
            parts.append(self._part("system", [tools_text], tools_text))
        return parts, [self._generation]

    def _system_with_tools(self, role: str, content: str, key: bytes, tools_text: str) -> Part:
        """A plain system message with the tools rendered inside it (``render``'s own
        part), recalled when the same message came before with the same tool list."""
        fk = (role, content, key)
        part = self._fast_tools.get(fk)
        if part is not None:
            self._fast_tools.move_to_end(fk)
            self.parts_seen += 1
            return part
        part = self._part(role, [content + "\n\n" + tools_text], content)
        self._fast_tools[fk] = part
        self._fast_tools_chars += len(role) + len(content) + len(key)
        while self._fast_tools_chars > self.tools_max_chars and len(self._fast_tools) > 1:
            (r0, c0, k0), _ = self._fast_tools.popitem(last=False)
            self._fast_tools_chars -= len(r0) + len(c0) + len(k0)
        return part

    def render_text(self, text: str) -> list[Part]:
        """A raw prompt string (completions API, generic text column): no chat framing."""
        self.parts_seen += 1
        key = (
            _digest(b"raw\x00" + text.encode("utf-8", "surrogatepass"))
            if self.memo_enabled
            else b""
        )
        tokens = self._lookup(key)
        if tokens is None:
            self.parts_tokenized += 1
            tokens = self._encode(text)
            self.tokens_encoded += int(tokens.size)
            self._store(key, tokens)
        return [Part(key, tokens, "prompt", text)]

"""The served model's own tokenizer and chat template, from a local Hugging Face folder.

Block boundaries move with every token the template adds, so when the team names the
model folder it serves (``--tokenizer DIR`` holding ``tokenizer.json`` and
``tokenizer_config.json``), a chat request is rendered the way the engine renders it:

1. **Messages as the server passes them to the template** (vLLM's
   ``vllm/entrypoints/chat_utils.py``): keys whose value is null are dropped (as
   ``transformers`` does before rendering) and a missing content is empty; assistant
   ``tool_calls`` arguments given
   as a JSON string are parsed into an object ("tool call arguments ... need to be
   dicts not JSON str", vLLM's ``_postprocess_messages``); a list of content parts
   becomes one string, its text parts joined by newlines, unless the template itself
   loops over the parts (vLLM's "openai" content format), which then sees them as
   ``{"type": "text", "text": ...}`` items. Images and other non-text parts are not
   counted in this mode (their placeholder tokens are model-specific).
2. **The folder's ``chat_template``** rendered with ``messages``, ``tools`` (the
   request's, as given), ``add_generation_prompt=True`` and the tokenizer's named
   special tokens (``bos_token``, ``eos_token``, ...), in a sandboxed Jinja2
   environment set up as Hugging Face's ``apply_chat_template`` sets its own
   (``transformers/utils/chat_template_utils.py``: ``ImmutableSandboxedEnvironment``
   with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a
   ``tojson`` filter that does not escape HTML, ``raise_exception``, ``strftime_now``).
   A template is untrusted code: the sandbox refuses attribute access to Python
   internals. ``strftime_now`` formats one fixed instant (2024-01-01 00:00 UTC), not the
   wall clock, so the same log gives the same tokens on every run.
3. **Tokenized whole** with the folder's ``tokenizer.json``, without adding special
   tokens (the template writes them), as ``apply_chat_template(..., tokenize=True)``
   does.

A template named per use (a list of ``{"name", "template"}``) gives ``tool_use`` to
requests with tools when it exists, else ``default``; a ``chat_template.jinja`` file
beside the config is read when the config has none.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jinja2.nodes
    import jinja2.parser
    from jinja2.sandbox import ImmutableSandboxedEnvironment

import numpy as np

from analyzer.errors import UsageError
from analyzer.tokenize.render import Part, RenderError
from analyzer.tokenize.tokenizer import Tokenizer, load_tokenizer, named

# The named special tokens transformers passes to every template (its
# SPECIAL_TOKENS_ATTRIBUTES), by their string values.
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
FIXED_NOW = datetime(2024, 1, 1, tzinfo=UTC)
_TEXT_TYPES = {"text", "input_text", "output_text"}
# A template that iterates over a message's content reads it as a list of parts
# (vLLM's "openai" content format); otherwise it reads a string.
_LOOPS_OVER_CONTENT = re.compile(
    r"\{%-?\s*for\s+\w+\s+in\s+\w+(\.content|\[\s*['\"]content['\"]\s*\])"
)


@dataclass(frozen=True, slots=True)
class ModelFolder:
    """What kvpool reads from a local model folder."""

    name: str  # the folder's name (never its path: paths stay private)
    tokenizer_file: Path
    templates: dict[str, str]  # name -> Jinja source ("default", "tool_use", ...)
    special_tokens: dict[str, str] = field(default_factory=dict)

    def template_for(self, has_tools: bool) -> str:
        if has_tools and "tool_use" in self.templates:
            return self.templates["tool_use"]
        if "default" in self.templates:
            return self.templates["default"]
        return next(iter(self.templates.values()))

    @property
    def template_id(self) -> str:
        """``hf:<folder>#<12 hex>``: the folder name and a digest of its templates, so
        traces rendered under different templates are told apart (and never merged)."""
        h = hashlib.sha256()
        for k in sorted(self.templates):
            h.update(k.encode() + b"\x00" + self.templates[k].encode() + b"\x00")
        return f"hf:{self.name}#{h.hexdigest()[:12]}"


def is_model_folder(spec: str) -> bool:
    return Path(spec).is_dir()


def _token_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        content: str = value["content"]  # an AddedToken written out as a dict
        return content
    return None


def load_model_folder(path: str | Path) -> ModelFolder:
    """Read ``tokenizer.json`` and ``tokenizer_config.json`` (and ``chat_template.jinja``)
    from a Hugging Face model folder; a missing file or template is a usage error."""
    folder = Path(path)
    named(folder.name, str(path))
    tok = folder / "tokenizer.json"
    cfg_path = folder / "tokenizer_config.json"
    for f in (tok, cfg_path):
        if not f.is_file():
            raise UsageError(
                f"--tokenizer {folder.name}: the folder has no {f.name}",
                hint="give a Hugging Face model folder with tokenizer.json and "
                "tokenizer_config.json, or a tokenizer.json file",
            )
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(
            f"--tokenizer {folder.name}: cannot read tokenizer_config.json: {exc}"
        ) from None
    if not isinstance(cfg, dict):
        raise UsageError(f"--tokenizer {folder.name}: tokenizer_config.json is not an object")
    raw = cfg.get("chat_template")
    jinja_file = folder / "chat_template.jinja"
    if raw is None and jinja_file.is_file():
        raw = jinja_file.read_text(encoding="utf-8")
    templates: dict[str, str] = {}
    if isinstance(raw, str):
        templates["default"] = raw
    elif isinstance(raw, list):
        for item in raw:
            if isinstance(item, dict) and isinstance(item.get("template"), str):
                templates[str(item.get("name") or "default")] = item["template"]
    if not templates:
        raise UsageError(
            f"--tokenizer {folder.name}: tokenizer_config.json has no chat_template",
            hint="a base model has none; give the instruct model's folder, or "
            "PATH/tokenizer.json with --template chatml|llama3",
        )
    specials = {}
    for name in SPECIAL_TOKEN_NAMES:
        text = _token_text(cfg.get(name))
        if text is not None:
            specials[name] = text
    return ModelFolder(folder.name or "model", tok, templates, specials)


def _environment() -> ImmutableSandboxedEnvironment:
    """The sandbox ``apply_chat_template`` renders in (see the module docstring)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` marks assistant text for training
        masks; rendering only needs its body."""

        tags = {"generation"}  # noqa: RUF012 (jinja's own class attribute)

        def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno
            )

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: object,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def _plain_content(content: list[object], field: str, as_parts: bool) -> str | list[dict[str, str]]:
    texts: list[str] = []
    parts: list[dict[str, str]] = []
    for j, part in enumerate(content):
        value: object
        if isinstance(part, str):
            kind, value = "text", part
        elif isinstance(part, dict):
            kind, value = part.get("type", "text"), part.get("text")
        else:
            raise RenderError("mistyped field", f"{field}[{j}]")
        if kind in _TEXT_TYPES:
            if not isinstance(value, str):
                raise RenderError("mistyped field", f"{field}[{j}].text")
            texts.append(value)
            parts.append({"type": "text", "text": value})
    return parts if as_parts else "\n".join(texts)


def normalize_messages(messages: object, parts_format: bool = False) -> list[dict[str, object]]:
    """A request's messages as the server hands them to the template (module docstring,
    step 1). ``parts_format``: the template reads content as a list of parts."""
    if not isinstance(messages, list):
        raise RenderError("missing field" if messages is None else "mistyped field", "messages")
    out: list[dict[str, object]] = []
    for i, msg in enumerate(messages):
        field_name = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise RenderError("mistyped field", field_name)
        role = msg.get("role")
        if not isinstance(role, str):
            raise RenderError(
                "missing field" if role is None else "mistyped field", f"{field_name}.role"
            )
        m = {k: v for k, v in msg.items() if v is not None}
        content = m.get("content")
        if content is None:  # vLLM hands the template an empty content, not none
            m["content"] = [] if parts_format else ""
        elif isinstance(content, list):
            m["content"] = _plain_content(content, f"{field_name}.content", parts_format)
        elif content is not None and not isinstance(content, str):
            raise RenderError("mistyped field", f"{field_name}.content")
        calls = m.get("tool_calls")
        if role == "assistant" and isinstance(calls, list):
            fixed = []
            for c in calls:
                if isinstance(c, dict) and isinstance(c.get("function"), dict):
                    fn = dict(c["function"])
                    args = fn.get("arguments")
                    if isinstance(args, str):
                        # not JSON: the template gets the string as sent
                        with contextlib.suppress(ValueError):
                            fn["arguments"] = json.loads(args) if args.strip() else {}
                    c = {**c, "function": fn}
                fixed.append(c)
            m["tool_calls"] = fixed
        out.append(m)
    return out


class ChatTemplateRenderer:
    """Chat request bodies -> one part of token ids, through the folder's template.

    Offers what :class:`analyzer.tokenize.render.PromptRenderer` offers to ingest
    (``render``, ``render_text``, ``tok``, the counters), so the pipeline uses either.
    The whole prompt is one part: its key is a digest of the rendered text, so a
    resent history is tokenized again (a template may render earlier turns differently
    once a new one follows, e.g. dropping past reasoning), which is slower than the
    built-in framings but exact.
    """

    def __init__(self, folder: ModelFolder, tokenizer: Tokenizer | None = None) -> None:
        self.folder = folder
        if tokenizer is None:
            tokenizer = load_tokenizer(str(folder.tokenizer_file))
            tokenizer.name = f"hf:{folder.name}"  # the folder, never its path
        self.tok = tokenizer
        env = _environment()
        self._compiled = {}
        self._parts_format = {}
        for name, source in folder.templates.items():
            try:
                self._compiled[name] = env.from_string(source)
            except Exception as exc:  # jinja2.TemplateSyntaxError and kin
                raise UsageError(
                    f"--tokenizer {folder.name}: chat template '{name}' does not compile: {exc}"
                ) from None
            self._parts_format[name] = bool(_LOOPS_OVER_CONTENT.search(source))
        self.template = folder.template_id
        self.parts_seen = 0
        self.parts_tokenized = 0
        self.tokens_encoded = 0

    def _name_for(self, has_tools: bool) -> str:
        src = self.folder.template_for(has_tools)
        return next(k for k, v in self.folder.templates.items() if v == src)

    def render_string(self, body: Mapping[str, object]) -> str:
        """The prompt text the template renders for a chat-completions request body."""
        if not isinstance(body, dict):
            raise RenderError("mistyped field", "body")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise RenderError("mistyped field", "tools")
        name = self._name_for(bool(tools))
        messages = normalize_messages(body.get("messages"), self._parts_format[name])
        try:
            text: str = self._compiled[name].render(
                messages=messages,
                tools=tools or None,
                documents=None,
                add_generation_prompt=True,
                **self.folder.special_tokens,
            )
        except Exception as exc:  # raise_exception, a TypeError inside the template, ...
            # One skip reason for all (the summary counts by reason); the template's own
            # message goes with the field, shown in the first examples.
            why = str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__
            raise RenderError("chat template refused the request", f"messages: {why}") from None
        return text

    def render(self, body: Mapping[str, object]) -> tuple[list[Part], list[Part]]:
        text = self.render_string(body)
        return self.render_text(text, role="prompt"), []

    def render_text(self, text: str, role: str = "prompt") -> list[Part]:
        self.parts_seen += 1
        self.parts_tokenized += 1
        tokens = self.tok.encode(text)
        self.tokens_encoded += int(tokens.size)
        key = hashlib.blake2b(
            b"hf\x00" + text.encode("utf-8", "surrogatepass"), digest_size=16
        ).digest()
        return [Part(key, np.asarray(tokens, dtype=np.uint32), role, text)]

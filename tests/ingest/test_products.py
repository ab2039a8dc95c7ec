"""Gateway and observability exports read as the same requests as their OpenAI form.

Fixtures (tests/fixtures/ingest/products/) are written by hand from each product's
documented schema (docs/formats.md cites them): three requests of two sessions and two
tenants, plus the rows each product adds that are not model calls (an embedding, a
Langfuse span, a failed call). Every export must give the OpenAI form's blocks, times,
sessions, tenants, usage and reuse split; the held-out test does the same on a
``kvpool synth`` log converted to every export form (tests/helpers/product_exports.py).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from analyzer.cli.ingest import register
from analyzer.errors import InputError
from analyzer.ingest import IngestOptions, detect_format, open_trace
from analyzer.reuse.analysis import analyze_reuse
from tests.helpers.product_exports import read_openai, write_exports

FIX = Path(__file__).parents[1] / "fixtures" / "ingest" / "products"
SALT = b"products test salt"

# Each export of the fixture's requests: its files, and the rows it skips by reason.
EXPORTS = {
    "litellm-payload": (
        ["litellm_payload.jsonl"],
        {"not a chat or text completion call": 1, "failed call": 1},
    ),
    "litellm-spendlogs": (
        ["litellm_spendlogs.csv"],
        {"no prompt text (stored only with store_prompts_in_spend_logs)": 1},
    ),
    "langfuse-events": (["langfuse_observations.json"], {"not a GENERATION observation": 1}),
    "langfuse-observations-with-traces": (
        ["langfuse_observations_v2.csv", "langfuse_traces.jsonl"],
        {"Langfuse trace row (its session and user go to its observations)": 3},
    ),
    "helicone": (["helicone.json"], {"failed call": 1}),
    "portkey": (["portkey.jsonl"], {"failed call": 1}),
    "otel": (
        ["otel_genai.jsonl"],
        {"not a GenAI inference span (embeddings, tool or agent)": 1},
    ),
}
CACHED = {  # exports that carry the engine's measured hits: (cached, prompt) per request
    "litellm-payload",
    "litellm-spendlogs",
    "langfuse-events",
    "helicone",
    "portkey",
    "otel",
}


def load(paths, **kw):
    return open_trace([str(p) for p in paths], IngestOptions(salt=SALT, **kw))


@pytest.fixture(scope="module")
def openai_form():
    return load([FIX / "openai.jsonl"], keep_names=True)


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("litellm_payload.jsonl", "litellm"),
        ("litellm_spendlogs.csv", "litellm"),
        ("langfuse_observations.json", "langfuse"),
        ("langfuse_observations_v2.csv", "langfuse"),
        ("langfuse_traces.jsonl", "langfuse"),
        ("helicone.json", "helicone"),
        ("portkey.jsonl", "portkey"),
        ("otel_genai.jsonl", "otel"),
        ("openai.jsonl", "openai"),
    ],
)
def test_detected_by_content(name, fmt, tmp_path):
    assert detect_format(FIX / name) == fmt
    gz = tmp_path / "export.gz"  # and inside gzip, whatever the name says
    gz.write_bytes(gzip.compress((FIX / name).read_bytes()))
    assert detect_format(gz) == fmt


@pytest.mark.slow
@pytest.mark.parametrize("export", sorted(EXPORTS))
def test_an_export_gives_the_openai_forms_requests(export, openai_form):
    files, skips = EXPORTS[export]
    got = load([FIX / f for f in files], keep_names=True)
    want = openai_form.table
    t = got.table
    assert t.num_rows == want.num_rows == 3
    for col in ("block_hashes", "content_hashes", "prompt_tokens", "session_id", "model"):
        assert t.column(col).to_pylist() == want.column(col).to_pylist(), col
    assert t.column("tenant").to_pylist() == ["team-retail", "team-logistics", "team-retail"]
    assert t.column("tenant").to_pylist() == want.column("tenant").to_pylist()
    assert t.column("arrival_s").to_pylist() == pytest.approx(want.column("arrival_s").to_pylist())
    assert not got.untimed_files  # the timestamps were read
    assert t.column("output_tokens").to_pylist() == [22, 18, 25]
    assert t.column("user_id").to_pylist() == ["alice", "bob", "alice"]
    if export in CACHED:
        assert t.column("cached_tokens").to_pylist() == want.column("cached_tokens").to_pylist()
        assert t.column("engine_prompt_tokens").to_pylist() == [71, 69, 118]
    assert got.skipped.by_reason == skips
    # The same reuse split: from the same session, the same tenant, other tenants.
    mine, theirs = analyze_reuse(got.trace).sources, analyze_reuse(openai_form.trace).sources
    assert mine is not None and theirs is not None
    assert mine.hit_tokens_by_source == theirs.hit_tokens_by_source
    assert mine.hit_tokens_by_source["same_session"] > 0


def test_names_leave_only_as_pseudonyms_unless_kept():
    t = load([FIX / "helicone.json"]).table
    for col, prefix in (("tenant", "t-"), ("user_id", "u-"), ("session_id", "s-")):
        values = t.column(col).to_pylist()
        assert all(v.startswith(prefix) for v in values), col
        assert values[0] == values[2] != values[1]
    assert not {"alice", "bob", "team-retail"} & set(map(str, t.to_pylist()))


@pytest.mark.slow
def test_langfuse_traces_given_after_their_observations(openai_form):
    """A trace's session reaches its observations whatever order the files come in."""
    got = load([FIX / "langfuse_traces.jsonl", FIX / "langfuse_observations_v2.csv"])
    after = load([FIX / "langfuse_observations_v2.csv", FIX / "langfuse_traces.jsonl"])
    assert (
        got.table.column("session_id").to_pylist() == after.table.column("session_id").to_pylist()
    )
    alone = load([FIX / "langfuse_observations_v2.csv"], keep_names=True).table
    assert alone.column("session_id").to_pylist() == [None] * 3  # no trace rows: unknown
    assert alone.column("user_id").to_pylist() == ["alice", "bob", "alice"]


@pytest.mark.slow
def test_otlp_structured_attributes_and_legacy_message_events(tmp_path):
    """gen_ai.input.messages recorded structured (OTLP arrayValue of kvlistValue), and the
    v1.36 conventions' per-message events, read as the same chat."""

    def s(v):
        return {"stringValue": v}

    def kvl(d):
        return {"kvlistValue": {"values": [{"key": k, "value": v} for k, v in d.items()]}}

    msg = kvl(
        {
            "role": s("user"),
            "parts": {
                "arrayValue": {"values": [kvl({"type": s("text"), "content": s("hi there")})]}
            },
        }
    )
    structured = {
        "traceId": "a" * 32,
        "spanId": "b" * 16,
        "name": "chat m",
        "startTimeUnixNano": "1736154000000000000",
        "attributes": [
            {"key": "gen_ai.operation.name", "value": s("chat")},
            {"key": "gen_ai.request.model", "value": s("m")},
            {"key": "gen_ai.input.messages", "value": {"arrayValue": {"values": [msg]}}},
            {"key": "session.id", "value": s("s1")},
        ],
    }
    legacy = {
        "traceId": "c" * 32,
        "spanId": "d" * 16,
        "name": "chat m",
        "startTimeUnixNano": "1736154001000000000",
        "attributes": [
            {"key": "gen_ai.system", "value": s("openai")},
            {"key": "gen_ai.request.model", "value": s("m")},
            {"key": "gen_ai.conversation.id", "value": s("s1")},
        ],
        "events": [
            {
                "name": "gen_ai.user.message",
                "timeUnixNano": "1736154001000000000",
                "attributes": [{"key": "content", "value": s("hi there")}],
            }
        ],
    }
    log = tmp_path / "spans.jsonl"
    log.write_text(json.dumps(structured) + "\n" + json.dumps(legacy) + "\n")
    plain = tmp_path / "plain.jsonl"
    plain.write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": 1736154000 + i,
                    "request": {
                        "model": "m",
                        "messages": [{"role": "user", "content": "hi there"}],
                    },
                }
            )
            + "\n"
            for i in range(2)
        )
    )
    t = load([log], keep_names=True).table
    assert (
        t.column("block_hashes").to_pylist()
        == load([plain]).table.column("block_hashes").to_pylist()
    )
    assert t.column("session_id").to_pylist()[0] == t.column("session_id").to_pylist()[1]
    assert t.column("request_id").to_pylist() == ["b" * 16, "d" * 16]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "text"),
    [
        ("minified", lambda rows: json.dumps(rows)),
        ("pretty", lambda rows: json.dumps(rows, indent=2)),
        (
            "pages",
            lambda rows: "".join(
                json.dumps({"data": [r], "meta": {"page": i}}) + "\n" for i, r in enumerate(rows)
            ),
        ),
        ("objects", lambda rows: "\n".join(json.dumps(r, indent=2) for r in rows)),
    ],
)
def test_json_documents_in_any_layout(kind, text, tmp_path):
    rows = json.loads((FIX / "helicone.json").read_text())
    p = tmp_path / f"{kind}.json"
    p.write_text(text(rows))
    assert detect_format(p) == "helicone"
    got = load([p]).table
    assert (
        got.column("block_hashes").to_pylist()
        == load([FIX / "helicone.json"]).table.column("block_hashes").to_pylist()
    )


# -- bad input ---------------------------------------------------------------------------


def test_bad_rows_name_file_line_and_field(tmp_path):
    rows = [json.loads(x) for x in (FIX / "litellm_payload.jsonl").read_text().splitlines()]
    rows[0]["messages"] = 42
    rows[1]["startTime"] = "yesterday"
    rows[2]["completion_tokens"] = -3
    p = tmp_path / "bad.jsonl"
    p.write_text(
        "".join(json.dumps(r) + "\n" for r in rows[:3])
        + '{"id": "cut"\n'
        + json.dumps(rows[0])
        + "\n"
    )
    with pytest.raises(InputError) as err:  # nothing usable is left: one line naming why
        load([p])
    msg = str(err.value)
    assert "bad.jsonl:1: mistyped field (field 'messages')" in msg
    assert "bad.jsonl:2: bad timestamp (field 'startTime')" in msg
    assert "bad.jsonl:3: negative value (field 'completion_tokens')" in msg
    assert "bad.jsonl:4: malformed JSON" in msg
    with pytest.raises(InputError, match=r"bad.jsonl:1 \(field 'messages'\): mistyped field"):
        load([p], strict=True)


def test_a_malformed_json_document_ends_at_the_bad_record(tmp_path):
    text = (FIX / "helicone.json").read_text()
    cut = text.rindex('"request_id": "req-3"')
    p = tmp_path / "cut.json"
    p.write_text(text[:cut] + "!!" + text[cut:])
    got = load([p])
    assert got.table.num_rows == 2
    assert got.skipped.by_reason == {"malformed JSON": 1}
    assert got.skipped.examples == [f"{p}:3: malformed JSON"]


def test_truncated_compressed_document_is_an_error(tmp_path):
    data = gzip.compress((FIX / "helicone.json").read_bytes())
    p = tmp_path / "cut.json.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated compressed file"):
        load([p])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "edit", "reason", "field"),
    [
        (
            "helicone.json",
            lambda r: r.update(request_body="{not json"),
            "malformed JSON",
            "request_body",
        ),
        (
            "helicone.json",
            lambda r: r.update(request_created_at=None),
            "missing timestamp",
            "request_created_at",
        ),
        (
            "portkey.jsonl",
            lambda r: r.update({"request.body": {"model": "m"}}),
            "missing field",
            "request.body.messages",
        ),
        ("langfuse_observations.json", lambda r: r.update(type=None), "missing field", "type"),
        ("langfuse_observations.json", lambda r: r.update(input=7), "mistyped field", "input"),
    ],
)
def test_a_bad_field_is_a_counted_skip_naming_it(name, edit, reason, field, tmp_path):
    text = (FIX / name).read_text()
    rows = (
        json.loads(text) if name.endswith(".json") else [json.loads(x) for x in text.splitlines()]
    )
    edit(rows[2])  # a model call after the first (the first row decides if a file is timed)
    p = tmp_path / name
    p.write_text(
        json.dumps(rows) if name.endswith(".json") else "".join(json.dumps(r) + "\n" for r in rows)
    )
    got = load([p])
    assert got.skipped.by_reason.get(reason) == 1
    assert any(e.endswith(f": {reason} (field '{field}')") for e in got.skipped.examples)


def test_otlp_bad_messages_and_missing_content(tmp_path):
    line = json.loads((FIX / "otel_genai.jsonl").read_text().splitlines()[1])
    spans = line["resourceSpans"][0]["scopeSpans"][0]["spans"]
    for a in spans[0]["attributes"]:
        if a["key"] == "gen_ai.input.messages":
            a["value"] = {"stringValue": "[{"}
    spans[1]["attributes"] = [
        a for a in spans[1]["attributes"] if a["key"] != "gen_ai.input.messages"
    ]
    p = tmp_path / "spans.jsonl"
    p.write_text(
        json.dumps(line) + "\n" + (FIX / "otel_genai.jsonl").read_text().splitlines()[0] + "\n"
    )
    got = load([p])
    assert got.table.num_rows == 1
    assert got.skipped.by_reason["malformed JSON"] == 1
    assert got.skipped.by_reason["no input messages (content capture is off)"] == 1


@pytest.mark.slow
def test_otlp_objects_where_arrays_stand_are_counted_skips(tmp_path):
    """An OTLP request whose ``spans`` or ``scopeSpans`` is an object, not an array, is a
    counted skip naming the field (never iterated by its keys); an intValue of Infinity
    is kept as given, not a traceback."""
    lines = (FIX / "otel_genai.jsonl").read_text().splitlines()
    good = json.loads(lines[0])
    no_spans = json.loads(lines[1])
    no_spans["resourceSpans"][0]["scopeSpans"][0]["spans"] = {"spanId": "x"}
    no_scopes = json.loads(lines[1])
    no_scopes["resourceSpans"][0]["scopeSpans"] = {"spans": []}
    endless = {"key": "kvpool.test.count", "value": {"intValue": float("inf")}}
    good["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"].append(endless)
    alone = tmp_path / "good.jsonl"
    alone.write_text(json.dumps(good) + "\n")
    p = tmp_path / "spans.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in (no_spans, no_scopes, good)))
    want, got = load([alone]), load([p])
    assert got.table.num_rows == want.table.num_rows == 1
    mistyped = got.skipped.by_reason.pop("mistyped field")
    assert mistyped == 2 and "mistyped field" not in want.skipped.by_reason
    assert got.skipped.by_reason == want.skipped.by_reason  # the good line's embedding


# -- privacy -----------------------------------------------------------------------------

CANARY = "Zq7canaryXv"


def test_no_private_field_of_any_export_reaches_the_trace(tmp_path):
    """Prompts, tenants, users and sessions read by the new readers leave no output
    unless --keep-names (and only the ids and names then; never the prompt text)."""
    rows = read_openai(FIX / "openai.jsonl")
    for r in rows:
        meta = r["request"]["metadata"]
        meta["session_id"] = f"{CANARY}-{meta['session_id']}"
        meta["tenant"] = f"{CANARY}-{r['tenant']}"
        r["request"]["messages"][-1]["content"] += f" {CANARY}"
    exports = write_exports(rows, tmp_path / "exports")
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def _noop() -> None:  # a second command keeps typer in multi-command mode
        pass

    for name, paths in exports.items():
        out = tmp_path / f"{name}.parquet"
        r = CliRunner().invoke(
            app,
            ["convert", *map(str, paths), "-o", str(out), "--salt-file", str(tmp_path / "salt")],
        )
        assert r.exit_code == 0, (name, r.output)
        assert CANARY not in r.output
        table = pq.read_table(out)
        assert CANARY not in json.dumps(table.to_pylist(), default=str) + str(
            table.schema.metadata
        ), name
        kept = tmp_path / f"{name}-named.parquet"
        r = CliRunner().invoke(
            app,
            [
                "convert",
                *map(str, paths),
                "-o",
                str(kept),
                "--keep-names",
                "--salt-file",
                str(tmp_path / "salt"),
            ],
        )
        named = pq.read_table(kept)
        assert any(CANARY in str(t) for t in named.column("tenant").to_pylist()), name
        assert all(f" {CANARY}" not in json.dumps(x, default=str) for x in named.to_pylist())


# -- the held-out log --------------------------------------------------------------------


@pytest.mark.slow
def test_held_out_log_gives_the_same_same_session_share_in_every_export(tmp_path):
    """The issue's "done when": a multi-turn, multi-tenant log made by ``kvpool synth``,
    converted to LiteLLM, Langfuse, Helicone (and Portkey, OpenTelemetry) exports, gives
    its OpenAI form's same-session share and reuse split, with its timestamps read."""
    from analyzer.synth import SynthConfig, generate

    log = tmp_path / "held-out.jsonl"
    generate(SynthConfig(profile="mixed", requests=400, seed=36), log)
    base = load([log])
    want = analyze_reuse(base.trace).sources
    assert want is not None and want.share_of_hits["same_session"] > 0.1
    assert len({t for t in base.table.column("tenant").to_pylist()}) >= 3
    rows = read_openai(log)
    sessions = base.table.column("session_id").to_pylist()
    for name, paths in write_exports(rows, tmp_path / "exports").items():
        got = load(paths)
        assert not got.untimed_files, name
        assert got.table.num_rows == base.table.num_rows, name
        assert (
            got.table.column("block_hashes").to_pylist()
            == base.table.column("block_hashes").to_pylist()
        ), name
        assert got.table.column("arrival_s").to_pylist() == pytest.approx(
            base.table.column("arrival_s").to_pylist(), abs=1e-6
        ), name
        mine = got.table.column("session_id").to_pylist()
        # Where the log names a session the export names the same; LiteLLM and Portkey
        # give a request without one an id of its own (its trace), never shared.
        assert [m for m, s in zip(mine, sessions, strict=True) if s] == [
            s for s in sessions if s
        ], name
        others = [m for m, s in zip(mine, sessions, strict=True) if not s and m]
        assert len(others) == len(set(others)), name
        src = analyze_reuse(got.trace).sources
        assert src is not None
        assert src.share_of_hits["same_session"] == want.share_of_hits["same_session"], name
        assert src.hit_tokens_by_source == want.hit_tokens_by_source, name
    shutil.rmtree(tmp_path / "exports")

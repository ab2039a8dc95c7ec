"""Readers, the canonical table, bad input and determinism, on fixtures and real traces."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import typer
import zstandard
from typer.testing import CliRunner

from analyzer.cli.ingest import register
from analyzer.errors import InputError, UsageError
from analyzer.ingest import IngestOptions, detect_format, open_trace, previews_path
from analyzer.ingest.export import export_bailian, export_mooncake
from analyzer.trace import CANONICAL_SCHEMA, BlockTrace, read_metadata, write_canonical

FIX = Path(__file__).parents[1] / "fixtures" / "ingest"
SALT = b"fixed test salt"
OPTS = IngestOptions(salt=SALT)


def load(*paths, **kw):
    return open_trace([str(p) for p in paths], IngestOptions(salt=SALT, **kw))


# -- formats ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("chat.jsonl", "openai"),
        ("chat_gateway.csv", "gateway-csv"),
        ("chat_batch.jsonl", "openai-batch"),
        ("mooncake_small.jsonl", "mooncake"),
        ("bailian_small.jsonl", "bailian"),
        ("azure_small.csv", "azure"),
        ("burstgpt_small.csv", "burstgpt"),
        ("generic.csv", "generic-csv"),
        ("ragpulse/0_trace.jsonl", "ragpulse"),
    ],
)
def test_detect_format(name, fmt):
    assert detect_format(FIX / name) == fmt


def test_same_conversation_in_three_formats_hashes_identically():
    a, b, c = (load(FIX / n) for n in ("chat.jsonl", "chat_gateway.csv", "chat_batch.jsonl"))
    ha = a.table.column("block_hashes").to_pylist()
    assert ha == b.table.column("block_hashes").to_pylist()
    assert ha == c.table.column("block_hashes").to_pylist()
    assert (
        a.table.column("prompt_tokens").to_pylist() == b.table.column("prompt_tokens").to_pylist()
    )
    # Gateway timestamps are ms and the log's are seconds: the same arrivals either way.
    assert a.table.column("arrival_s").to_pylist() == b.table.column("arrival_s").to_pylist()
    assert c.untimed_files  # Batch input has no times: spaced 1 s in file order


def test_openai_log_fields_and_multi_turn_sharing():
    lt = load(FIX / "chat.jsonl", previews=True, keep_names=True)
    t = lt.table
    assert t.num_rows == 6
    sessions = t.column("session_id").to_pylist()
    assert sessions[0::2] == [sessions[0]] * 3 and sessions[1::2] == [sessions[1]] * 3
    assert sessions[0] != sessions[1] and sessions[0].startswith("s-")  # salted pseudonyms
    assert set(t.column("model").to_pylist()) == {"gpt-4o-mini"}
    assert t.column("tenant").to_pylist() == t.column("model").to_pylist()  # no tenant given
    assert t.column("output_tokens").to_pylist() == [9 + i for i in range(6)]
    assert read_metadata(t)["t0_epoch_s"] == "1700000000.0"
    prompts = t.column("prompt_tokens").to_pylist()
    lcp = t.column("token_lcp_prev").to_pylist()
    hashes = t.column("block_hashes").to_pylist()
    assert lcp[0] == 0
    for i in (2, 4):  # alice's turns 2 and 3 resend turn 1 and 2 entirely
        assert lcp[i] == prompts[i - 2]
        assert hashes[i][: prompts[i - 2] // 16] == hashes[i - 2][: prompts[i - 2] // 16]
    # Both sessions share the system prompt and tools (several blocks) but not the users.
    assert 16 <= lcp[1] < prompts[0]
    assert all(len(h) == p // 16 for h, p in zip(hashes, prompts, strict=True))
    assert lt.previews and all(len(v) <= 80 for v in lt.previews.values())
    assert lt.stats["parts_tokenized"] < lt.stats["parts_seen"]


def test_the_end_user_is_kept_as_a_pseudonym_unless_names_are_kept(tmp_path):
    rows = [
        {
            "timestamp": 1_700_000_000 + i,
            "user": f"user-{i % 2}@example.com",
            "request": {"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}]},
        }
        for i in range(4)
    ]
    log = tmp_path / "users.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    users = load(log).table.column("user_id").to_pylist()
    assert users[0] == users[2] != users[1] == users[3]
    assert all(u.startswith("u-") and "example" not in u for u in users)
    named = load(log, keep_names=True).table.column("user_id").to_pylist()
    assert named == [f"user-{i % 2}@example.com" for i in range(4)]


@pytest.mark.slow
def test_generic_csv_with_prompt_column():
    lt = load(FIX / "generic.csv", prompt_column="prompt", time_column="time")
    t = lt.table
    s = t.column("session_id").to_pylist()
    assert s[0] == s[1] != s[2]
    assert t.column("arrival_s").to_pylist() == [0.0, 3.25, 9.0]
    lcp = t.column("token_lcp_prev").to_pylist()
    assert lcp[0] == 0 and lcp[1] > 10 and lcp[2] == 0


def test_mooncake_fixture_full_blocks_only():
    t = load(FIX / "mooncake_small.jsonl").trace
    assert t.block_size == 512
    assert np.diff(t.offsets).tolist() == [2, 3, 1, 0]  # input // 512
    assert t.blocks_of(1)[:2].tolist() == t.blocks_of(0).tolist()
    assert t.arrival_s.tolist() == [0.0, 0.5, 1.5, 2.5]  # ms -> s
    coarse = load(FIX / "mooncake_small.jsonl", block_size=1024).trace
    assert np.diff(coarse.offsets).tolist() == [1, 1, 0, 0]
    with pytest.raises(UsageError, match="multiple"):
        load(FIX / "mooncake_small.jsonl", block_size=16)


def test_bailian_fixture_sessions_and_parents():
    t = load(FIX / "bailian_small.jsonl", keep_names=True).table
    s = t.column("session_id").to_pylist()
    assert s[0] == s[2] != s[1]
    assert t.column("parent_request_id").to_pylist() == [None, None, "10"]
    assert t.column("turn").to_pylist() == [1, 1, 2]
    h = t.column("block_hashes").to_pylist()
    assert [len(x) for x in h] == [2, 1, 4] and h[2][:2] == h[0][:2]


def test_ragpulse_fixture_expands_components():
    lt = load(FIX / "ragpulse" / "0_trace.jsonl")
    t = lt.table
    # Row "4" arrives first; rows are sorted and the swap is reported.
    assert t.column("arrival_s").to_pylist() == [0.0, 6.0, 16.0]
    assert lt.reordered == 1
    # sys 20 + passages 10,12 (order 2,1) + history 3 + user 4 = 49, padded to 58.
    assert t.column("prompt_tokens").to_pylist() == [58, 60, 70]
    # s1 (20 sys + 12 + 10 passages) shares 20 tokens with s2 (passages swapped).
    assert t.column("token_lcp_prev").to_pylist() == [0, 20, 42]
    tr = lt.trace
    assert tr.content_ids is not None
    # Non-prefix reuse: request 1's passage blocks exist in request 0 at other positions.
    assert (
        len(
            set(tr.content_ids[tr.offsets[1] : tr.offsets[2]])
            & set(tr.content_ids[: tr.offsets[1]])
        )
        >= 1
    )


@pytest.mark.parametrize("name", ["azure_small.csv", "burstgpt_small.csv"])
def test_count_only_traces(name):
    lt = load(FIX / name)
    assert lt.trace.count_only and lt.trace.n_accesses == 0
    assert lt.table.column("token_lcp_prev").null_count == lt.table.num_rows


def test_azure_seven_digit_fractions_and_sorting():
    lt = load(FIX / "azure_small.csv")
    arr = lt.table.column("arrival_s").to_pylist()
    assert arr == pytest.approx([0.0, 3.41941, 4.314579], abs=1e-6)
    assert lt.reordered == 1
    assert lt.table.column("prompt_tokens").to_pylist() == [374, 1020, 396]


# -- compression, merging, round trip, determinism ---------------------------------------


def test_gzip_and_zstd_inputs_read_the_same(tmp_path):
    raw = (FIX / "chat.jsonl").read_bytes()
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    base = load(FIX / "chat.jsonl").table.column("block_hashes")
    for name in ("c.jsonl.gz", "c.jsonl.zst"):
        assert load(tmp_path / name).table.column("block_hashes") == base


def test_several_files_merge_in_time_order(tmp_path):
    lines = (FIX / "chat.jsonl").read_text().splitlines()
    (tmp_path / "odd.jsonl").write_text("\n".join(lines[1::2]) + "\n")
    (tmp_path / "even.jsonl").write_text("\n".join(lines[0::2]) + "\n")
    merged = load(tmp_path / "odd.jsonl", tmp_path / "even.jsonl").table
    whole = load(FIX / "chat.jsonl").table
    assert merged.column("block_hashes") == whole.column("block_hashes")
    assert merged.column("token_lcp_prev") == whole.column("token_lcp_prev")
    assert merged.column("arrival_s") == whole.column("arrival_s")


def test_canonical_files_merge_on_one_clock(tmp_path):
    lines = (FIX / "chat.jsonl").read_text().splitlines()
    (tmp_path / "late.jsonl").write_text("\n".join(lines[len(lines) // 2 :]) + "\n")
    (tmp_path / "early.jsonl").write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    for name in ("late", "early"):
        write_canonical(load(tmp_path / f"{name}.jsonl").table, tmp_path / f"{name}.parquet")
    merged = load(tmp_path / "late.parquet", tmp_path / "early.parquet").table
    whole = load(FIX / "chat.jsonl").table
    assert merged.column("block_hashes") == whole.column("block_hashes")
    assert merged.column("arrival_s").to_pylist() == pytest.approx(
        whole.column("arrival_s").to_pylist(), abs=1e-6
    )
    assert float(read_metadata(merged)["t0_epoch_s"]) == float(read_metadata(whole)["t0_epoch_s"])
    early = pq.read_table(tmp_path / "early.parquet")
    rel = tmp_path / "rel.parquet"  # the same rows, but with relative times
    meta = {**early.schema.metadata, b"kvpool.t0_epoch_s": b""}
    pq.write_table(early.replace_schema_metadata(meta), rel)
    with pytest.raises(InputError, match=r"late\.parquet \(absolute\), .*rel\.parquet \(relative"):
        load(tmp_path / "late.parquet", rel)


@pytest.mark.slow
def test_canonical_files_hashed_differently_are_not_merged(tmp_path):
    lines = (FIX / "chat.jsonl").read_text().splitlines()
    (tmp_path / "a.jsonl").write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(lines[len(lines) // 2 :]) + "\n")
    a = tmp_path / "a.parquet"
    write_canonical(load(tmp_path / "a.jsonl").table, a)
    cases = {
        "salts": IngestOptions(salt=b"another salt"),
        "chat templates": IngestOptions(salt=SALT, template="llama3"),
        "hash keys": IngestOptions(salt=SALT, hash_keys=()),
    }
    for what, opts in cases.items():
        b = tmp_path / f"b-{what.replace(' ', '-')}.parquet"
        write_canonical(open_trace([tmp_path / "b.jsonl"], opts).table, b)
        with pytest.raises(InputError, match=f"different {what} cannot be merged") as e:
            open_trace([a, b])
        assert str(a) in str(e.value) and str(b) in str(e.value)
    same = tmp_path / "b.parquet"
    write_canonical(load(tmp_path / "b.jsonl").table, same)
    assert open_trace([a, same]).table.num_rows == len(lines)
    # Salts are told apart by a one-way id, never written themselves.
    meta = read_metadata(pq.read_table(a))
    assert len(meta["salt_id"]) == 12 and SALT.hex() not in str(meta)


def test_canonical_round_trip_with_previews(tmp_path):
    assert not load(FIX / "chat.jsonl").previews  # private by default: no text kept
    lt = load(FIX / "chat.jsonl", previews=True)
    out = tmp_path / "t.parquet"
    write_canonical(lt.table, out)
    assert pq.read_schema(out).remove_metadata() == CANONICAL_SCHEMA.remove_metadata()
    back = open_trace([out], OPTS)
    assert back.formats == ["canonical"]
    assert back.table.column("block_hashes") == lt.table.column("block_hashes")
    assert back.trace.previews == {}  # no sidecar, no text
    import pyarrow as pa

    items = sorted(lt.previews.items())
    pq.write_table(
        pa.table(
            {
                "block_hash": pa.array([h for h, _ in items], pa.uint64()),
                "preview": [v for _, v in items],
            }
        ),
        previews_path(out),
    )
    assert open_trace([out], OPTS).trace.previews == {}  # the sidecar is read when asked
    wanted = IngestOptions(salt=SALT, previews=True)
    assert open_trace([out], wanted).trace.previews == lt.trace.previews


def test_no_text_in_canonical_or_exports(tmp_path):
    lt = load(FIX / "chat.jsonl")
    out = tmp_path / "t.parquet"
    write_canonical(lt.table, out)
    export_mooncake(lt.table, tmp_path / "m.jsonl")
    export_bailian(lt.table, tmp_path / "b.jsonl")
    for p in (out, tmp_path / "m.jsonl", tmp_path / "b.jsonl"):
        data = p.read_bytes()
        for needle in (b"travel assistant", b"flight", b"alice", b"UA 12"):
            assert needle not in data, (p, needle)


def test_two_runs_byte_identical(tmp_path):
    outs = []
    for run in range(2):
        lt = load(FIX / "chat.jsonl", FIX / "generic.csv", prompt_column="prompt")
        d = tmp_path / str(run)
        d.mkdir()
        write_canonical(lt.table, d / "t.parquet")
        export_mooncake(lt.table, d / "m.jsonl")
        export_bailian(lt.table, d / "b.jsonl")
        outs.append([(d / n).read_bytes() for n in ("t.parquet", "m.jsonl", "b.jsonl")])
    assert outs[0] == outs[1]


def test_exports_follow_the_replayer_formats(tmp_path):
    lt = load(FIX / "mooncake_small.jsonl")
    export_mooncake(lt.table, tmp_path / "m.jsonl")
    recs = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["timestamp"] for r in recs] == [0, 500, 1500, 2500]
    # Same structure as the input up to renaming; partial last blocks get fresh ids.
    assert [len(r["hash_ids"]) for r in recs] == [3, 4, 1, 1]
    assert recs[1]["hash_ids"][:2] == recs[0]["hash_ids"][:2]
    assert recs[2]["hash_ids"] == recs[0]["hash_ids"][:1]
    again = load(tmp_path / "m.jsonl").table.column("prompt_tokens")
    assert again == lt.table.column("prompt_tokens")
    chat = load(FIX / "chat.jsonl")
    export_bailian(chat.table, tmp_path / "b.jsonl")
    b = [json.loads(x) for x in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert [r["parent_chat_id"] for r in b] == [-1, -1, 0, 1, 2, 3]
    assert [r["turn"] for r in b] == [1, 1, 2, 2, 3, 3]
    assert all(len(r["hash_ids"]) == -(-r["input_length"] // 16) for r in b)


def test_token_ratio_and_hash_keys():
    base = load(FIX / "chat.jsonl").table
    scaled = load(FIX / "chat.jsonl", token_ratio=1.25).table
    p0, p1 = base.column("prompt_tokens").to_pylist(), scaled.column("prompt_tokens").to_pylist()
    assert p1 == [int(p * 1.25) for p in p0]
    assert all(scaled.column("approx_lengths").to_pylist())
    assert not any(base.column("approx_lengths").to_pylist())
    assert [len(h) for h in scaled.column("block_hashes").to_pylist()] == [p // 16 for p in p1]
    # the model is in the block key by default; without it the hashes differ
    assert read_metadata(base)["hash_keys"] == "model"
    keyed = load(FIX / "chat.jsonl", hash_keys=()).table
    a = {h for row in base.column("block_hashes").to_pylist() for h in row}
    b = {h for row in keyed.column("block_hashes").to_pylist() for h in row}
    assert not a & b


# -- bad input --------------------------------------------------------------------------


def bad_log(tmp_path: Path) -> Path:
    good = json.loads((FIX / "chat.jsonl").read_text().splitlines()[0])
    rows = [
        json.dumps(good),  # 1 ok
        "{not json",  # 2
        json.dumps({**good, "request": {"model": "m"}}),  # 3 no messages
        json.dumps({**good, "created_at": "yesterday-ish"}),  # 4
        json.dumps({**good, "created_at": -5}),  # 5
        json.dumps({**good, "response": {"usage": {"completion_tokens": "many"}}}),  # 6
        "",  # 7 blank: ignored
        json.dumps({**good, "created_at": good["created_at"] - 30}),  # 8 ok, out of order
        json.dumps({**good, "request": {"messages": [{"role": "user", "content": 3}]}}),  # 9
    ]
    data = "\n".join(rows).encode() + b"\n" + b'{"created_at": 1, "x": "\xff\xfe"}\n'  # 10
    p = tmp_path / "bad.jsonl"
    p.write_bytes(data)
    return p


def test_bad_rows_are_skipped_and_counted(tmp_path):
    p = bad_log(tmp_path)
    lt = open_trace([p], OPTS)
    assert lt.table.num_rows == 2
    assert lt.reordered == 1
    assert lt.skipped.total == 7
    assert lt.skipped.by_reason == {
        "malformed JSON": 1,
        "missing field": 1,
        "bad timestamp": 1,
        "negative timestamp": 1,
        "mistyped field": 2,
        "not UTF-8": 1,
    }
    assert lt.skipped.examples[:3] == [
        f"{p}:2: malformed JSON",
        f"{p}:3: missing field (field 'messages')",
        f"{p}:4: bad timestamp (field 'created_at')",
    ]
    assert "skipped 7 rows" in str(lt.skipped)


def test_strict_stops_at_the_first_bad_row(tmp_path):
    p = bad_log(tmp_path)
    with pytest.raises(InputError) as e:
        open_trace([p], IngestOptions(salt=SALT, strict=True))
    assert str(e.value) == f"{p}:2: malformed JSON"
    body_only = tmp_path / "b.jsonl"
    body_only.write_text(p.read_text(errors="replace").splitlines()[2] + "\n")
    with pytest.raises(InputError, match=r"b\.jsonl:1 \(field 'messages'\): missing field"):
        open_trace([body_only], IngestOptions(salt=SALT, strict=True))


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match=r"empty\.jsonl: file is empty"):
        open_trace([empty], OPTS)
    with pytest.raises(InputError, match="file not found"):
        open_trace([tmp_path / "nope.jsonl"], OPTS)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    with pytest.raises(InputError, match="only blank lines"):
        open_trace([blank], OPTS)
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"a": 1}\n')
    with pytest.raises(InputError, match="no prompt column"):
        open_trace([junk], OPTS)


def test_truncated_gzip_is_an_error(tmp_path):
    rnd = random.Random(0)
    rows = [json.loads(x) for x in (FIX / "chat.jsonl").read_text().splitlines()] * 60
    # Random padding keeps the compressors from collapsing the repeats.
    raw = "".join(
        json.dumps({**r, "pad": f"{rnd.getrandbits(4096):01024x}"}) + "\n" for r in rows
    ).encode()
    z = gzip.compress(raw)
    p = tmp_path / "cut.jsonl.gz"
    p.write_bytes(z[: len(z) * 2 // 3])
    # An error, not "1 row skipped": the rows after the cut (a third here) are lost.
    for opts in (OPTS, IngestOptions(salt=SALT, strict=True)):
        with pytest.raises(InputError, match=r"truncated compressed file.*lines before it"):
            open_trace([p], opts)
    zs = zstandard.ZstdCompressor().compress(raw)
    q = tmp_path / "cut.jsonl.zst"
    q.write_bytes(zs[: len(zs) // 2])
    with pytest.raises(InputError, match="truncated compressed file"):
        open_trace([q], OPTS)


def test_bad_csv_rows(tmp_path):
    p = tmp_path / "az.csv"
    p.write_bytes(
        b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
        b"2023-11-16 18:15:46.6805900,374,44\n"
        b"2023-11-16 18:15:47.0,abc,44\n"
        b"2023-11-16 18:15:48.0,12\n"
        b"not a time,5,5\n"
        b"2023-11-16 18:15:49.0,-3,1\n"
    )
    lt = open_trace([p], OPTS)
    assert lt.table.num_rows == 1
    assert lt.skipped.by_reason == {
        "mistyped field": 1,
        "row has 2 columns, header has 3": 1,
        "bad timestamp": 1,
        "negative value": 1,
    }
    assert lt.skipped.examples[0] == f"{p}:3: mistyped field (field 'ContextTokens')"


def test_empty_prompt_cells_and_missing_times_name_their_columns(tmp_path):
    p = tmp_path / "gen.csv"
    p.write_text("prompt,ts\nhello,1700000000\n,1700000001\nthere,\nagain,1700000003\n")
    lt = load(p)
    assert lt.table.num_rows == 2
    assert lt.skipped.examples == [
        f"{p}:3: missing field (field 'prompt')",
        f"{p}:4: missing timestamp (field 'ts')",
    ]


def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path):
    lines = (FIX / "chat.jsonl").read_bytes()
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + lines)
    q = tmp_path / "bom.jsonl.gz"
    q.write_bytes(gzip.compress(b"\xef\xbb\xbf" + lines))
    want = load(FIX / "chat.jsonl").table.column("block_hashes")
    for f in (p, q):
        assert detect_format(f) == "openai"
        lt = load(f)
        assert lt.skipped.total == 0 and lt.table.column("block_hashes") == want


def test_a_log_that_switched_from_seconds_to_milliseconds(tmp_path):
    p = tmp_path / "mixed.jsonl"
    t0 = 1_700_000_000
    rows = [{"timestamp": t0 + i, "prompt": f"p{i}"} for i in range(6)]
    rows += [{"timestamp": (t0 + 6 + i) * 1000, "prompt": f"q{i}"} for i in range(4)]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    lt = load(p)
    assert lt.table.column("arrival_s").to_pylist() == [float(i) for i in range(10)]
    assert read_metadata(lt.table)["t0_epoch_s"] == repr(float(t0))
    assert lt.mixed_unit_files == [
        f"{p}: timestamps in s (6) and ms (4), each read in its own unit"
    ]
    # --time-unit still decides for the whole file; relative times are never split by band.
    assert load(p, time_unit="ms").mixed_unit_files == []
    q = tmp_path / "relative.jsonl"
    q.write_text("\n".join(json.dumps({"ts": v, "prompt": "x"}) for v in (0, 5, 2e11)) + "\n")
    assert load(q).mixed_unit_files == []
    assert load(q).table.column("arrival_s").to_pylist() == [0.0, 0.005, 2e8]


def test_unterminated_csv_quote_skips_one_row_and_reads_on(tmp_path):
    p = tmp_path / "gw.csv"
    # Pretty-printed JSON: every good row is a quoted field over several lines.
    body = json.dumps({"messages": [{"role": "user", "content": "hello"}]}, indent=1)
    good = '"{}",{}\n'
    rows = ["request_json,timestamp\n"]
    rows += [good.format(body.replace('"', '""'), 1700000000 + i) for i in range(3)]
    rows.append('"{""messages"": [,1700000003\n')  # the quote is never closed
    rows += [good.format(body.replace('"', '""'), 1700000004 + i) for i in range(4)]
    p.write_text("".join(rows))
    lt = open_trace([p], IngestOptions(salt=SALT, fmt="gateway-csv"))
    bad_line = "".join(rows[:4]).count("\n") + 1
    assert bad_line > 5  # the rows before it did span lines
    assert lt.table.num_rows == 7  # three rows before it, four after
    assert lt.skipped.by_reason == {"unterminated quote": 1}
    assert lt.skipped.examples == [f"{p}:{bad_line}: unterminated quote"]
    with pytest.raises(InputError, match=rf"gw.csv:{bad_line}: unterminated quote"):
        open_trace([p], IngestOptions(salt=SALT, fmt="gateway-csv", strict=True))
    # An unterminated quote on the last row swallows nothing and is still counted.
    q = tmp_path / "last.csv"
    q.write_text("".join([*rows[:4], '"{""messages""\n']))
    lt = open_trace([q], IngestOptions(salt=SALT, fmt="gateway-csv"))
    assert lt.table.num_rows == 3 and lt.skipped.total == 1


# -- CLI ---------------------------------------------------------------------------------


def test_convert_command(tmp_path):
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def _noop() -> None:  # a second command keeps typer in multi-command mode
        pass

    salt = tmp_path / "salt"
    out = tmp_path / "t.parquet"
    r = CliRunner().invoke(
        app,
        [
            "convert",
            str(bad_log(tmp_path)),
            "-o",
            str(out),
            "--salt-file",
            str(salt),
            "--keep-previews",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "requests: 2" in r.output and "skipped 7 rows" in r.output
    assert ":2: malformed JSON" in r.output and "out-of-order rows: 1" in r.output
    assert salt.exists() and previews_path(out).exists()
    assert BlockTrace.from_parquet(out).n_requests == 2
    m = tmp_path / "m.jsonl"
    r = CliRunner().invoke(app, ["convert", str(out), "-o", str(m), "--to", "mooncake"])
    assert r.exit_code == 0, r.output
    assert len(m.read_text().splitlines()) == 2
    r = CliRunner().invoke(app, ["convert", str(out), "-o", str(m), "--to", "excel"])
    assert r.exit_code == 2 and "'--to'" in r.output and "mooncake" in r.output


# -- the real public traces --------------------------------------------------------------


def test_mooncake_conversation_golden_ceiling(shared_traces):
    path = shared_traces / "mooncake" / "conversation_trace.jsonl"
    # Independent loop over the raw JSON: steady state (warm-up 0.5), token-weighted,
    # full 512-token blocks only, a block hits when its id was seen in an earlier request.
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    seen: set[int] = set()
    hit = total = 0
    for i, r in enumerate(rows):
        ids = r["hash_ids"][: r["input_length"] // 512]
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        if i >= len(rows) // 2:
            hit += 512 * k
            total += r["input_length"]
        seen.update(ids)
    assert round(100 * hit / total, 2) == 39.78
    t = open_trace([path], OPTS).trace
    assert t.n_requests == 12031 and t.block_size == 512
    seen2: set[int] = set()
    hit2 = total2 = 0
    for i in range(t.n_requests):
        b = t.blocks_of(i).tolist()
        k = 0
        while k < len(b) and b[k] in seen2:
            k += 1
        if i >= t.n_requests // 2:
            hit2 += 512 * k
            total2 += int(t.prompt_tokens[i])
        seen2.update(b)
    assert (hit2, total2) == (hit, total)


def test_ragpulse_real_trace(shared_traces):
    lt = open_trace([shared_traces / "ragpulse" / "0_trace.jsonl"], OPTS)
    t = lt.table
    assert t.num_rows == 7106 and lt.skipped.total == 0
    assert lt.reordered == 1  # the README's one out-of-order pair
    prompt = np.asarray(t.column("prompt_tokens"))
    lcp = np.asarray(t.column("token_lcp_prev"))
    # README: strict prefix reuse with a radix tree over the assumed order, 31.5% of tokens.
    assert lcp.sum() / prompt.sum() == pytest.approx(0.315, abs=0.01)


def test_azure_real_traces(shared_traces):
    d = shared_traces / "azure_llm_2023"
    lt = open_trace(
        [d / "AzureLLMInferenceTrace_code.csv", d / "AzureLLMInferenceTrace_conv.csv"], OPTS
    )
    assert lt.table.num_rows == 8819 + 19366 and lt.skipped.total == 0
    assert lt.trace.count_only
    assert lt.trace.arrival_s[-1] == pytest.approx(3540, abs=60)  # about 58 minutes
    assert read_metadata(lt.table)["t0_epoch_s"].startswith("17001")


def test_gateway_and_generic_parquet_and_jsonl(tmp_path):
    import csv

    import pyarrow as pa

    with open(FIX / "chat_gateway.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    gw = tmp_path / "gw.parquet"
    pq.write_table(pa.Table.from_pylist(rows), gw)
    assert detect_format(gw) == "gateway-parquet"
    a = load(gw).table.column("block_hashes")
    assert a == load(FIX / "chat_gateway.csv").table.column("block_hashes")
    gen_rows = [{"q": "hello there, general kenobi", "ts": 1_700_000_000 + i} for i in range(3)]
    gp = tmp_path / "gen.parquet"
    pq.write_table(pa.Table.from_pylist(gen_rows), gp)
    assert detect_format(gp) == "generic-parquet"
    t = load(gp, prompt_column="q", time_column="ts").table
    assert t.column("token_lcp_prev").to_pylist()[1:] == [t.column("prompt_tokens")[0].as_py()] * 2
    gj = tmp_path / "gen.jsonl"
    gj.write_text("\n".join(json.dumps(r) for r in gen_rows) + "\n")
    assert detect_format(gj) == "generic-jsonl"
    assert load(gj, prompt_column="q").table.column("block_hashes") == t.column("block_hashes")


def test_format_override_and_bad_options():
    with pytest.raises(UsageError, match="unknown format"):
        load(FIX / "chat.jsonl", fmt="excel")
    with pytest.raises(UsageError, match="unknown template"):
        load(FIX / "chat.jsonl", template="vicuna")
    with pytest.raises(UsageError, match="hash key"):
        load(FIX / "chat.jsonl", hash_keys=("colour",))
    with pytest.raises(UsageError, match="token-ratio"):
        load(FIX / "chat.jsonl", token_ratio=0)
    # Forcing a format reads a file the detector would call something else.
    t = load(FIX / "chat_batch.jsonl", fmt="openai").table
    assert t.num_rows == 6


def test_gateway_and_generic_name_the_family_and_typos_get_a_suggestion(tmp_path):
    """The README's `--format gateway` / `generic` pick the file's own container."""
    csv_rows = load(FIX / "chat_gateway.csv", fmt="gateway").table
    assert csv_rows.num_rows == load(FIX / "chat_gateway.csv").table.num_rows
    assert read_metadata(csv_rows)["source"] == "gateway-csv"
    generic = load(FIX / "generic.csv", fmt="generic", prompt_column="prompt", time_column="time")
    assert read_metadata(generic.table)["source"] == "generic-csv"
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text('{"prompt": "hello there", "time": 1700000000}\n')
    assert read_metadata(load(jsonl, fmt="generic").table)["source"] == "generic-jsonl"
    with pytest.raises(UsageError, match=r"unknown format 'gatway' \(did you mean 'gateway'\?\)"):
        load(FIX / "chat.jsonl", fmt="gatway")
    runner = CliRunner()
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # a second command keeps typer in multi-command mode
    r = runner.invoke(app, ["convert", str(FIX / "chat.jsonl"), "--format", "opnai", "-o", "x"])
    flat = "".join(c for c in r.output if c.isalnum() or c == "'")  # the error box wraps
    assert r.exit_code == 2 and "didyoumean'openai'" in flat


def test_a_count_only_table_points_to_the_count_only_formats(tmp_path):
    log = tmp_path / "counts.csv"
    log.write_text("timestamp,input_tokens,output_tokens\n1700000000,100,20\n")
    with pytest.raises(InputError) as err:
        load(log)
    msg = str(err.value)
    assert "token counts (input_tokens, output_tokens)" in msg
    assert "--format azure" in msg and "--format burstgpt" in msg


@pytest.mark.slow
def test_templates_and_tenant_keys_change_hashes_not_structure():
    chatml = load(FIX / "chat.jsonl").table
    llama = load(FIX / "chat.jsonl", template="llama3").table
    assert read_metadata(llama)["template"] == "llama3"
    a = {h for r in chatml.column("block_hashes").to_pylist() for h in r}
    b = {h for r in llama.column("block_hashes").to_pylist() for h in r}
    assert not a & b
    lcp = llama.column("token_lcp_prev").to_pylist()
    prompts = llama.column("prompt_tokens").to_pylist()
    assert lcp[2] == prompts[0] and lcp[4] == prompts[2]
    keyed = load(FIX / "chat.jsonl", hash_keys=("tenant",)).table
    assert read_metadata(keyed)["hash_keys"] == "tenant"
    h = keyed.column("block_hashes").to_pylist()
    assert h[1][0] == h[0][0]  # one tenant (the model): the system prompt is still shared


def test_canonical_input_at_a_coarser_block_size(tmp_path):
    lt = load(FIX / "chat.jsonl")
    out = tmp_path / "t.parquet"
    write_canonical(lt.table, out)
    coarse = open_trace([out], IngestOptions(salt=SALT, block_size=64))
    assert coarse.trace.block_size == 64
    assert read_metadata(coarse.table)["block_size"] == "64"
    expect = lt.trace.coarsen(4)
    assert np.array_equal(coarse.trace.block_ids, expect.block_ids)
    assert np.array_equal(coarse.trace.offsets, expect.offsets)
    with pytest.raises(UsageError, match="not a multiple"):
        open_trace([out], IngestOptions(salt=SALT, block_size=24))


@pytest.mark.slow
def test_output_is_independent_of_the_process(tmp_path):
    import os
    import subprocess
    import sys

    code = (
        "import sys; from analyzer.ingest import IngestOptions, open_trace; "
        "from analyzer.trace import write_canonical; "
        "lt = open_trace(sys.argv[1:2], IngestOptions(salt=b'fixed test salt')); "
        "write_canonical(lt.table, sys.argv[2])"
    )
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / f"{seed}.parquet"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run(
            [sys.executable, "-c", code, str(FIX / "chat.jsonl"), str(out)], check=True, env=env
        )
        outs.append(out.read_bytes())
    write_canonical(load(FIX / "chat.jsonl").table, tmp_path / "here.parquet")
    assert outs[0] == outs[1] == (tmp_path / "here.parquet").read_bytes()


@pytest.mark.slow
def test_end_to_end_block_sharing_matches_token_sharing(tmp_path):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from analyzer.tokenize import PromptRenderer, load_tokenizer

    renderer = PromptRenderer(load_tokenizer("cl100k"), memo=False)
    words = st.lists(st.sampled_from(["alpha", "beta", "gamma", " ", "\n", "42", "é"]), max_size=40)
    convo = st.lists(words.map("".join), min_size=1, max_size=4)

    @settings(
        max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(convo, convo, st.integers(0, 3))
    def check(a, b, shared):
        msgs_a = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(a)
        ]
        msgs_b = msgs_a[:shared] + [
            {"role": "user" if (shared + i) % 2 == 0 else "assistant", "content": t}
            for i, t in enumerate(b)
        ]
        log = tmp_path / "h.jsonl"
        log.write_text(
            "".join(
                json.dumps({"timestamp": 1_700_000_000 + i, "messages": m}) + "\n"
                for i, m in enumerate((msgs_a, msgs_b))
            )
        )
        t = open_trace([log], IngestOptions(salt=SALT, block_size=4)).table
        ha, hb = t.column("block_hashes").to_pylist()
        ta, tb = (
            np.concatenate(
                [p.tokens for ps in renderer.render({"messages": m}) for p in ps]
            ).tolist()
            for m in (msgs_a, msgs_b)
        )
        assert len(ha) == len(ta) // 4 and len(hb) == len(tb) // 4
        for k in range(1, min(len(ha), len(hb)) + 1):
            assert (ha[:k] == hb[:k]) == (ta[: 4 * k] == tb[: 4 * k])
        lcp = next(
            (i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y),
            min(len(ta), len(tb)),
        )
        assert t.column("token_lcp_prev").to_pylist() == [0, lcp]

    check()


def test_named_time_field_and_deep_json(tmp_path):
    p = tmp_path / "t.jsonl"
    rows = [
        {"meta": {"t": 1_700_000_000_000}, "messages": [{"role": "user", "content": "a"}]},
        {"messages": [{"role": "user", "content": "b"}]},
        {"meta": {"t": 1_700_000_002_500}, "messages": [{"role": "user", "content": "c"}]},
    ]
    deep = "[" * 100_000 + "]" * 100_000
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n" + deep + "\n")
    lt = open_trace([p], IngestOptions(salt=SALT, time_field="meta.t"))
    assert lt.table.column("arrival_s").to_pylist() == [0.0, 2.5]  # ms by magnitude
    assert lt.skipped.examples[0] == f"{p}:2: missing timestamp (field 'meta.t')"
    assert lt.skipped.by_reason["JSON nested too deeply"] == 1


def test_absolute_and_relative_times_do_not_merge():
    with pytest.raises(InputError) as e:
        load(FIX / "chat.jsonl", FIX / "mooncake_small.jsonl", block_size=512)
    msg = str(e.value)
    assert "chat.jsonl (absolute)" in msg and "mooncake_small.jsonl (relative)" in msg


def test_parquet_timestamp_columns(tmp_path):
    import datetime as dt

    import pyarrow as pa

    t0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    for unit, tz in (("us", "UTC"), ("ns", None), ("ms", "Europe/Paris")):
        times = [t0, t0 + dt.timedelta(seconds=2.5)]
        if tz is None:
            times = [t.replace(tzinfo=None) for t in times]  # zone-less: UTC
        p = tmp_path / f"ts_{unit}.parquet"
        col = pa.array(times, pa.timestamp(unit, tz=tz))
        pq.write_table(pa.table({"timestamp": col, "prompt": ["hello", "world"]}), p)
        lt = load(p)
        assert lt.skipped.total == 0
        assert lt.table.column("arrival_s").to_pylist() == [0.0, 2.5]
        assert read_metadata(lt.table)["t0_epoch_s"] == repr(t0.timestamp())


def test_out_of_range_numbers_are_counted_skips(tmp_path):
    az = tmp_path / "az.csv"
    az.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46,inf,10\n"
        f"2023-11-16 18:15:47,100,{10**30}\n"
        "2023-11-16 18:15:48,100,1\n"
    )
    lt = load(az)
    assert lt.table.num_rows == 1
    assert lt.skipped.by_reason == {"mistyped field": 1, "value out of 64-bit range": 1}
    mc = tmp_path / "mc.jsonl"
    rows = [
        {"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [2**64, 1]},
        {"timestamp": 2, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]},
    ]
    mc.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    lt = load(mc)
    assert lt.table.num_rows == 1
    assert lt.skipped.examples == [f"{mc}:1: hash id out of 64-bit range (field 'hash_ids')"]


def test_deeply_nested_first_line_is_not_detected_as_json(tmp_path):
    p = tmp_path / "deep.jsonl"
    p.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(InputError, match="first lines are not valid JSON"):
        detect_format(p)


def test_mistyped_messages_or_prompt_is_not_called_missing(tmp_path):
    p = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 1, "messages": [{"role": "user", "content": "ok"}]},
        {"timestamp": 2, "messages": "hi"},
        {"timestamp": 3, "prompt": 5},
        {"timestamp": 4, "model": "m"},
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    lt = load(p)
    assert lt.skipped.examples == [
        f"{p}:2: mistyped field (field 'messages')",
        f"{p}:3: mistyped field (field 'prompt')",
        f"{p}:4: missing field (field 'messages')",
    ]


def test_corrupt_parquet_row_group_is_skipped_and_counted(tmp_path):
    import pyarrow as pa

    rows = [{"timestamp": 1_700_000_000 + i, "prompt": f"hello {i} " * 20} for i in range(30)]
    good = tmp_path / "g.parquet"
    pq.write_table(pa.Table.from_pylist(rows), good, row_group_size=10)
    meta = pq.ParquetFile(good).metadata
    data = bytearray(good.read_bytes())
    for c in range(meta.num_columns):  # break every page header of row group 1
        at = meta.row_group(1).column(c).data_page_offset
        data[at : at + 64] = b"\xff" * 64
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(data))
    lt = load(bad)
    assert lt.table.num_rows == 20
    assert lt.skipped.by_reason == {"corrupt Parquet data": 10}
    assert lt.skipped.examples[0] == f"{bad}:11: corrupt Parquet data"
    assert lt.table.column("block_hashes") == load(good).table.column("block_hashes").take(
        list(range(10)) + list(range(20, 30))
    )


def test_a_skipped_first_row_does_not_make_the_file_untimed(tmp_path):
    p = tmp_path / "t.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": 5}]},  # no time, and skipped
        {"timestamp": 1_700_000_000, "messages": [{"role": "user", "content": "a"}]},
        {"timestamp": 1_700_000_010, "messages": [{"role": "user", "content": "b"}]},
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    lt = load(p)
    assert lt.untimed_files == []
    assert lt.table.column("arrival_s").to_pylist() == [0.0, 10.0]
    assert lt.skipped.examples == [f"{p}:1: mistyped field (field 'messages[0].content')"]

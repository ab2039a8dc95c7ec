"""--ray: the inputs read on a real Ray instance (started here, 2 CPUs) give the
one-process output, and the partitioned dataset it writes reads back as the same trace."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest

from analyzer.errors import InputError, OutputError, UsageError
from analyzer.ingest import IngestOptions, open_trace
from analyzer.ingest.cluster import NOTE, import_ray
from analyzer.ingest.convert import convert_trace
from analyzer.trace import dataset_files, read_canonical
from tests.helpers.ingest import FIX, SALT, chat_log, same


@pytest.fixture(scope="module")
def ray_up():
    ray = import_ray()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _one(paths, **kw):
    return open_trace([str(p) for p in paths], IngestOptions(salt=SALT, jobs=1, **kw))


@pytest.mark.slow
def test_ray_reads_split_logs_whole_files_and_stateful_ones_as_one_process(ray_up, tmp_path):
    log = chat_log(tmp_path / "chat.jsonl", 150, seed=1)
    paths = [log, FIX / "chat_gateway.csv", FIX / "chat.jsonl"]
    one = _one(paths, exact=False)
    on_ray = open_trace([str(p) for p in paths], IngestOptions(salt=SALT, ray_address="local"))
    # Token ids never leave a worker, so the token-exact LCP is not computed (and said so).
    assert on_ray.notes == [NOTE]
    same(one, replace(on_ray, notes=[]))
    assert one.skipped.total > 0 and one.reordered > 0
    assert on_ray.table.column("token_lcp_prev").null_count == on_ray.table.num_rows
    # RAGPulse carries state from row to row: read by the driver, in its place.
    rag = [FIX / "ragpulse" / "0_trace.jsonl"]
    on_ray = open_trace([str(p) for p in rag], IngestOptions(salt=SALT, ray_address="local"))
    same(_one(rag, exact=False), replace(on_ray, notes=[]))


@pytest.mark.slow
def test_convert_on_ray_writes_time_windows_that_read_back_as_the_trace(ray_up, tmp_path):
    from typer.testing import CliRunner

    from analyzer.cli import app

    log = chat_log(tmp_path / "chat.jsonl", 150, seed=4)
    salt = tmp_path / "salt"
    out = tmp_path / "trace"
    args = ["convert", str(log), "--salt-file", str(salt), "--window-s", "40", "-o", str(out)]
    res = CliRunner().invoke(app, [*args, "--ray", "local"])
    assert res.exit_code == 0, res.output
    assert "skipped" in res.output and "chat.jsonl:" in res.output
    files = dataset_files(out)
    names = [f.parent.name for f in files]
    assert len(files) >= 3 and names == sorted(names)
    assert names[:2] == ["window_start_s=0000000000", "window_start_s=0000000040"]
    for f in files:  # each window holds only its own rows
        start = int(f.parent.name.split("=")[1])
        t = read_canonical(f).column("arrival_s").to_numpy()
        assert (t >= start).all() and (t < start + 40).all()
    single = tmp_path / "one.parquet"
    one_args = ["convert", str(log), "--salt-file", str(salt), "--no-exact", "-j", "1"]
    res = CliRunner().invoke(app, [*one_args, "-o", str(single)])
    assert res.exit_code == 0, res.output
    want = read_canonical(single)
    assert read_canonical(out).equals(want)
    assert read_canonical(out).schema.metadata == want.schema.metadata
    # The later stages take the folder as input.
    assert open_trace([str(out)]).table.equals(want)
    rj = CliRunner().invoke(app, ["reuse", str(out), "--json", "-", "--warmup", "0"])
    sj = CliRunner().invoke(app, ["reuse", str(single), "--json", "-", "--warmup", "0"])
    assert rj.exit_code == 0 and rj.stdout == sj.stdout
    # Written again over itself (an earlier dataset is replaced whole), not over an input.
    again = CliRunner().invoke(app, [*one_args, "--window-s", "40", "-o", str(out)])
    assert again.exit_code == 0, again.output
    assert read_canonical(out).equals(want)
    onto_input = CliRunner().invoke(app, ["convert", str(out), "--window-s", "40", "-o", str(out)])
    assert isinstance(onto_input.exception, OutputError)
    assert "holds an input of this run" in str(onto_input.exception)


@pytest.mark.slow
def test_a_bad_row_under_strict_is_reported_as_in_one_process(ray_up, tmp_path):
    log = chat_log(tmp_path / "chat.jsonl", 120, seed=5, bad=False)
    lines = log.read_text().splitlines()
    lines[90] = '{"id": "x", "timestamp": 1700000090, "request": {"messages": 7}}'
    log.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as local:
        _one([log], strict=True)
    with pytest.raises(InputError) as on_ray:
        open_trace([str(log)], IngestOptions(salt=SALT, strict=True, ray_address="local"))
    assert str(on_ray.value) == str(local.value)
    assert ":91" in str(local.value)


def test_without_ray_installed_the_flag_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(UsageError) as err:
        import_ray()
    assert str(err.value) == (
        "--ray needs Ray, which is not installed: pip install 'kvpool-advisor[ray]'"
    )


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["convert", "a.jsonl", "--ray"], ["convert", "a.jsonl", "--ray", "local"]),
        (["convert", "--ray", "a.jsonl"], ["convert", "--ray", "local", "a.jsonl"]),
        (["reuse", "--ray", "-o", "x"], ["reuse", "--ray", "local", "-o", "x"]),
        (["reuse", "--ray", "auto", "a"], ["reuse", "--ray", "auto", "a"]),
        (["x", "--ray", "ray://head:10001"], ["x", "--ray", "ray://head:10001"]),
        (["x", "--ray", "10.0.0.5:6379"], ["x", "--ray", "10.0.0.5:6379"]),
        (["x", "--", "--ray"], ["x", "--", "--ray"]),
    ],
)
def test_ray_alone_means_a_local_instance(argv, want):
    from analyzer.cli.options import bare_ray

    assert bare_ray(argv) == want


def test_a_folder_that_is_not_a_dataset_is_named(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("x")
    with pytest.raises(InputError, match="not a file"):
        open_trace([str(tmp_path / "d")])
    from analyzer.outputs import check_dataset_output

    with pytest.raises(OutputError, match="other files"):
        check_dataset_output(tmp_path / "d")
    with pytest.raises(OutputError, match="is a file"):
        check_dataset_output(tmp_path / "d" / "notes.txt")
    with pytest.raises(UsageError, match="window-s"):
        convert_trace([str(FIX / "chat.jsonl")], tmp_path / "o", window_s=0)


def test_dataset_windows_from_two_conversions_are_refused(tmp_path):
    import shutil

    a, b = tmp_path / "a", tmp_path / "b"
    opts = IngestOptions(salt=SALT)
    convert_trace([str(FIX / "chat.jsonl")], a, opts, window_s=3600)
    convert_trace([str(FIX / "chat.jsonl")], b, IngestOptions(salt=b"other salt"), window_s=3600)
    src = dataset_files(b)[0]
    dest = a / "window_start_s=9999999999"
    dest.mkdir()
    shutil.copy(src, dest / "part-0.parquet")
    with pytest.raises(InputError, match="metadata differs") as err:
        read_canonical(a)
    assert "window_start_s=9999999999" in str(err.value) and "salt_id" in str(err.value)


def test_plan_caps_a_piece_size(tmp_path):
    from analyzer.ingest.parallel import plan

    log = chat_log(tmp_path / "chat.jsonl", 100, seed=6)
    size = log.stat().st_size
    pieces = plan([str(log)], ["openai"], 2, piece_bytes=size // 5)
    assert len(pieces) >= 5
    assert all(p.span is not None and p.span.end - p.span.start <= size // 5 + 2000 for p in pieces)


def test_what_a_ray_worker_sends_back_holds_no_prompt_text(tmp_path):
    """The actor's reply (the bytes that cross the network) carries hashes, counts and
    pseudonyms: not the prompt, the user name or the request id (called in-process)."""
    import json

    import pyarrow as pa

    from analyzer.ingest.cluster import PieceReader, decode_result
    from analyzer.ingest.parallel import plan

    log = tmp_path / "chat.jsonl"
    rows = [
        {
            "id": f"req-zebracorn-{i}",
            "timestamp": 1_700_000_000 + i,
            "request": {
                "user": "alice@zebracorn.example",
                "messages": [{"role": "user", "content": f"zebracorn secret plan {i} " * 20}],
            },
        }
        for i in range(20)
    ]
    log.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    piece = plan([str(log)], ["openai"], 1)[0]
    reader = PieceReader([str(log)], ["openai"], IngestOptions(salt=SALT), str(tmp_path), [piece])
    out = reader(pa.table({"piece": [0]}))
    res = decode_result(out.column("result")[0].as_py())
    sent = out.column("result")[0].as_py() + out.column("rows")[0].as_py()
    # the base64 fields decoded too: nothing hides in them
    sent += res.iso + res.lines + res.spool.time + res.spool.prompt_tokens + res.spool.lcp_index
    assert b"zebracorn" not in sent and b"alice" not in sent
    assert res.skipped.total == 1 and len(res.iso) == 20


def test_an_address_where_nothing_listens_fails_at_once():
    import socket

    from analyzer.ingest.cluster import _check_reachable

    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(UsageError, match="nothing answers"):
            _check_reachable(address)


def test_a_piece_result_crosses_the_network_as_json_and_comes_back_equal():
    """No pickle between the driver and the actors: results are JSON, rebuilt field by field."""
    from analyzer.errors import InputError
    from analyzer.ingest.cluster import decode_result, encode_result
    from analyzer.ingest.options import SkipSummary
    from analyzer.ingest.parallel import PieceFailed, PieceResult
    from analyzer.ingest.spool import SpoolFile

    skipped = SkipSummary()
    skipped.add("mistyped field", "a.jsonl", 3, "messages")
    res = PieceResult(
        spool=SpoolFile("", (2, 1), b"\x00" * 24, b"\x01" * 24, b"\x02" * 24),
        iso=b"\x01\x00\x01",
        lines=b"\x07" * 24,
        id_hashes=b"\x05" * 16,
        lcp_dir="",
        skipped=skipped,
        previews={2**63 + 5: ("system", "You are"), 7: ("user", "hi")},
        stats=(3, 2, 40, 5),
        timed=True,
    )
    blob = encode_result(res)
    json.loads(blob)  # plain JSON, no pickle
    assert decode_result(blob) == res
    failed = PieceFailed(InputError, "a.jsonl:3 (field 'messages'): mistyped field", None)
    assert decode_result(encode_result(failed)) == failed

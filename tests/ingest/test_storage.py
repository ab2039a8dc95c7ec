"""Object storage as inputs and outputs, against a real S3-compatible server.

The server is moto's (``moto[server]``, in the test extra), started here on 127.0.0.1
on a free port; kvpool runs as a user runs it, in its own process, finding the server
through ``AWS_ENDPOINT_URL`` and its credentials in the environment, as the AWS SDK's
default chain does. What it reads from ``s3://`` gives the same figures as the same
bytes read from a file; what it writes there is whole or absent; errors are one line
naming the URL without credentials.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

moto_server = pytest.importorskip("moto.server", reason="moto[server] (the test extra)")
boto3 = pytest.importorskip("boto3", reason="boto3 (moto[server] brings it)")

KVPOOL = [sys.executable, "-m", "analyzer.cli"]
ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "traces" / "chat.jsonl.zst"
BUCKET = "team-logs"
SECRET = "kvpoolSECRETdoNotPrint"


@pytest.fixture(scope="module")
def s3() -> dict[str, str]:
    """A local S3 server with one bucket; the environment a kvpool process needs."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "KVPOOL_NO_PROGRESS": "1",
    }
    client = boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id="testing",
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key="logs/chat.jsonl.zst", Body=SAMPLE.read_bytes())
    yield env
    server.stop()


@pytest.fixture(scope="module")
def s3_client(s3):  # type: ignore[no-untyped-def]
    return boto3.client(
        "s3",
        endpoint_url=s3["AWS_ENDPOINT_URL"],
        aws_access_key_id="testing",
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KVPOOL, "-q", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _keys(client, prefix: str = "") -> list[str]:  # type: ignore[no-untyped-def]
    """The objects under ``prefix`` (not the empty folder markers pyarrow keeps)."""
    got = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"] for o in got if not o["Key"].endswith("/"))


def _get(client, key: str) -> bytes:  # type: ignore[no-untyped-def]
    return bytes(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())


@pytest.mark.slow
def test_reuse_reads_s3_like_the_file(s3, tmp_path):
    args = ["reuse", "--json", "-", "-j", "1", "--warmup", "0.2"]
    local = _run([*args, str(SAMPLE)], tmp_path, s3)
    remote = _run([*args, f"s3://{BUCKET}/logs/chat.jsonl.zst"], tmp_path, s3)
    assert local.returncode == 0, local.stderr
    assert remote.returncode == 0, remote.stderr
    assert json.loads(remote.stdout) == json.loads(local.stdout)


@pytest.mark.slow
def test_convert_to_s3_then_reuse_the_canonical_object(s3, s3_client, tmp_path):
    out = f"s3://{BUCKET}/canonical/chat.parquet"
    r = _run(["convert", f"s3://{BUCKET}/logs/chat.jsonl.zst", "-o", out, "-j", "1"], tmp_path, s3)
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stderr
    # whole, and nothing else left beside it (no temporary key)
    assert _keys(s3_client, "canonical/") == ["canonical/chat.parquet"]
    assert _get(s3_client, "canonical/chat.parquet")[:4] == b"PAR1"
    local = _run(["convert", str(SAMPLE), "-o", "chat.parquet", "-j", "1"], tmp_path, s3)
    assert local.returncode == 0, local.stderr
    args = ["reuse", "--json", "-", "--warmup", "0.2"]
    from_local = _run([*args, "chat.parquet"], tmp_path, s3)
    from_s3 = _run([*args, out], tmp_path, s3)
    assert from_s3.returncode == 0, from_s3.stderr
    assert json.loads(from_s3.stdout) == json.loads(from_local.stdout)


@pytest.mark.slow
def test_dataset_prefix_written_and_read(s3, s3_client, tmp_path):
    out = f"s3://{BUCKET}/dataset/chat"
    r = _run(["convert", str(SAMPLE), "-o", out, "--window-s", "600", "-j", "1"], tmp_path, s3)
    assert r.returncode == 0, r.stderr
    keys = _keys(s3_client, "dataset/chat/")
    assert keys and all(k.startswith("dataset/chat/window_start_s=") for k in keys)
    local = _run(["convert", str(SAMPLE), "-o", "ds", "--window-s", "600", "-j", "1"], tmp_path, s3)
    assert local.returncode == 0, local.stderr
    args = ["reuse", "--json", "-", "--warmup", "0.2"]
    from_s3 = _run([*args, out], tmp_path, s3)
    assert from_s3.returncode == 0, from_s3.stderr
    assert json.loads(from_s3.stdout) == json.loads(_run([*args, "ds"], tmp_path, s3).stdout)


@pytest.mark.slow
def test_json_output_to_s3(s3, s3_client, tmp_path):
    r = _run(
        ["reuse", str(SAMPLE), "--json", f"s3://{BUCKET}/out/reuse.json", "-j", "1"], tmp_path, s3
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(_get(s3_client, "out/reuse.json"))
    assert doc["ceiling"]
    assert _keys(s3_client, "out/") == ["out/reuse.json"]


@pytest.mark.slow
def test_analyze_reports_to_a_prefix_and_keep_an_existing_one(s3, s3_client, tmp_path):
    url = f"s3://{BUCKET}/logs/chat.jsonl.zst"
    args = ["analyze", url, "--no-rate-search", "-j", "1"]
    r = _run([*args, "-o", f"s3://{BUCKET}/reports"], tmp_path, s3)
    assert r.returncode == 0, r.stderr
    keys = _keys(s3_client, "reports/")
    assert {"reports/report.json", "reports/report.md", "reports/report.html"} <= set(keys)
    assert not [k for k in _keys(s3_client) if "kvpool-tmp" in k]
    doc = json.loads(_get(s3_client, "reports/report.json"))
    # private by default: neither the bucket nor the key names leave through the report
    text = json.dumps(doc)
    assert BUCKET not in text and "chat.jsonl" not in text
    assert doc["inputs"][0]["name"] == "input-1"
    again = _run([*args, "-o", f"s3://{BUCKET}/reports"], tmp_path, s3)
    assert again.returncode == 0, again.stderr
    assert f"wrote to s3://{BUCKET}/reports-2 instead" in again.stdout + again.stderr
    assert "reports-2/report.json" in " ".join(_keys(s3_client, "reports-2/"))
    named = _run([*args, "--keep-names", "--json", "-", "-o", "local"], tmp_path, s3)
    assert json.loads(named.stdout)["inputs"][0]["name"] == "chat.jsonl.zst"


@pytest.mark.slow
def test_a_failed_run_writes_no_object(s3, s3_client, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"messages": 3}\n')
    r = _run(
        ["convert", str(bad), "--strict", "-o", f"s3://{BUCKET}/failed/t.parquet"], tmp_path, s3
    )
    assert r.returncode == 3, r.stderr
    assert _keys(s3_client, "failed/") == []


@pytest.mark.slow
def test_never_over_an_input(s3, s3_client, tmp_path):
    url = f"s3://{BUCKET}/logs/chat.jsonl.zst"
    before = _get(s3_client, "logs/chat.jsonl.zst")
    r = _run(["convert", url, "-o", url], tmp_path, s3)
    assert r.returncode == 4, r.stderr
    assert "also an input" in r.stderr
    assert _get(s3_client, "logs/chat.jsonl.zst") == before


@pytest.mark.slow
@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("s3://no-such-bucket-here/x.jsonl", "no such bucket"),
        (f"s3://{BUCKET}/logs/missing.jsonl", "no such key"),
    ],
)
def test_missing_objects_are_one_line(s3, tmp_path, url, message):
    r = _run(["reuse", url], tmp_path, s3)
    assert r.returncode == 3
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and message in lines[0] and url in lines[0], r.stderr


def test_credentials_in_a_url_are_never_printed(s3, tmp_path):
    url = f"s3://testing:{SECRET}@{BUCKET}/logs/missing.jsonl"
    r = _run(["reuse", url], tmp_path, s3)
    assert r.returncode == 3
    assert SECRET not in r.stderr + r.stdout
    assert f"s3://{BUCKET}/logs/missing.jsonl" in r.stderr


@pytest.mark.slow
def test_output_to_a_missing_bucket_fails_before_reading(s3, tmp_path):
    r = _run(["convert", str(SAMPLE), "-o", "s3://no-such-bucket-here/t.parquet"], tmp_path, s3)
    assert r.returncode == 4
    assert "no such bucket" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_keep_previews_is_not_sent_to_a_bucket(s3, tmp_path):
    r = _run(
        ["convert", str(SAMPLE), "-o", f"s3://{BUCKET}/p.parquet", "--keep-previews"], tmp_path, s3
    )
    assert r.returncode == 2
    assert "--keep-previews" in r.stderr


@pytest.mark.slow
def test_a_killed_upload_leaves_its_local_copy_only_until_the_next_command(s3, tmp_path):
    """The local copy of an object being written lives in a spill folder: SIGKILLed mid-write
    (an OOM kill), the command leaves nothing in TMPDIR but the private spill root, and
    the next command removes it (docs/security.md)."""
    import signal
    import time

    log = tmp_path / "chat.jsonl"
    r = _run(
        ["synth", "--profile", "chat", "-n", "20000", "--seed", "3", "-o", str(log)], tmp_path, s3
    )
    assert r.returncode == 0, r.stderr
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**s3, "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        [*KVPOOL, "convert", str(log), "--keep-names", "-o", f"s3://{BUCKET}/killed/t.parquet"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    root = tmp / f"kvpool-spill-{os.getuid()}"
    end = time.monotonic() + 120
    while not list(root.glob("*.upload-*")) and proc.poll() is None:
        assert time.monotonic() < end, "no local copy was staged"
        time.sleep(0.01)
    assert proc.poll() is None, "convert finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert list(tmp.iterdir()) == [root]  # nothing outside the private root
    r = _run(["cost", "gpus"], tmp_path, env)
    assert r.returncode == 0, r.stderr
    assert list(tmp.iterdir()) == [], list(tmp.rglob("*"))


@pytest.mark.slow
def test_access_denied_names_the_url(tmp_path):
    """A server that checks signatures (moto with authentication on) refuses unknown
    keys: one line saying access is denied, with where credentials come from."""
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"}
    code = (
        "import sys, time\n"
        "from moto.server import ThreadedMotoServer\n"
        "s = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)\n"
        "s.start(); h, p = s.get_host_and_port(); print(p, flush=True)\n"
        "sys.stdin.read()\n"
    )
    server = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        run_env = {
            **os.environ,
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "AKIAUNKNOWN",
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        r = _run(["reuse", f"s3://{BUCKET}/logs/chat.jsonl.zst"], tmp_path, run_env)
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=30)
    assert r.returncode == 3
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, r.stderr
    assert "access denied" in lines[0] and f"s3://{BUCKET}/logs/chat.jsonl.zst" in lines[0]
    assert SECRET not in r.stderr


def test_public_strips_credentials():
    from analyzer.storage import public

    assert public("s3://AKIA:secret@bucket/k?secret_key=x") == "s3://bucket/k"
    assert public("abfss://cont@acct.dfs.core.windows.net/p") == (
        "abfss://cont@acct.dfs.core.windows.net/p"
    )
    assert public("gs://b/dir/x.jsonl.gz") == "gs://b/dir/x.jsonl.gz"


def test_url_arguments_keep_their_slashes():
    from analyzer.cli.options import path_or_url

    assert path_or_url("s3://b//k") == "s3://b//k"
    assert path_or_url("logs/x.jsonl") == Path("logs/x.jsonl")

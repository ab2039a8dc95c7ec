"""Every number a log, a model config, a price file or a flag gives has a range
(analyzer/limits.py): the review's reproducers of values that slipped through."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.errors import InputError, UsageError


def _chat(i: int, usage: dict | None, text: str = "hello there") -> str:
    rec = {
        "timestamp": 1.7e9 + i,
        "request": {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": text}]},
    }
    if usage is not None:
        rec["response"] = {"usage": usage}
    return json.dumps(rec)


def test_absurd_cached_tokens_are_a_counted_skip_and_never_a_rate_above_one(tmp_path):
    from analyzer.ingest import open_trace
    from analyzer.reuse.measured import measure_cached

    log = tmp_path / "log.jsonl"
    lines = [
        _chat(i, {"prompt_tokens_details": {"cached_tokens": 1_000_000_000}}) for i in range(5)
    ]
    # within range, but more than the prompt holds, and no engine count to check it against
    lines += [_chat(5 + i, {"prompt_tokens_details": {"cached_tokens": 5000}}) for i in range(5)]
    lines += [
        _chat(10 + i, {"prompt_tokens": 20, "prompt_tokens_details": {"cached_tokens": 10}})
        for i in range(10)
    ]
    log.write_text("\n".join(lines) + "\n")
    loaded = open_trace([str(log)])
    assert loaded.skipped.total == 5
    assert any("cached_tokens" in r for r in loaded.skipped.by_reason)
    m = measure_cached(loaded.trace, warmup=0.0)
    assert m is not None
    assert m.excluded_requests == 5 and m.overall.requests == 10
    assert m.overall.hit_rate == pytest.approx(0.5)
    assert m.to_json()["excluded_requests"] == 5


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_key_value_heads", True),
        ("head_dim", 10**12),
        ("head_dim", 1e12),
        ("vocab_size", -5),
        ("vocab_size", 0),
        ("num_key_value_heads", 0),
        ("head_dim", 0),
        ("intermediate_size", "14336"),
        ("num_experts_per_tok", False),
        ("tie_word_embeddings", "yes"),
    ],
)
def test_model_config_numbers_are_whole_in_range_and_never_booleans(tmp_path, field, value):
    from analyzer.cost.catalog import model_from_config_file

    cfg = {
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        field: value,
    }
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(InputError, match=field):
        model_from_config_file(p)


@pytest.mark.parametrize(
    "toml",
    [
        "hours_per_month = inf\n",
        "hours_per_month = 0.5\n",
        "hours_per_month = true\n",
        '[gpus.h100]\nusd_per_gpu_hour = 1e308\nsource = "x"\n',
        '[dram]\nusd_per_gb_month = nan\nsource = "x"\n',
        '[nic]\nusd_per_node_month = -1\nsource = "x"\n',
    ],
)
def test_price_files_need_finite_prices_and_hours(tmp_path, toml):
    from analyzer.cost.prices import PriceOverrides, resolve_prices

    p = tmp_path / "prices.toml"
    p.write_text(toml)
    with pytest.raises(InputError, match=r"outside|expected"):
        resolve_prices("h100", PriceOverrides(prices_file=str(p)))


@pytest.mark.parametrize("value", [1e308, float("inf"), float("nan"), -1.0])
def test_price_flags_are_finite_and_bounded(value):
    from analyzer.cost.prices import PriceOverrides

    with pytest.raises(UsageError, match="--gpu-hour-usd"):
        PriceOverrides(gpu_hour_usd=value)


def test_synth_requests_are_bounded(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "analyzer.cli", "synth", "-n", "100000000000", "-o", "-"],
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "KVPOOL_NO_PROGRESS": "1"},
    )
    assert r.returncode == 2 and b"--requests" in r.stderr and not r.stdout
    assert b"Traceback" not in r.stderr


@pytest.mark.slow
def test_synth_to_stdout_streams_into_a_pipe_that_closes(tmp_path):
    """`kvpool synth -n N -o - | head` ends when head does, without spooling N requests
    to a temporary file first."""
    head = subprocess.Popen(["head", "-n", "3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "analyzer.cli", "synth", "-n", "5000000", "-o", "-"],
        stdout=head.stdin,
        stderr=subprocess.PIPE,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "KVPOOL_NO_PROGRESS": "1", "TMPDIR": str(tmp)},
    )
    head.stdin.close()
    out = head.stdout.read()
    head.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert b"Traceback" not in proc.stderr and b"BrokenPipe" not in proc.stderr
    assert len(out.splitlines()) == 3 and json.loads(out.splitlines()[0])
    assert list(tmp.iterdir()) == []  # nothing spooled


def _salt_cli(tmp_path: Path, salt: Path, timeout: float = 30) -> subprocess.CompletedProcess:
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(_chat(i, None) for i in range(3)) + "\n")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "analyzer.cli",
            "convert",
            str(log),
            "--salt-file",
            str(salt),
            "-o",
            str(tmp_path / "t.parquet"),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env={**os.environ, "KVPOOL_NO_PROGRESS": "1"},
    )


@pytest.mark.slow
def test_a_dangling_salt_symlink_is_one_line(tmp_path):
    salt = tmp_path / ".kvpool-salt"
    salt.symlink_to(tmp_path / "gone")
    r = _salt_cli(tmp_path, salt)
    assert r.returncode in (3, 4), r.stderr
    assert "Traceback" not in r.stderr and "nested too deeply" not in r.stderr
    assert "symbolic link" in r.stderr
    assert salt.is_symlink() and not (tmp_path / "gone").exists()  # left as found


@pytest.mark.slow
def test_a_fifo_as_salt_file_does_not_hang(tmp_path):
    salt = tmp_path / "salt.fifo"
    os.mkfifo(salt)
    r = _salt_cli(tmp_path, salt, timeout=60)
    assert r.returncode == 3, r.stderr
    assert "not a regular file" in r.stderr and "Traceback" not in r.stderr

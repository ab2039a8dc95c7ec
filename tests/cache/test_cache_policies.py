"""The eviction-policy registry: one class and one registry line add a policy to both
`kvpool reuse --policies` and `kvpool replay --eviction`; unknown names are errors.

The trace: single-block requests A, B, C, A, B, C on a cache of two blocks. LRU and
FIFO both keep the two newest blocks and never hit; most-recently-used eviction keeps
A at r2 and C at r4 and hits twice, 2 x 16 of the 6 x 17 prompt tokens.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from analyzer.cache import POLICIES, EvictionPolicy, Node, Policy, get_policy
from analyzer.cli import app
from analyzer.errors import UsageError
from tests.helpers.traces import canonical


class MostRecent(Policy):
    """Newest leaf first: the other end of LRU."""

    def key(self, node: Node) -> tuple[float, ...]:
        return (-node.last_access, -node.touch_seq)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(POLICIES, "toy", EvictionPolicy(MostRecent, "MRU"))  # the one line


@pytest.fixture
def abcabc(tmp_path):
    rows = [(f"s{i}", "t", 17, [h]) for i, h in enumerate([101, 202, 303, 101, 202, 303])]
    return canonical(tmp_path / "abc.parquet", rows)


MRU_HIT_RATE = 32 / 102


def test_reuse_runs_a_registered_toy_policy(toy, abcabc, tmp_path):
    out = tmp_path / "reuse.json"
    args = ["reuse", str(abcabc), "--warmup", "0", "--capacity-tokens", "32"]
    r = CliRunner().invoke(app, [*args, "--policies", "toy,fifo", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "MRU" in r.output  # the registry's label heads the table column
    curves = json.loads(out.read_text())["curves"]
    assert [p["hit_rate"] for p in curves["toy"]] == [pytest.approx(MRU_HIT_RATE, abs=1e-6)]
    assert [p["hit_rate"] for p in curves["fifo"]] == [0.0]


def test_replay_evicts_with_a_registered_toy_policy(toy, abcabc, tmp_path):
    rates = {}
    for policy in ("toy", "lru", "fifo"):
        out = tmp_path / f"{policy}.json"
        r = CliRunner().invoke(
            app,
            [
                "replay",
                str(abcabc),
                "--instances",
                "1",
                "--scenarios",
                "local",
                "--local-capacity-tokens",
                "32",
                "--warmup",
                "0",
                "--no-search",
                # the prefill pool: an aggregated engine's 32-token pool is all the running
                # request's own blocks, leaving no prefix cache to evict from
                "--serving",
                "disaggregated",
                "--eviction",
                policy,
                "--json",
                str(out),
            ],
        )
        assert r.exit_code == 0, r.output
        rates[policy] = json.loads(out.read_text())["scenarios"]["local"]["hit_rate"]
    assert rates["toy"] == pytest.approx(MRU_HIT_RATE, abs=1e-6)
    assert rates["lru"] == rates["fifo"] == 0.0


def test_unknown_policies_are_errors_not_fallbacks(abcabc):
    runner = CliRunner()
    r = runner.invoke(app, ["reuse", str(abcabc), "--policies", "lru,nope"])
    assert r.exit_code != 0 and isinstance(r.exception, UsageError)
    assert "nope" in str(r.exception) and "s3fifo" in str(r.exception.hint)
    r = runner.invoke(app, ["replay", str(abcabc), "--eviction", "nope", "--no-search"])
    assert r.exit_code != 0 and isinstance(r.exception, UsageError)
    assert "--eviction" in str(r.exception)
    # Belady's optimal needs the future and S3-FIFO is not a prefix tree: a replay's tiers
    # cannot run them, and says so.
    for name in ("optimal", "s3fifo"):
        with pytest.raises(UsageError, match="not a policy a replay can run"):
            get_policy(name, flag="--eviction", replay=True)

"""`kvpool probe`: the paired isolation check against engines started on loopback
(tests/helpers/salted_engine.py), salted end to end or leaking in one tier."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from analyzer.advisor.probe import run_probe
from analyzer.cli import app
from analyzer.errors import InputError, UsageError
from tests.helpers.salted_engine import Engine, Pool, Served


@pytest.fixture
def engines(request: pytest.FixtureRequest) -> Iterator[list[Served]]:
    """Two engines sharing a pool; ``request.param`` sets the engines' fields."""
    kw = getattr(request, "param", {})
    pool = Pool()
    served = [Served(Engine(pool=pool, **kw)), Served(Engine(pool=pool, **kw))]
    yield served
    for s in served:
        s.close()


def test_a_salted_pool_passes(engines):
    r = run_probe([s.url for s in engines], "m", words=200)
    m = r.metrics
    assert r.passed is True
    assert m["cross_salt_hit_tokens"] == 0 and m["cross_salt_counter_hit_tokens"] == 0
    assert m["same_salt_hit_tokens"] >= 192  # every full block but the last token's
    # The second engine's same-salt request is served by the pool.
    second = next(s for s in r.steps if s.step == "same-salt" and s.endpoint == 2)
    assert second.cached_tokens and second.cached_tokens > 0
    assert [s.step for s in r.steps].count("other-salt") == 2
    assert r.counter_prompt_tokens and r.counter_prompt_tokens > 0


@pytest.mark.parametrize("engines", [{"leak_pool": True}], indirect=True)
def test_a_pool_that_drops_the_salt_fails(engines):
    r = run_probe([s.url for s in engines], "m", words=200)
    assert r.passed is False
    leak = [s for s in r.steps if s.step == "other-salt" and s.cached_tokens]
    assert {s.endpoint for s in leak} == {1, 2}  # each reads the pool below its HBM
    assert r.metrics["cross_salt_counter_hit_tokens"] > 0
    assert any(line.startswith("FAIL") for line in r.lines())


@pytest.mark.parametrize("engines", [{"leak_hbm": True}], indirect=True)
def test_an_engine_cache_that_ignores_the_salt_fails_on_one_engine(engines):
    r = run_probe([engines[0].url], "m", words=200)
    assert r.passed is False
    assert r.metrics["cross_salt_hit_tokens"] > 0


@pytest.mark.parametrize("engines", [{"report_cached": False}], indirect=True)
def test_without_cached_tokens_the_counters_decide(engines):
    r = run_probe([s.url for s in engines], "m", words=200)
    assert "cross_salt_hit_tokens" not in r.metrics
    assert r.metrics["cross_salt_counter_hit_tokens"] == 0
    assert r.passed is None  # no control visible: not decided
    assert any("enable-prompt-tokens-details" in n for n in r.notes)


@pytest.mark.parametrize("engines", [{"report_cached": False, "leak_pool": True}], indirect=True)
def test_counters_alone_catch_a_leak(engines):
    r = run_probe([s.url for s in engines], "m", words=200)
    assert r.passed is False


@pytest.mark.parametrize("engines", [{"salt_field": "extra_key"}], indirect=True)
def test_the_salt_goes_in_the_field_the_engine_reads(engines):
    urls = [s.url for s in engines]
    assert run_probe(urls, "m", words=200, salt_field="extra_key").passed is True
    # Sent as cache_salt, the engine sees no salt at all: every request shares.
    assert run_probe(urls, "m", words=200).passed is False


def test_bad_urls_and_flags_are_one_line_errors():
    with pytest.raises(UsageError, match="not an http"):
        run_probe(["node-a:8000"], "m")
    with pytest.raises(UsageError, match="salt-field"):
        run_probe(["http://127.0.0.1:9"], "m", salt_field="salt")
    with pytest.raises(InputError) as err:
        run_probe(["http://user:secret@127.0.0.1:9"], "m", timeout_s=2)
    assert "secret" not in str(err.value) and "cannot reach" in str(err.value)


@pytest.mark.parametrize("engines", [{}, {"leak_pool": True}], indirect=True)
def test_the_command_writes_results_and_exits_5_on_a_leak(engines, tmp_path):
    out = tmp_path / "probe.json"
    args = ["probe", *(s.url for s in engines), "--model", "m", "--prefix-words", "100"]
    r = CliRunner().invoke(app, [*args, "-o", str(out)])
    doc = json.loads(out.read_text())
    assert doc["schema"] == "kvpool.isolation-probe/1"
    leak = engines[0].engine.leak_pool
    assert r.exit_code == (5 if leak else 0), r.output
    assert doc["passed"] is (not leak)
    assert ("FAIL" if leak else "PASS") in r.output

"""`kvpool validate --prometheus`: engine counters as measured truth.

The saved expositions in tests/fixtures/engine/ were written by ``prometheus_client``
(the library vLLM, SGLang and LMCache expose their metrics with) with each product's
metric names, help texts, label sets and TTFT buckets as their sources define them
(vllm/v1/metrics/loggers.py, sglang/srt/observability/metrics_collector.py,
lmcache/observability.py); each pair is two scrapes of the same engines, the second
after three times the traffic of the first. The Prometheus query API is served by a
small HTTP server started here on 127.0.0.1, answering ``increase(...)`` from the same
pair as a Prometheus server that scraped them would.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer.advisor.engine_metrics import (
    EngineProjection,
    Histogram,
    ProjectedScenario,
    compare,
    parse_exposition,
    read_window,
    window_of,
)
from analyzer.errors import InputError

FIX = Path(__file__).parents[1] / "fixtures" / "engine"
KVPOOL = [sys.executable, "-m", "analyzer.cli"]


def _pair(name: str):  # type: ignore[no-untyped-def]
    before, after = FIX / f"{name}-before.prom", FIX / f"{name}-after.prom"
    return read_window([(str(before), before.name), (str(after), after.name)], None)


def test_vllm_window_per_engine_and_total():
    w = _pair("vllm")
    assert [i.name for i in w.instances] == ["engine=0", "engine=1"]
    total = w.total()
    assert total.prompt_tokens == 600_000  # (200k + 100k) queried tokens, twice
    assert total.fraction("hbm") == pytest.approx(240_000 / 600_000)
    assert total.fraction("below-hbm") == pytest.approx(100_000 / 600_000)
    assert total.fraction("total") == pytest.approx(340_000 / 600_000)
    e0 = w.instances[0]
    assert e0.fraction("hbm") == pytest.approx(0.45)
    assert e0.fraction("below-hbm") == pytest.approx(0.15)
    # 16 first tokens in the window: 0.05 0.05 0.2 0.2 0.3x4 0.6 0.6 0.7 0.7 1.5 1.5 3 3
    ttft = w.ttft_metrics()
    assert ttft["completed"] == 16
    assert ttft["mean_ttft_s"] == pytest.approx(2 * 6.65 / 16)
    assert ttft["median_ttft_s"] == pytest.approx(0.5)  # rank 8 ends bucket (0.25, 0.5]
    assert ttft["p90_ttft_s"] == pytest.approx(3.0)  # rank 14.4 in (2.5, 5.0]: 2.5 + 0.2*2.5


def test_sglang_cache_sources_are_tiers():
    w = _pair("sglang")
    (inst,) = w.instances
    assert inst.engine == "sglang"
    assert inst.prompt_tokens == 800_000  # streaming and not, summed
    assert inst.fraction("hbm") == pytest.approx(0.30)  # device
    assert inst.fraction("dram") == pytest.approx(0.15)  # host
    assert inst.fraction("pool") == pytest.approx(0.05)  # storage
    assert inst.fraction("below-hbm") == pytest.approx(0.20)
    assert inst.fraction("total") == pytest.approx(0.50)
    assert inst.engine_hit_rate == 0.5  # the gauge, as the engine reports it
    assert w.ttft_metrics()["completed"] == 10


def test_lmcache_counters_beside_vllm():
    w = _pair("vllm-lmcache")
    lm = [i for i in w.instances if i.engine == "lmcache"]
    assert len(lm) == 1 and lm[0].name == "worker_id=0"
    total = w.total()
    assert total.lmcache_hit_tokens == 100_000
    assert total.lmcache_requested_tokens == 160_000
    proj = EngineProjection(ProjectedScenario("pooled", {"hbm": 0.4, "pool": 0.2}), None)
    checks, _ = compare("candidate", w, proj)
    by = {(c.instance, c.metric): c for c in checks}
    assert by[("all", "hit rate lmcache")].measured == pytest.approx(100_000 / 600_000)
    assert by[("worker_id=0", "lmcache hits / tokens asked of it")].measured == 0.625


def test_one_exposition_is_the_engines_lifetime():
    p = FIX / "vllm-after.prom"
    w = read_window([(str(p), p.name)], None)
    assert w.kind == "exposition"
    assert w.total().prompt_tokens == 900_000


def test_a_counter_that_went_down_is_named():
    a, b = FIX / "vllm-after.prom", FIX / "vllm-before.prom"
    with pytest.raises(InputError, match=r"vllm:prefix_cache_\w+_total\{.*went down"):
        read_window([(str(a), a.name), (str(b), b.name)], None)


@pytest.mark.parametrize(
    "text",
    ["not metrics at all {{{", 'vllm:prefix_cache_hits_total{engine="0" 3\n', "# nothing here\n"],
)
def test_malformed_expositions_are_one_line(text):
    with pytest.raises(InputError) as exc:
        parse_exposition(text, "bad.prom")
    assert "bad.prom" in str(exc.value) and "\n" not in exc.value.message


@given(
    st.lists(st.floats(0.001, 100.0, allow_nan=False), min_size=1, max_size=60),
    st.sampled_from([0.5, 0.9, 0.99]),
)
def test_quantile_matches_bucket_interpolation(values, q):
    """Against an obviously right reading: find the bucket holding rank q*n by walking
    sorted observations, then interpolate linearly inside it (histogram_quantile)."""
    bounds = [0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 50.0, float("inf")]
    cum = [(b, float(sum(v <= b for v in values))) for b in bounds]
    got = Histogram(tuple(cum), sum(values), float(len(values))).quantile(q)
    rank = q * len(values)
    prev_b, prev_n = 0.0, 0.0
    for b, n in cum:
        if n >= rank:
            want = (
                prev_b
                if b == float("inf")
                else prev_b + (b - prev_b) * (rank - prev_n) / (n - prev_n)
                if n > prev_n
                else b
            )
            break
        prev_b, prev_n = b, n
    assert got == pytest.approx(want)


def test_window_of_keeps_gauges_and_counts_new_series_from_zero():
    before = parse_exposition((FIX / "sglang-before.prom").read_text(), "b")
    after = parse_exposition((FIX / "sglang-after.prom").read_text(), "a")
    d = window_of({}, after, "a")
    assert d == after
    w = window_of(before, after, "a")
    gauge = [v for (n, _), v in w.items() if n == "sglang:cache_hit_rate"]
    assert gauge == [0.5]


# -- a Prometheus server's query API and an engine's /metrics, on loopback ---------------


class _Prometheus(BaseHTTPRequestHandler):
    """Answers /api/v1/query with increase() of the fixture pair, and /metrics with the
    later exposition, as a Prometheus server and a vLLM engine would."""

    window: ClassVar[dict] = {}  # type: ignore[type-arg]
    exposition: ClassVar[str] = ""

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/metrics":
            body = self.exposition.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
        elif url.path == "/api/v1/query":
            q = urllib.parse.parse_qs(url.query)["query"][0]
            name = re.fullmatch(r"\w+\((.+)\[\d+s\]\)", q).group(1)  # type: ignore[union-attr]
            result = [
                {"metric": {**dict(labels), "instance": "10.0.0.7:8000"}, "value": [1.0, str(v)]}
                for (n, labels), v in self.window.items()
                if n == name
            ]
            body = json.dumps(
                {"status": "success", "data": {"resultType": "vector", "result": result}}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
        else:
            body = b"not found"
            self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def prometheus():  # type: ignore[no-untyped-def]
    before = parse_exposition((FIX / "vllm-before.prom").read_text(), "b")
    after_text = (FIX / "vllm-after.prom").read_text()
    after = parse_exposition(after_text, "a")
    _Prometheus.window = {
        k: v for k, v in window_of(before, after, "a").items() if not k[0].endswith("_created")
    }
    _Prometheus.exposition = after_text
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_query_api_gives_the_window_of_the_expositions(prometheus):
    from_api = read_window([(prometheus, prometheus)], 3600.0)
    from_files = _pair("vllm")
    assert from_api.kind == "prometheus"
    assert [i.name for i in from_api.instances] == [
        "instance=10.0.0.7:8000,engine=0",
        "instance=10.0.0.7:8000,engine=1",
    ]
    a, b = from_api.total(), from_files.total()
    assert a.prompt_tokens == b.prompt_tokens
    assert dict(a.hits_by_tier) == dict(b.hits_by_tier)
    assert from_api.ttft_metrics() == {
        **from_files.ttft_metrics(),
        "duration_s": 3600.0,
        "request_throughput": 16 / 3600.0,
    }


def test_engine_metrics_endpoint_is_a_snapshot(prometheus):
    url = prometheus + "/metrics"
    w = read_window([(url, url)], None)
    assert w.kind == "exposition" and w.total().prompt_tokens == 900_000


def test_unreachable_prometheus_is_one_line():
    with pytest.raises(InputError, match="cannot reach it"):
        read_window([("http://127.0.0.1:1", "http://127.0.0.1:1")], 60.0)


# -- the command, against a real report --------------------------------------------------


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """report.json of a real analysis (240 chat requests, no rate search)."""
    from analyzer.advisor import AnalyzeOptions, run_analysis
    from analyzer.report import ReportDocument, render_json

    tmp = tmp_path_factory.mktemp("engine-report")
    import zstandard

    root = Path(__file__).resolve().parents[2]
    raw = zstandard.ZstdDecompressor().decompress(
        (root / "traces" / "chat.jsonl.zst").read_bytes(), max_output_size=1 << 30
    )
    log = tmp / "chat.jsonl"
    log.write_bytes(b"\n".join(raw.splitlines()[:240]) + b"\n")
    opts = AnalyzeOptions(sensitivity_replays=False)  # the plans are the projection
    doc = ReportDocument.of(run_analysis([str(log)], opts))
    p = tmp / "report.json"
    p.write_text(render_json(doc))
    return p


def _exposition_for(hbm: float, below: float, n: int = 100_000) -> str:
    """A vLLM exposition whose counters give these hit rates (the products' own form)."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    r = CollectorRegistry()
    labels = ["model_name", "engine"]
    for name, value in (
        ("vllm:prefix_cache_queries", n),
        ("vllm:prefix_cache_hits", round(hbm * n)),
        ("vllm:external_prefix_cache_queries", n - round(hbm * n)),
        ("vllm:external_prefix_cache_hits", round(below * n)),
    ):
        Counter(name, name, labels, registry=r).labels("m", "0").inc(value)
    return generate_latest(r).decode()


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVPOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vllm", "sglang", "vllm-lmcache"])
def test_validate_reads_saved_expositions(report, tmp_path, name):
    r = _run(
        [
            "validate",
            "--prometheus",
            str(FIX / f"{name}-before.prom"),
            "--prometheus",
            str(FIX / f"{name}-after.prom"),
            "--report",
            str(report),
            "--json",
            "v.json",
        ],
        tmp_path,
    )
    assert r.returncode in (0, 5), r.stderr
    assert "Traceback" not in r.stderr
    doc = json.loads((tmp_path / "v.json").read_text())
    (eng,) = doc["engine_metrics"]
    assert eng["role"] == "candidate" and eng["kind"] == "window"
    total = {c["metric"]: c for c in eng["checks"] if c["instance"] == "all"}
    assert "hit rate total" in total and total["hit rate total"]["gate"] == "main"
    main = next(g for g in doc["gates"] if g["id"] == "main")
    shortfall = next(c for c in main["criteria"] if c["metric"] == "hit_rate_shortfall")
    assert shortfall["measured"] == pytest.approx(
        max(0.0, total["hit rate total"]["projected"] - total["hit rate total"]["measured"]),
        abs=1e-6,
    )
    assert (r.returncode == 5) == doc["failed"]


@pytest.mark.slow
def test_validate_gates_follow_the_counters(report, tmp_path):
    from analyzer.report.document import ReportDocument
    from analyzer.report.projection import engine_projection

    proj = engine_projection(ReportDocument.load(report).report)
    assert proj.candidate is not None and proj.baseline is not None
    c = proj.candidate
    hbm, below = c.tier("hbm") or 0.0, c.tier("below-hbm") or 0.0
    (tmp_path / "as-projected.prom").write_text(_exposition_for(hbm, below))
    (tmp_path / "short.prom").write_text(_exposition_for(hbm * 0.5, 0.0))
    base = proj.baseline.tier("hbm") or 0.0
    (tmp_path / "base.prom").write_text(_exposition_for(base, 0.0))
    args = ["validate", "--report", str(report)]
    ok = _run(
        [*args, "--prometheus", "as-projected.prom", "--prometheus", "baseline=base.prom"], tmp_path
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "no gate failed" in ok.stdout
    bad = _run([*args, "--prometheus", "short.prom"], tmp_path)
    if hbm + below > proj.tolerance:  # a shortfall beyond the tolerance fails the main gate
        assert bad.returncode == 5, bad.stdout + bad.stderr
        assert "Main gate" in bad.stdout

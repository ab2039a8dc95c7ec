"""Engine counters as measured truth: a window of vLLM, SGLang and LMCache metrics.

What is read (names and labels as the products' own sources define them; docs/validation.md
cites each):

* vLLM (``vllm/v1/metrics/loggers.py``, labels ``model_name``, ``engine``): counters
  ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` (prompt tokens looked up in,
  and found in, the engine's own HBM prefix cache), ``vllm:external_prefix_cache_queries``
  / ``_hits`` (tokens looked up in, and loaded from, the KV connector: LMCache, Mooncake
  Store) and the histogram ``vllm:time_to_first_token_seconds``;
* SGLang (``sglang/srt/observability/metrics_collector.py``): the counter
  ``sglang:cached_tokens_total{cache_source=device|host|storage}`` (HiCache L1, L2, L3;
  ``storage_<backend>`` is read as storage too, ``total`` when the engine gave no split),
  ``sglang:prompt_tokens_total``, the gauge ``sglang:cache_hit_rate`` and the histogram
  ``sglang:time_to_first_token_seconds``;
* LMCache (``lmcache/observability.py``, labels ``model_name``, ``worker_id``, ``role``,
  ``served_model_name``): ``lmcache:num_hit_tokens`` / ``lmcache:num_requested_tokens``.

From a Prometheus server's HTTP query API (``increase(...[window])`` at one instant), or
from saved text expositions parsed by ``prometheus_client``'s own parser: one exposition
is the engines' whole life (counters start at zero), two are a window (the second minus
the first; a counter that went down means the engine restarted in between and is an
error naming the series).

Each engine instance (its ``instance``/``pod``/``engine``/``worker_id`` labels, or the
source when it has none) gives prompt tokens, tokens served per tier and its TTFT
histogram; the tiers are the replay's (docs/replay.md): SGLang's device, host and storage
are HBM, DRAM and the pool (or NVMe), vLLM's own cache is HBM and its connector's hits
are every tier below HBM together, as LMCache's are.
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from analyzer.errors import InputError, Location, UsageError

# Sample names read (counters with their ``_total``; histograms by their base name).
COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total",
    "sglang:cached_tokens_total",
    "sglang:prompt_tokens_total",
    "lmcache:num_hit_tokens_total",
    "lmcache:num_requested_tokens_total",
)
GAUGES = ("sglang:cache_hit_rate",)
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds")
# Labels that tell one engine instance from another; every other label (model, le,
# cache_source, is_streaming, ...) is a dimension summed over within an instance.
INSTANCE_LABELS = ("instance", "pod", "engine", "dp_rank", "worker_id")
# Below-HBM tiers of the replay, the only ones an engine counter below HBM can be
# compared with as a whole (a connector's hits do not say which tier served them).
BELOW_HBM = ("dram", "nvme", "pool")

Key = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted labels)


@dataclass(frozen=True, slots=True)
class Histogram:
    """A latency histogram's window: cumulative counts per upper bound, sum and count."""

    buckets: tuple[tuple[float, float], ...]  # (le, cumulative count), ascending le
    total_s: float
    count: float

    def quantile(self, q: float) -> float | None:
        """Prometheus's ``histogram_quantile``: linear within the bucket holding rank
        ``q * count`` (the highest finite bound when it falls in ``+Inf``)."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.buckets[-1][1]
        lo_le, lo_n = 0.0, 0.0
        for le, n in self.buckets:
            if n >= rank:
                if math.isinf(le):
                    return lo_le
                if n == lo_n:
                    return le
                return lo_le + (le - lo_le) * (rank - lo_n) / (n - lo_n)
            lo_le, lo_n = le, n
        return lo_le

    @property
    def mean_s(self) -> float | None:
        return self.total_s / self.count if self.count > 0 else None


@dataclass(frozen=True, slots=True)
class EngineInstance:
    """One engine instance over the window: prompt tokens, hit tokens per tier."""

    name: str
    engine: str  # vllm | sglang | lmcache
    prompt_tokens: float
    hits_by_tier: Mapping[str, float]  # hbm, dram, pool, below-hbm, total
    ttft: Histogram | None = None
    lmcache_hit_tokens: float | None = None
    lmcache_requested_tokens: float | None = None
    engine_hit_rate: float | None = None  # the engine's own gauge (sglang:cache_hit_rate)

    def fraction(self, tier: str) -> float | None:
        h = self.hits_by_tier.get(tier)
        if h is None or self.prompt_tokens <= 0:
            return None
        return h / self.prompt_tokens


@dataclass(frozen=True, slots=True)
class EngineWindow:
    """What the engines measured over one window, from one or two sources."""

    source: str  # as messages name it
    kind: str  # "exposition" (lifetime), "window" (two expositions), "prometheus"
    window_s: float | None
    instances: tuple[EngineInstance, ...]

    def total(self) -> EngineInstance:
        """Every instance summed (the cluster's figures)."""
        tiers: dict[str, float] = {}
        for inst in self.instances:
            for t, h in inst.hits_by_tier.items():
                tiers[t] = tiers.get(t, 0.0) + h
        ttft = _merge_histograms([i.ttft for i in self.instances if i.ttft is not None])
        lm_hit = [i.lmcache_hit_tokens for i in self.instances if i.lmcache_hit_tokens is not None]
        lm_req = [
            i.lmcache_requested_tokens
            for i in self.instances
            if i.lmcache_requested_tokens is not None
        ]
        engines = sorted({i.engine for i in self.instances})
        return EngineInstance(
            name="all",
            engine="+".join(engines),
            prompt_tokens=sum(i.prompt_tokens for i in self.instances),
            hits_by_tier=tiers,
            ttft=ttft,
            lmcache_hit_tokens=sum(lm_hit) if lm_hit else None,
            lmcache_requested_tokens=sum(lm_req) if lm_req else None,
        )

    def ttft_metrics(self) -> dict[str, float]:
        """The window's TTFT as ``kvpool validate``'s result metrics (seconds)."""
        h = self.total().ttft
        out: dict[str, float] = {}
        if h is None or h.count <= 0:
            return out
        if (m := h.mean_s) is not None:
            out["mean_ttft_s"] = m
        for key, q in (("median_ttft_s", 0.5), ("p90_ttft_s", 0.9), ("p99_ttft_s", 0.99)):
            v = h.quantile(q)
            if v is not None:
                out[key] = v
        out["completed"] = h.count
        if self.window_s:
            out["duration_s"] = self.window_s
            out["request_throughput"] = h.count / self.window_s
        return out


def _merge_histograms(hs: list[Histogram]) -> Histogram | None:
    if not hs:
        return None
    bounds = sorted({le for h in hs for le, _ in h.buckets})
    merged = []
    for b in bounds:
        n = 0.0
        for h in hs:
            # a histogram without this bound counts, at it, what its next lower bound has
            below = [c for le, c in h.buckets if le <= b]
            n += below[-1] if below else 0.0
        merged.append((b, n))
    return Histogram(tuple(merged), sum(h.total_s for h in hs), sum(h.count for h in hs))


# -- reading -----------------------------------------------------------------------------


def _key(name: str, labels: Mapping[str, str]) -> Key:
    return name, tuple(sorted((str(k), str(v)) for k, v in labels.items()))


def _wanted(name: str) -> bool:
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    return name in COUNTERS or name in GAUGES or base in HISTOGRAMS


def parse_exposition(text: str, source: str) -> dict[Key, float]:
    """The samples of a Prometheus text exposition that this module reads, by the
    products' own names; a malformed exposition is a one-line error naming ``source``."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[Key, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                name = s.name
                # an untyped counter keeps its _total; a typed one too, in its samples
                if not _wanted(name):
                    continue
                if not math.isfinite(s.value) and not name.endswith("_bucket"):
                    raise InputError(f"{name} is {s.value}", Location(source, field=name))
                out[_key(name, s.labels)] = float(s.value)
    except InputError:
        raise
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise InputError(
            f"not a Prometheus text exposition ({str(exc)[:120]})",
            Location(source),
            hint="save one with: curl -s http://ENGINE:PORT/metrics > before.prom",
        ) from None
    if not out:
        raise InputError(
            "no vLLM, SGLang or LMCache prefix-cache counters in it (vllm:prefix_cache_*, "
            "sglang:cached_tokens_total, lmcache:num_hit_tokens ...)",
            Location(source),
            hint="scrape the engine's /metrics (SGLang: start it with --enable-metrics)",
        )
    return out


def window_of(
    before: Mapping[Key, float], after: Mapping[Key, float], source: str
) -> dict[Key, float]:
    """``after - before`` per series (a series new in ``after`` counts from zero; a
    gauge keeps its ``after`` value); a counter that went down is an error."""
    out: dict[Key, float] = {}
    for key, v in after.items():
        name = key[0]
        if name in GAUGES:
            out[key] = v
            continue
        d = v - before.get(key, 0.0)
        if d < 0:
            labels = ",".join(f"{k}={val}" for k, val in key[1])
            raise InputError(
                f"counter {name}{{{labels}}} went down between the snapshots (the engine "
                "restarted?): no window to measure",
                Location(source, field=name),
                hint="give two snapshots of the same run, the earlier first",
            )
        out[key] = d
    return out


def _instance(labels: tuple[tuple[str, str], ...], fallback: str) -> str:
    d = dict(labels)
    parts = [f"{k}={d[k]}" for k in INSTANCE_LABELS if k in d]
    return ",".join(parts) or fallback


@dataclass(slots=True)
class _Group:
    """One engine instance's samples as :func:`instances_of` adds them up."""

    prompt: float = 0.0
    tiers: dict[str, float] = field(default_factory=dict)
    buckets: dict[float, float] = field(default_factory=dict)  # le -> count
    sum: float = 0.0
    count: float = 0.0
    lm: dict[str, float] = field(default_factory=dict)  # LMCache's hit / requested
    external_queries: float = 0.0
    gauge: float | None = None  # SGLang's cache_hit_rate


def instances_of(samples: Mapping[Key, float], fallback: str) -> tuple[EngineInstance, ...]:
    """The samples grouped by engine instance, each with its tiers and TTFT histogram."""
    groups: dict[tuple[str, str], _Group] = {}

    for (name, labels), v in samples.items():
        engine = name.split(":", 1)[0]
        d = groups.setdefault((engine, _instance(labels, fallback)), _Group())
        tiers = d.tiers
        if name == "vllm:prefix_cache_queries_total":
            d.prompt += v
        elif name == "vllm:prefix_cache_hits_total":
            tiers["hbm"] = tiers.get("hbm", 0.0) + v
        elif name == "vllm:external_prefix_cache_hits_total":
            tiers["below-hbm"] = tiers.get("below-hbm", 0.0) + v
        elif name == "vllm:external_prefix_cache_queries_total":
            d.external_queries += v
        elif name == "sglang:prompt_tokens_total":
            d.prompt += v
        elif name == "sglang:cached_tokens_total":
            source = dict(labels).get("cache_source", "total")
            tier = {"device": "hbm", "host": "dram"}.get(source)
            if tier is None and source.startswith("storage"):
                tier = "pool"
            tiers[tier or "total"] = tiers.get(tier or "total", 0.0) + v
        elif name == "sglang:cache_hit_rate":
            d.gauge = v
        elif name.startswith("lmcache:"):
            k = "hit" if "hit" in name else "requested"
            d.lm[k] = d.lm.get(k, 0.0) + v
        elif name.endswith("_bucket"):
            le = float(dict(labels).get("le", "inf"))
            d.buckets[le] = d.buckets.get(le, 0.0) + v
        elif name.endswith("_sum"):
            d.sum += v
        elif name.endswith("_count"):
            d.count += v
    # LMCache's own series carry other labels than its vLLM's (worker_id, not engine):
    # they stand as instances of their own, and join the vLLM figures in the total.
    out = []
    for (engine, inst), d in sorted(groups.items(), key=lambda kv: kv[0]):
        tiers = dict(d.tiers)
        if engine == "sglang" and any(t in tiers for t in ("hbm", "dram", "pool")):
            tiers["below-hbm"] = tiers.get("dram", 0.0) + tiers.get("pool", 0.0)
        if tiers and "total" not in tiers:
            tiers["total"] = tiers.get("hbm", 0.0) + tiers.get("below-hbm", 0.0)
        hist = None
        if d.buckets:
            hist = Histogram(tuple(sorted(d.buckets.items())), d.sum, d.count)
        out.append(
            EngineInstance(
                name=inst,
                engine=engine,
                prompt_tokens=d.prompt,
                hits_by_tier=tiers,
                ttft=hist,
                lmcache_hit_tokens=d.lm.get("hit"),
                lmcache_requested_tokens=d.lm.get("requested"),
                engine_hit_rate=d.gauge,
            )
        )
    return tuple(out)


def parse_duration(text: str, flag: str = "--window") -> float:
    """``90``, ``90s``, ``15m``, ``1h``, ``2d`` -> seconds (a usage error otherwise)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise UsageError(f"{flag} {text!r}: expected a duration like 300, 15m, 1h or 2d")
    v = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if not 0 < v <= 366 * 86400:
        raise UsageError(f"{flag} {text!r}: must be above 0 and at most a year")
    return v


def _promql_duration(seconds: float) -> str:
    return f"{round(seconds)}s"


def _http_get(url: str, timeout_s: float) -> bytes:
    shown = _shown_url(url)
    req = urllib.request.Request(url, headers={"Accept": "application/json, text/plain"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            data: bytes = resp.read(64 << 20)
            return data
    except urllib.error.HTTPError as exc:
        raise InputError(f"HTTP {exc.code} {exc.reason}", Location(shown)) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise InputError(f"cannot reach it ({reason})", Location(shown)) from None


def _shown_url(url: str) -> str:
    """A URL without ``user:password@`` or query (a token in either is never printed)."""
    p = urllib.parse.urlsplit(url)
    host = p.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((p.scheme, host, p.path, "", ""))


def query_prometheus(
    base: str, window_s: float, at: float | None = None, timeout_s: float = 30.0
) -> EngineWindow:
    """The window ``(at - window_s, at]`` from a Prometheus server's query API: one
    instant query per series name, ``increase(NAME[window])`` for counters and
    histogram buckets, ``avg_over_time`` for the gauge."""
    shown = _shown_url(base)
    root = base.rstrip("/")
    w = _promql_duration(window_s)
    samples: dict[Key, float] = {}
    names = [*COUNTERS, *(f"{h}_{s}" for h in HISTOGRAMS for s in ("bucket", "sum", "count"))]
    queries = [(n, f"increase({n}[{w}])") for n in names]
    queries += [(n, f"avg_over_time({n}[{w}])") for n in GAUGES]
    for name, q in queries:
        params = {"query": q}
        if at is not None:
            params["time"] = repr(at)
        raw = _http_get(f"{root}/api/v1/query?{urllib.parse.urlencode(params)}", timeout_s)
        try:
            doc = json.loads(raw)
            if doc.get("status") != "success":
                raise InputError(
                    f"query failed: {doc.get('error', 'unknown error')}", Location(shown, field=q)
                )
            result = doc["data"]["result"]
            for r in result:
                v = float(r["value"][1])
                if math.isfinite(v):
                    samples[_key(name, r.get("metric", {}))] = v
        except InputError:
            raise
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            raise InputError(
                "not a Prometheus query API answer (expected /api/v1/query JSON)",
                Location(shown, field=q),
                hint="give the Prometheus server's base URL (http://HOST:9090), or an "
                "engine's own http://HOST:PORT/metrics",
            ) from None
    if not samples:
        raise InputError(
            f"no vLLM, SGLang or LMCache counters in the last {w}",
            Location(shown),
            hint="widen --window, or check that Prometheus scrapes the engines",
        )
    return EngineWindow(shown, "prometheus", window_s, instances_of(samples, shown))


def is_http(source: str) -> bool:
    return source.lower().startswith(("http://", "https://"))


def read_snapshot(source: str, shown: str, timeout_s: float = 30.0) -> dict[Key, float]:
    """One exposition: a saved file, or an engine's own ``/metrics`` scraped now."""
    if is_http(source):
        text = _http_get(source, timeout_s).decode("utf-8", "replace")
    else:
        p = Path(source)
        if not p.is_file():
            raise InputError("file not found", Location(shown))
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise InputError("not a UTF-8 text exposition", Location(shown)) from None
        except OSError as exc:
            raise InputError(f"cannot read it: {exc.strerror or exc}", Location(shown)) from None
    return parse_exposition(text, shown)


def read_window(
    sources: Iterable[tuple[str, str]], window_s: float | None, at: float | None = None
) -> EngineWindow:
    """The window one role's sources make: a Prometheus server (with ``window_s``), one
    exposition (the engines' lifetime), or two expositions (earlier first).

    ``sources``: (what to read, how messages name it)."""
    items = list(sources)
    servers = [s for s in items if is_http(s[0]) and not _is_metrics_path(s[0])]
    if servers:
        if len(items) > 1:
            raise UsageError(
                "a Prometheus server is a window by itself: give it alone for its role"
            )
        return query_prometheus(items[0][0], window_s or 3600.0, at)
    if len(items) > 2:
        raise UsageError(
            "give one exposition (the engines' lifetime) or two (before and after) per role"
        )
    snaps = [read_snapshot(s, shown) for s, shown in items]
    if len(snaps) == 1:
        return EngineWindow(items[0][1], "exposition", window_s, instances_of(snaps[0], "engine"))
    name = f"{items[0][1]} -> {items[1][1]}"
    delta = window_of(snaps[0], snaps[1], items[1][1])
    return EngineWindow(name, "window", window_s, instances_of(delta, "engine"))


def _is_metrics_path(url: str) -> bool:
    return urllib.parse.urlsplit(url).path.rstrip("/").endswith("/metrics")


# -- against the projection --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProjectedScenario:
    """One replayed deployment option: its hit rate by tier and TTFT (report.json)."""

    name: str
    hit_rate_by_tier: Mapping[str, float]
    ttft_mean_s: float | None = None
    ttft_p90_s: float | None = None

    def tier(self, tier: str) -> float | None:
        if tier == "total":
            return sum(self.hit_rate_by_tier.values()) if self.hit_rate_by_tier else None
        if tier == "below-hbm":
            vals = [self.hit_rate_by_tier.get(t) for t in BELOW_HBM]
            return sum(v for v in vals if v is not None)
        return self.hit_rate_by_tier.get(tier)


@dataclass(frozen=True, slots=True)
class EngineProjection:
    """What the report projects for the deployment under test (``candidate``: the
    recommended option) and for the HBM-only baseline (``baseline``)."""

    candidate: ProjectedScenario | None
    baseline: ProjectedScenario | None
    tolerance: float = 0.05  # hit-rate points (analyzer/advisor/current.py TOLERANCE)


@dataclass(frozen=True, slots=True)
class EngineCheck:
    """A measured engine figure beside the report's projection for it."""

    role: str
    instance: str
    engine: str
    metric: str  # e.g. "hit rate hbm"
    measured: float | None
    projected: float | None
    gate: str | None  # the pilot gate this comparison decides (None: informative)
    criterion: str | None = None  # the criterion's metric in that gate

    def to_json(self) -> dict[str, object]:
        diff = (
            None
            if self.measured is None or self.projected is None
            else round(self.measured - self.projected, 6)
        )
        return {
            "role": self.role,
            "instance": self.instance,
            "engine": self.engine,
            "metric": self.metric,
            "measured": None if self.measured is None else round(self.measured, 6),
            "projected": None if self.projected is None else round(self.projected, 6),
            "difference": diff,
            "gate": self.gate,
        }


TIERS_SHOWN = ("total", "hbm", "dram", "pool", "below-hbm")


def compare(
    role: str, window: EngineWindow, projection: EngineProjection
) -> tuple[tuple[EngineCheck, ...], dict[str, float]]:
    """Per instance and for all of them, each tier's measured hit rate beside the
    projection of the role's deployment; returns the checks and the criterion values
    (``hbm_hit_rate_error`` for the baseline gate; ``hit_rate_shortfall`` and
    ``offload_hit_shortfall`` for the main gate)."""
    checks: list[EngineCheck] = []
    criteria: dict[str, float] = {}
    if role == "isolation":
        # The window of the probe's other-salt requests: every hit is a leak.
        total = window.total()
        hit = total.hits_by_tier.get("total", 0.0)
        criteria["cross_salt_counter_hit_tokens"] = hit
        share = hit / total.prompt_tokens if total.prompt_tokens > 0 else None
        checks.append(
            EngineCheck(role, "all", total.engine, "hit rate total", share, 0.0, "isolation")
        )
        return tuple(checks), criteria
    scen = projection.baseline if role == "baseline" else projection.candidate
    gate = "baseline" if role == "baseline" else "main" if role == "candidate" else None
    rows = [window.total(), *window.instances] if len(window.instances) > 1 else [window.total()]
    for inst in rows:
        overall = inst.name == "all"
        name = "all" if overall else inst.name
        for tier in TIERS_SHOWN:
            m = inst.fraction(tier)
            if m is None:
                continue
            p = scen.tier(tier) if scen is not None else None
            decides, crit = None, None
            if overall and p is not None and gate is not None:
                if role == "baseline" and tier == "hbm":
                    decides, crit = gate, "hbm_hit_rate_error"
                    criteria[crit] = abs(m - p)
                elif role == "candidate" and tier == "total":
                    decides, crit = gate, "hit_rate_shortfall"
                    criteria[crit] = max(0.0, p - m)
                elif role == "candidate" and tier == "below-hbm" and p > 0:
                    decides, crit = gate, "offload_hit_shortfall"
                    criteria[crit] = max(0.0, p - m)
            checks.append(
                EngineCheck(role, name, inst.engine, f"hit rate {tier}", m, p, decides, crit)
            )
        if inst.lmcache_hit_tokens is not None:
            share = inst.lmcache_hit_tokens / inst.prompt_tokens if inst.prompt_tokens > 0 else None
            p = scen.tier("below-hbm") if scen is not None else None
            checks.append(EngineCheck(role, name, "lmcache", "hit rate lmcache", share, p, None))
            req = inst.lmcache_requested_tokens
            if req:
                checks.append(
                    EngineCheck(
                        role,
                        name,
                        "lmcache",
                        "lmcache hits / tokens asked of it",
                        inst.lmcache_hit_tokens / req,
                        None,
                        None,
                    )
                )
        if inst.engine_hit_rate is not None:
            checks.append(
                EngineCheck(
                    role,
                    name,
                    inst.engine,
                    "engine's own hit rate gauge",
                    inst.engine_hit_rate,
                    None,
                    None,
                )
            )
    ttft = window.ttft_metrics()
    if scen is not None and "mean_ttft_s" in ttft and scen.ttft_mean_s is not None:
        checks.append(
            EngineCheck(
                role,
                "all",
                window.total().engine,
                "mean TTFT (s)",
                ttft["mean_ttft_s"],
                scen.ttft_mean_s,
                "baseline" if role == "baseline" else None,
                "model_error" if role == "baseline" else None,
            )
        )
    if scen is not None and "p90_ttft_s" in ttft and scen.ttft_p90_s is not None:
        checks.append(
            EngineCheck(
                role,
                "all",
                window.total().engine,
                "p90 TTFT (s)",
                ttft["p90_ttft_s"],
                scen.ttft_p90_s,
                "main" if role == "candidate" else None,
                "p90_ttft_s" if role == "candidate" else None,
            )
        )
    return tuple(checks), criteria


@dataclass(frozen=True, slots=True)
class EngineMeasurement:
    """One role's engine window, its comparisons and the criterion values it gives."""

    role: str
    window: EngineWindow
    checks: tuple[EngineCheck, ...]
    criteria: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "role": self.role,
            "source": self.window.source,
            "kind": self.window.kind,
            "window_s": self.window.window_s,
            "instances": [i.name for i in self.window.instances],
            "ttft": {k: round(v, 6) for k, v in sorted(self.window.ttft_metrics().items())},
            "checks": [c.to_json() for c in self.checks],
        }

"""The explore stage's searches (analyzer.advisor.explore) on a log whose load decides
the size: what each flip replays, and that it replays what its row says."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from analyzer.advisor import Thresholds, run_analysis
from analyzer.advisor.explore import SIDE_INSTANCES_MULTIPLE, SLO_FACTORS
from analyzer.advisor.replay import LocalReplayer, Services
from analyzer.advisor.size import SizeQuestion, SizeSearch, start_after

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "make_logs", ROOT / "tests" / "fixtures" / "advisor" / "make_logs.py"
)
make_logs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_logs)


@dataclass(frozen=True, slots=True)
class Asked:
    question: SizeQuestion
    search: SizeSearch


class Recording(LocalReplayer):
    """A replayer that keeps every search it was asked, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[Asked] = []

    def size(self, searches):
        out = super().size(searches)
        for sr, s in zip(searches, out, strict=True):
            q = sr.question  # as it started: after its baseline, where that one ended
            if sr.after is not None:
                q = start_after(q, searches[sr.after].question, out[sr.after])
            self.asked.append(Asked(q, s))
        return out


@pytest.fixture(scope="module")
def busy(tmp_path_factory):
    """A log 4 instances of which serve at x1 but one does not at x2."""
    d = tmp_path_factory.mktemp("explore-logs")
    log = make_logs.high_reuse(d / "busy.jsonl", n=200, gap_s=0.04)
    opts = replace(
        make_logs.pooled_options(),
        sensitivity_replays=True,
        thresholds=Thresholds(min_requests=100),  # cost first: each plan is its search's
    )
    rec = Recording()
    r = run_analysis([str(log)], opts, services=Services(rec))
    return r, rec.asked


def test_the_load_flip_replays_twice_the_plans_load(busy):
    r, asked = busy
    plan_scale = r.plans[0].load.time_scale
    twice = [a for a in asked if a.question.time_scale == pytest.approx(plan_scale / 2)]
    assert {a.question.spec.name for a in twice} == {p.option for p in r.plans}
    for a in twice:
        plan = next(p for p in r.plans if p.option == a.question.spec.name)
        assert plan.instances is not None and a.search.instances is not None
        assert a.search.instances >= plan.instances
    # on this log twice the load needs more of some option than the plan
    assert any(
        a.search.instances > next(p.instances for p in r.plans if p.option == a.question.spec.name)
        for a in twice
    )
    row = next(f for f in r.flips if f.dimension == "load")
    assert f"{2 * r.plans[0].load.peak_rps:.3g} requests/s" in row.label


def test_each_search_starts_where_the_answer_probably_is(busy):
    """The plan's options start one below the baseline's answer; the load flip's
    searches replay no count below the plan's answer (more load never needs fewer);
    the looser SLO's none above it."""
    r, asked = busy
    plan_scale, slo = r.plans[0].load.time_scale, r.plans[0].ttft_slo_s
    own = [a for a in asked if a.question.time_scale == plan_scale and a.question.ttft_slo_s == slo]
    base = next(a for a in own if a.question.spec.name == "local")
    assert base.search.instances is not None
    for a in own[1:4]:
        assert a.question.start == max(1, base.search.instances - 1) and a.question.near
    answers = {a.question.spec.name: a.search.instances for a in own[:4]}
    for a in asked:
        q, found = a.question, answers[a.question.spec.name]
        assert found is not None
        if q.time_scale == pytest.approx(plan_scale / 2) or q.ttft_slo_s < slo:
            assert q.fails_to == found - 1
            assert all(p.instances >= found for p in a.search.probes)
        elif q.ttft_slo_s > slo:
            assert q.passes_at == found
            assert all(p.instances <= found for p in a.search.probes)


def test_the_plans_failing_runs_run_on_to_the_looser_slo_flip(busy):
    """The plan's searches are told the looser SLO its flip asks (their failing runs go on
    until they lose it too, so the flip takes them); no other question is."""
    r, asked = busy
    slo = r.plans[0].ttft_slo_s
    plan = asked[: len(r.plans)]
    assert [a.question.spec.name for a in plan] == [p.option for p in r.plans]
    assert all(a.question.stop_slo_s == pytest.approx(slo * max(SLO_FACTORS)) for a in plan)
    assert all(a.question.stop_slo_s is None for a in asked[len(r.plans) :])


def test_side_by_side_rows_search_within_the_cap_only(busy):
    """The plan looks above the cap for the size that would meet the SLO; a row for
    another GPU or model does not (each count above it costs more than the last)."""
    r, asked = busy
    here = (r.plans[0].gpu, r.plans[0].model)
    side = [a for a in asked if (a.question.cfg.gpu, a.question.cfg.model) != here]
    own = [a for a in asked if (a.question.cfg.gpu, a.question.cfg.model) == here]
    assert side and own
    assert all(a.question.beyond is None for a in side)
    assert all(a.question.beyond is not None and a.question.beyond > a.question.cap for a in own)
    verdict = next(f for f in r.fleets if f.option == (r.decision.scenario or "local"))
    assert verdict.instances is not None
    for a in side:
        assert all(p.instances <= a.question.cap for p in a.search.probes)
        # no further than SIDE_INSTANCES_MULTIPLE x the verdict's instances: no alternative
        assert a.question.cap <= SIDE_INSTANCES_MULTIPLE * verdict.instances
    rows = [o for c in r.side_by_side[1:] for o in dict(c.options).values()]
    assert rows and all(o.cap_gpus is not None for o in rows)


def test_side_floors_run_beside_the_baseline_and_are_not_replayed_again(tmp_path, monkeypatch):
    """With processes to spare (--jobs 2) the side-by-side rows' floors, which depend on
    no plan, go out in the plan's first batch; the explore stage's floors are the same
    questions and find them remembered: each floor is replayed once."""
    import analyzer.advisor.size as size_mod
    from analyzer.advisor.explore import _side_rows
    from analyzer.advisor.measure import measure
    from analyzer.advisor.price import price
    from analyzer.advisor.replay import compute_floor_s, replay

    log = make_logs.high_reuse(tmp_path / "busy.jsonl", n=200, gap_s=0.04)
    opts = replace(
        make_logs.pooled_options(),
        sensitivity_replays=True,
        thresholds=Thresholds(min_requests=100),
    )
    opts = replace(opts, ingest=replace(opts.ingest, jobs=2))
    # an SLO whose floors the side rows' compute bounds do not settle (bound in (SLO/2, SLO])
    m = measure([str(log)], opts)
    priced = price(m, m.choices, opts)
    replayed = replay(m, priced, opts, Services(), usable=True)
    bounds = [
        compute_floor_s(s, opts.warmup)
        for row in _side_rows(m, priced, replayed, opts)
        for s in row.priced.setups
    ]
    opts = replace(opts, ttft_slo_s=1.5 * max(bounds))

    floors: list[int] = []
    real = size_mod.probe

    def counted(trace, cfg, spec, **kw):
        if spec.name == "floor":
            floors.append(kw["instances"])
        return real(trace, cfg, spec, **kw)

    monkeypatch.setattr(size_mod, "probe", counted)

    class Batches(LocalReplayer):  # jobs 1: every search in this process, in order
        def __init__(self) -> None:
            super().__init__()
            self.batches: list[list[object]] = []

        def size(self, searches):
            self.batches.append([sr.only for sr in searches])
            return super().size(searches)

    rec = Batches()
    run_analysis([str(log)], opts, services=Services(rec))
    first = [n for n in rec.batches[0] if n is not None]
    assert first, "the side rows' floors went out with the plan's searches"
    assert len(floors) == len(first)  # replayed there, and never again

    # --jobs 1 (no process to spare): the plan's batch is the plan's alone, and the
    # floors are replayed, as many, in the explore stage
    floors.clear()
    rec = Batches()
    run_analysis(
        [str(log)], replace(opts, ingest=replace(opts.ingest, jobs=1)), services=Services(rec)
    )
    assert all(n is None for n in rec.batches[0])
    assert len(floors) == len(first)

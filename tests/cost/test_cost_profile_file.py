"""Profiles (analyzer/cost/profile_file.py): a fitted model round-trips through JSON,
byte for byte, and a malformed profile is an error naming the file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.cost import CostModel
from analyzer.cost import calibrate as cal
from analyzer.cost import profile_file as pf
from analyzer.errors import InputError, UsageError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "cost"


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel.from_catalog("llama-3.1-8b", "h100", mfu=0.5)  # the fixtures are roofline data


def test_profile_round_trip(cm, tmp_path):
    from dataclasses import replace

    pre = cal.fit_prefill(cm, cal.read_prefill_csv(FIX / "prefill_llama8b_h100.csv"))
    link = cal.fit_load(cal.read_load_csv(FIX / "load_rdma.csv"))
    fitted = replace(cm.with_prefill(pre), link=link)
    (tmp_path / "models").mkdir()  # outputs never create directories from scratch
    path = pf.save_profile(fitted, tmp_path / "models" / "mine.json")
    text = path.read_text()
    assert json.loads(text)["schema"] == "kvpool.cost-profile/1"
    again = pf.save_profile(fitted, tmp_path / "again.json").read_text()
    assert text == again  # deterministic bytes
    loaded = pf.load_profile(str(path))
    for s, p in ((512, 0), (4096, 8192), (8192, 16384)):
        assert loaded.prefill_time_s(s, p) == pytest.approx(fitted.prefill_time_s(s, p), rel=1e-12)
    assert loaded.link is not None and loaded.link.bandwidth_gbps == pytest.approx(
        link.bandwidth_gbps
    )
    assert loaded.range_warnings(new_tokens=50_000) != []
    r = loaded.ttft(8192, 4096, 1)  # bandwidth from the fitted link
    assert r.load_gbps == pytest.approx(link.bandwidth_gbps)
    with pytest.raises(UsageError, match="fitted for model"):
        pf.load_profile(path, model="llama-3.1-70b")
    with pytest.raises(UsageError, match="tp=1"):
        pf.load_profile(path, tp=2)


def test_bad_profiles(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match=r"bad\.json:1"):
        pf.load_profile(bad)
    bad.write_bytes(b"\xff\xfe{}")
    with pytest.raises(InputError, match="not UTF-8 JSON"):
        pf.load_profile(bad)
    with pytest.raises(InputError, match="cannot read profile"):
        pf.load_profile(tmp_path)  # a directory
    bad.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(InputError, match="not a kvpool cost profile"):
        pf.load_profile(bad)
    base = {"schema": pf.PROFILE_SCHEMA, "model": "llama-3.1-8b", "gpu": "h100", "tp": 1}
    bad.write_text(json.dumps({**base, "prefill": None, "load": None}))
    with pytest.raises(InputError, match="no fitted section"):
        pf.load_profile(bad)
    bad.write_text(json.dumps({**base, "load": {"bandwidth_gbps": "fast", "latency_s": 0}}))
    with pytest.raises(InputError, match="bandwidth_gbps"):
        pf.load_profile(bad)
    for field, value in (("tp", "eight"), ("mfu", "high"), ("kv_dtype", 8)):
        bad.write_text(
            json.dumps({**base, field: value, "load": {"bandwidth_gbps": 1, "latency_s": 0}})
        )
        with pytest.raises(InputError, match=field):
            pf.load_profile(bad)
    bad.write_text(
        json.dumps({**base, "load": {"bandwidth_gbps": 1, "latency_s": 0, "n_points": "x"}})
    )
    with pytest.raises(InputError, match="malformed profile section"):
        pf.load_profile(bad)
    bad.write_text(json.dumps({**base, "load": {"bandwidth_gbps": 0, "latency_s": 0}}))
    with pytest.raises(InputError, match="> 0"):
        pf.load_profile(bad)

"""One deployment behind every number: each option's plan (analyzer.advisor.plan) is what
the summary, report.json, report.md, the terminal, deploy/ and the dashboard's tables
say, and the plans answer the questions a platform engineer asks of them."""

from __future__ import annotations

import html
import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from analyzer.advisor.words import gpus, ms, option_name, usd
from analyzer.cli import app
from analyzer.report.document import ReportDocument
from analyzer.report.summary import economics_table

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "make_logs", ROOT / "tests" / "fixtures" / "advisor" / "make_logs.py"
)
make_logs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_logs)

# make_logs.pooled_options as flags: the pool pays here, so deploy/ holds a pool
POOLED_FLAGS = [
    "--local-capacity-tokens",
    "3000",
    "--dram-capacity-tokens",
    "3000",
    "--pool-capacity-tokens",
    "200000",
    "--gpus-per-node",
    "1",
    "--router",
    "round-robin",
    "--pool-gbps",
    "50",
    "--objective",
    "ttft",
]


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    log = make_logs.high_reuse(d / "high.jsonl")
    out = d / "report"
    res = CliRunner().invoke(app, ["analyze", str(log), "-o", str(out), *POOLED_FLAGS])
    assert res.exit_code == 0, res.output
    return json.loads((out / "report.json").read_text()), out, res.output


def _md_rows(md: str, header: str) -> dict[str, list[str]]:
    """The rows of the Markdown table whose header row starts with ``header``, by their
    first cell."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells
    return rows


@pytest.mark.slow
def test_every_output_gives_each_option_one_gpu_count_and_one_ttft(analysed):
    doc, out, terminal = analysed
    fleet, plans = doc["fleet"], doc["plans"]
    assert set(fleet) == {"local", "local+dram", "local+dram+nvme", "pooled"}
    md = (out / "report.md").read_text()
    money = _md_rows(md, "Option | GPUs")
    for option, f in fleet.items():
        mine = [p for p in plans if p["option"] == option]
        assert (
            f["gpus"] == sum(p["gpus"] for p in mine) == sum(p["instances"] * p["tp"] for p in mine)
        )
        assert f["nodes"] == sum(p["nodes"] for p in mine)
        # report.md's money table: the same GPUs, nodes and TTFT
        row = money[option_name(option)]
        t = f["ttft_s"]
        assert row[1:4] == [
            f"{f['gpus']:,}",
            f"{f['nodes']:,}",
            f"{ms(t['mean'])} / {ms(t['p90'])}",
        ]
        # the replay section is each option's replay at its planned size
        sc = doc["replay"]["scenarios"][option]
        assert sc["instances"] == f["instances"]
        assert sc["ttft_s"]["mean"] == t["mean"] and sc["ttft_s"]["p90"] == t["p90"]
        # the terminal prints the same row
        assert re.search(
            rf"{re.escape(option_name(option))}\s+{f['gpus']}\s+{f['nodes']}\s+"
            rf"{re.escape(ms(t['mean']))} / {re.escape(ms(t['p90']))}",
            terminal,
        ), option
    # the dashboard shows the report's own table (app/views/recommend.py)
    view = ReportDocument.load(out / "report.json").report
    _, rows = economics_table(view)
    assert {r[0]: r[1:4] for r in rows} == {
        k: v[1:4] for k, v in money.items() if k in {r[0] for r in rows}
    }
    # the summary: the verdict's plan, its GPUs and TTFT
    chosen = doc["verdict"]["scenario"]
    f = fleet[chosen]
    second = doc["summary"][1]
    assert f"on {gpus(f['gpus'])}" in second
    assert ms(f["ttft_s"]["mean"]) in second and ms(f["ttft_s"]["p90"]) in second
    # the sizing: the plan's instances and nodes
    plan = next(p for p in plans if p["option"] == chosen)
    assert (doc["sizing"]["instances"], doc["sizing"]["nodes"]) == (
        plan["instances"],
        plan["nodes"],
    )


def test_deploy_holds_the_plans_counts_and_per_node_sizes(analysed):
    doc, out, _ = analysed
    chosen = doc["verdict"]["scenario"]
    assert chosen == "pooled"
    plan = next(p for p in doc["plans"] if p["option"] == "pooled")
    k8s = list(
        yaml.safe_load_all(
            (out / "deploy/pooled/kubernetes/vllm-lmcache-mooncake.yaml")
            .read_text()
            .split("\n", 6)[-1]
        )
    )
    engines = next(
        d for d in k8s if d["kind"] == "Deployment" and d["metadata"]["name"] == "vllm-lmcache"
    )
    assert engines["spec"]["replicas"] == plan["instances"]
    launch = (out / "deploy/pooled/vllm-mooncake-store/launch.sh").read_text()
    assert f"# {plan['instances_per_node']} instance(s) on this node" in launch
    readme = (out / "deploy/README.md").read_text()
    n, k, nodes = plan["instances"], plan["instances_per_node"], plan["nodes"]
    assert (
        f"- `pooled`: {n} instance{'' if n == 1 else 's'} of {plan['tp']} GPU"
        f"{'' if plan['tp'] == 1 else 's'}, {k} per node, on {nodes} node{'' if nodes == 1 else 's'}."
        in readme
    )
    # every rank's segment adds up to the pool the plan replayed with
    mc = json.loads((out / "deploy/pooled/vllm-mooncake-store/mooncake.json").read_text())
    pool_bytes = plan["capacity"]["tokens"]["pool"] * plan["capacity"]["bytes_per_token"]
    ranks = plan["instances"] * plan["tp"]
    assert mc["global_segment_size"] * ranks == pytest.approx(pool_bytes, rel=1e-6)
    # the runner-up written beside it is the one the report names
    runner = {f["option"] for f in doc["deploy"]["files"] if f["role"] == "runner-up"}
    assert len(runner) <= 1


def test_every_output_gives_each_option_the_plans_money_and_the_gates_its_ttft(analysed):
    """Money, the pilot gates and deploy/ read the same plans: each option's GPU cost,
    added cost and total in report.json, report.md, report.html and the terminal are its
    plans' summed money; the summary's amounts are the chosen and baseline fleets'; the
    main gate projects the chosen plan's p90 TTFT and GPU saving, the baseline gate the
    baseline plan's mean TTFT; deploy/README.md describes every option it writes as its
    plan."""
    doc, out, terminal = analysed
    fleet, plans = doc["fleet"], doc["plans"]
    md = (out / "report.md").read_text()
    page = html.unescape((out / "report.html").read_text())
    money = _md_rows(md, "Option | GPUs")
    for option, f in fleet.items():
        mine = [p for p in plans if p["option"] == option]
        m = f["money"]
        for key in ("gpu_usd_month", "added_usd_month", "total_usd_month", "dram_gb", "nvme_tb"):
            assert m[key] == pytest.approx(sum(p["money"][key] for p in mine)), (option, key)
        assert m["nic_nodes"] == sum(p["money"]["nic_nodes"] for p in mine)
        row = money[option_name(option)]
        assert row[4] == usd(m["gpu_usd_month"]) and row[6] == usd(m["total_usd_month"])
        assert row[5].startswith(f"{usd(m['added_usd_month'])} ({m['dram_gb']:,.0f} GB DRAM")
        # report.html shows the same row, cell for cell
        assert "<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" in page, option
        # the terminal's total
        assert re.search(
            rf"{re.escape(option_name(option))}\s+{f['gpus']}\s+{f['nodes']}\s+\S+ ms / \S+ ms\s+"
            rf"{re.escape(usd(m['total_usd_month']))}",
            terminal,
        ), option
    chosen, base = fleet[doc["verdict"]["scenario"]], fleet["local"]
    second = doc["summary"][1]
    assert f"{usd(chosen['money']['total_usd_month'])} per month" in second
    assert f"{usd(base['money']['total_usd_month'])} per month" in second
    gates = {g["id"]: g for g in doc["gates"]["plan"]}
    main = gates["main"]["projected"]
    assert main["p90_ttft_s"] == chosen["ttft_s"]["p90"]
    assert main["throughput_gain"] == pytest.approx(base["gpus"] / chosen["gpus"] - 1.0)
    # report.json keeps 6 decimals, of the reduction and of each mean it is taken from
    assert main["ttft_reduction"] == pytest.approx(
        1.0 - chosen["ttft_s"]["mean"] / base["ttft_s"]["mean"], abs=1e-6 / base["ttft_s"]["mean"]
    )
    assert gates["baseline"]["projected"]["mean_ttft_s"] == base["ttft_s"]["mean"]
    # deploy/README.md: each option written, as its plan
    deployed = {
        "prefix-cache-only": "local",
        "local-offload": "local+dram",
        "local-offload-nvme": "local+dram+nvme",
        "pooled": "pooled",
    }
    written = {f["option"] for f in doc["deploy"]["files"] if f["role"] != "index"}
    assert len(written) == 2  # the recommended option and the runner-up
    readme = (out / "deploy/README.md").read_text()
    # named as every other output names the option, beside its folder
    assert f"Recommended option: **{option_name(doc['verdict']['scenario'])}** (`" in readme
    for name in written:
        plan = next(p for p in plans if p["option"] == deployed[name])
        n, k, nodes, tp = plan["instances"], plan["instances_per_node"], plan["nodes"], plan["tp"]
        assert (
            f"- `{name}`: {n} instance{'' if n == 1 else 's'} of {tp} GPU{'' if tp == 1 else 's'}, "
            f"{k} per node, on {nodes} node{'' if nodes == 1 else 's'}." in readme
        ), name
    # the sizing's per-instance and per-node sizes are the chosen plan's
    plan = next(p for p in plans if p["option"] == doc["verdict"]["scenario"])
    sz, cap = doc["sizing"], plan["capacity"]["tokens"]
    assert sz["hbm_cache_per_instance_tokens"] == cap["hbm_per_instance"]
    assert sz["instances_per_node"] == plan["instances_per_node"]
    assert sz["pool_capacity_tokens"] == cap["pool"]
    # a count agrees with its noun in every output (this plan is of 1 GPU on 1 node)
    for text in (md, page, terminal, readme):
        assert not re.search(r"\b1 (GPUs|nodes|instances|models)\b", text)


def _mooncake(shared_traces) -> str:
    return str(shared_traces / "mooncake" / "conversation_trace.jsonl")


@pytest.mark.slow
def test_the_mooncake_baseline_plan_replayed_at_its_size_meets_the_slo(shared_traces, tmp_path):
    """The issue's first check: behind a prefix-aware router, the baseline's planned
    instances, replayed by `kvpool replay --instances N` at the log's own rate, keep p90
    TTFT within the SLO; the summary, report.json, report.md and deploy/ give one GPU
    count per option."""
    out = tmp_path / "r"
    flags = ["--instances", "8", "--gpus-per-node", "1", "--router", "prefix-aware"]
    res = CliRunner().invoke(
        app, ["analyze", _mooncake(shared_traces), "-o", str(out), *flags, "--jobs", "2"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "report.json").read_text())
    base = doc["fleet"]["local"]
    assert base["status"] == "meets-slo"
    n = base["instances"]
    rep = CliRunner().invoke(
        app,
        [
            "replay",
            _mooncake(shared_traces),
            "--instances",
            str(n),
            "--gpus-per-node",
            "1",
            "--scenarios",
            "local",
            "--no-search",
            "--json",
            str(tmp_path / "replay.json"),
        ],
    )
    assert rep.exit_code == 0, rep.output
    replayed = json.loads((tmp_path / "replay.json").read_text())
    assert replayed["cluster"]["instances"] == n
    assert replayed["scenarios"]["local"]["ttft_s"]["p90"] <= doc["options"]["ttft_slo_s"]
    md = (out / "report.md").read_text()
    money = _md_rows(md, "Option | GPUs")
    for option, f in doc["fleet"].items():
        if f["gpus"] is not None:
            assert money[option_name(option)][1] == f"{f['gpus']:,}"
    # the coarse timestamps are reported with their effect
    assert doc["arrivals"]["coarse"] is True
    assert "timestamps are coarse, or its requests come in bursts" in md


@pytest.mark.slow
def test_an_slo_no_request_can_meet_is_an_answer(shared_traces, tmp_path):
    out = tmp_path / "r"
    res = CliRunner().invoke(
        app,
        [
            "analyze",
            _mooncake(shared_traces),
            "-o",
            str(out),
            "--instances",
            "8",
            "--gpus-per-node",
            "1",
            "--ttft-slo",
            "0.2",
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "report.json").read_text())
    v = doc["verdict"]
    assert v["verdict"] == "cannot-meet-slo" and v["scenario"] is None
    assert v["confidence"] != "high"
    assert any("No deployment meets the p90 TTFT SLO of 200 ms" in r for r in v["reasons"])
    assert any("No tier is recommended" in r for r in v["reasons"])
    assert [f["path"] for f in doc["deploy"]["files"]] == ["deploy/README.md"]
    assert "no tier is recommended" in doc["summary"][0]
    # every request's own prefill misses it: no size would, and the summary says which SLO can
    floor = doc["fleet"]["local"]["floor_p90_s"]
    assert doc["fleet"]["local"]["status"] == "prefill-bound"
    assert "SLO of 200 ms at any size" in doc["summary"][0]
    assert f"a p90 TTFT SLO of at least {ms(floor)}" in doc["summary"][2]
    # deploy/ and the gates say the same: nothing to deploy or pilot at any size
    readme = (out / "deploy" / "README.md").read_text()
    assert "No option meets the TTFT SLO at any size, so nothing is deployed" in readme
    assert f"(p90 {ms(floor)})" in readme
    assert "there is no candidate deployment to pilot yet" in (out / "report.md").read_text()


@pytest.mark.slow
def test_the_mixed_sample_plans_all_five_models(tmp_path):
    out = tmp_path / "r"
    res = CliRunner().invoke(
        app, ["analyze", str(ROOT / "traces" / "mixed.jsonl.zst"), "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "report.json").read_text())
    chosen = doc["verdict"]["scenario"] or "local"
    plans = [p for p in doc["plans"] if p["option"] == chosen]
    assert len({p["served_as"] for p in plans}) == 5
    assert doc["fleet"][chosen]["instances"] >= 5
    tp = {p["model"]: p["tp"] for p in plans}
    assert tp["qwen3-coder-480b-a35b"] >= 8  # never one 80 GB GPU for a 480B MoE
    assert "5 models" in doc["summary"][1]
    # each model's GPUs, the most first, and the nodes they fill together
    by_gpus = sorted(plans, key=lambda p: -p["gpus"])
    listed = ", ".join(f"{p['model']} on {gpus(p['gpus'])}" for p in by_gpus[:-1])
    assert (
        f"{listed} and {by_gpus[-1]['model']} on {gpus(by_gpus[-1]['gpus'])}" in doc["summary"][1]
    )
    nodes = doc["fleet"][chosen]["nodes"]
    assert f"5 models on {nodes} node" in doc["summary"][1]
    # the sizing describes the most requested model's plan, and says so
    md = (out / "report.md").read_text()
    assert f"The plan behind every figure of {plans[0]['model']}, the most requested" in md


@pytest.mark.slow
def test_a_pool_link_beyond_the_gpus_share_of_the_network_is_said(tmp_path):
    """The catalog's NIC price is $0: each GPU's price carries 400 Gb/s of its 8-GPU
    instance's network. A pool link beyond the share of a node's GPUs is a warning on
    stderr, in whole sentences, and in report.json; one within it is not."""
    log = make_logs.low_reuse(tmp_path / "low.jsonl")
    warned = []
    for gbps in ("40", "80"):
        out = tmp_path / gbps
        res = CliRunner().invoke(
            app,
            [
                "analyze",
                str(log),
                "-o",
                str(out),
                "--gpus-per-node",
                "1",
                "--pool-gbps",
                gbps,
                "--no-size-search",
            ],
        )
        assert res.exit_code == 0, res.output
        doc = json.loads((out / "report.json").read_text())
        warned.append([w for w in doc["warnings"] if "--nic-node-month-usd" in w])
    assert warned[0] == []
    assert warned[1] == [
        "The pool link of 80 GB/s per node is more than the 50 GB/s of network the GPU price "
        "includes for 1 GPU (400 Gb/s per GPU of an 8-GPU instance), yet its NICs are priced "
        "at $0: give --nic-node-month-usd."
    ]


@pytest.mark.slow
def test_a_gpu_named_as_its_vendor_does_is_priced(tmp_path):
    log = make_logs.low_reuse(tmp_path / "low.jsonl")
    res = CliRunner().invoke(
        app,
        ["analyze", str(log), "-o", str(tmp_path / "r"), "--gpu", "H100-SXM", "--no-size-search"],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    gpu = next(p for p in doc["economics"]["prices"] if p["what"].startswith("GPU"))
    assert gpu["usd"] == pytest.approx(3.99) and gpu["what"] == "GPU (h100)"


@pytest.mark.slow
def test_the_dashboard_shows_the_plans_that_analyze_writes(tmp_path, monkeypatch):
    """The Recommendation page, at its default controls, shows each option's GPUs, nodes
    and TTFT as `kvpool analyze` of the same log writes them in report.json, and opens
    with the same summary."""
    from streamlit.testing.v1 import AppTest

    from app.command import ENV_INPUT

    log = make_logs.high_reuse(tmp_path / "high.jsonl")
    out = tmp_path / "r"
    res = CliRunner().invoke(app, ["analyze", str(log), "-o", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "report.json").read_text())

    from app import prefetch

    monkeypatch.setattr(prefetch, "DRAW_S", 0.0)
    monkeypatch.setenv(ENV_INPUT, str(log))
    at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=300)
    at.run()
    at.switch_page("views/recommend.py").run()
    assert not at.exception, [e.message for e in at.exception]
    shown = next(t.value for t in at.table if {"Option", "GPUs", "Nodes"} <= set(t.value.columns))
    rows = {r["Option"]: r for r in shown.to_dict("records")}
    assert set(rows) == {option_name(o) for o in doc["fleet"]}
    sized = {o: f for o, f in doc["fleet"].items() if f["gpus"] is not None}
    assert sized, doc["fleet"]
    for option, f in sized.items():
        row = rows[option_name(option)]
        assert row["GPUs"] == f"{f['gpus']:,}" and row["Nodes"] == f"{f['nodes']:,}"
        t = f["ttft_s"]
        assert row["Mean / p90 TTFT"] == f"{ms(t['mean'])} / {ms(t['p90'])}"
    banner = next(m.value for m in at.markdown if not m.value.startswith("<style>"))
    assert all(_words(s) in _words(banner) for s in doc["summary"][:2])


def _words(text: str) -> str:
    """Text without markup and with runs of blank space as one space."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>|\*\*", " ", text)).split())

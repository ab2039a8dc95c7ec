"""The deployment bundle: one sizing record split per process the way each product
allocates it, emitted files that parse and that the products' own loaders (or the
schemas written from their source, where the loader needs a GPU stack) accept, and the
report that links them."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from analyzer.advisor import run_analysis
from analyzer.advisor.deploy import bundle, deploy_sizings
from analyzer.advisor.figures import DeployOption
from analyzer.advisor.products import DOCS_CHECKED, NODE_IP
from analyzer.advisor.served import ServedModel
from analyzer.advisor.sizing import GB, GIB, ClusterFigures, size, unit_sizes
from analyzer.cli import app
from analyzer.report import ReportDocument, write_reports
from tests.helpers.advisor import deploy_sizing

ROOT = Path(__file__).resolve().parents[2]
_lspec = importlib.util.spec_from_file_location(
    "product_loaders", ROOT / "tests" / "helpers" / "product_loaders.py"
)
L = importlib.util.module_from_spec(_lspec)
_lspec.loader.exec_module(L)
_spec = importlib.util.spec_from_file_location(
    "make_logs", ROOT / "tests" / "fixtures" / "advisor" / "make_logs.py"
)
make_logs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_logs)


def _files(sizings, rec):
    return {
        f.path: f
        for f in bundle(sizings, rec, model=ServedModel(repo="meta-llama/Llama-3.1-8B-Instruct"))
    }


def _node(text: str) -> str:
    return text.replace(NODE_IP, "10.0.0.7")


# -- one sizing record, multiplied back ------------------------------------------------


@settings(max_examples=120, deadline=None)
@given(
    instances=st.integers(1, 64),
    tp=st.sampled_from([1, 2, 4, 8]),
    gpus_per_node=st.sampled_from([1, 2, 4, 8]),
    knee=st.integers(1, 50_000_000),
    bpt=st.sampled_from([16384, 131072, 327680]),
)
def test_every_per_unit_size_multiplies_back_to_the_sized_totals(
    instances, tp, gpus_per_node, knee, bpt
):
    tp = min(tp, gpus_per_node)
    for pool, mode in ((True, "pooled"), (False, "local-offload")):
        sz = deploy_sizing(
            pool, instances=instances, tp=tp, gpus_per_node=gpus_per_node, knee=knee, bpt=bpt
        )
        target = sz.pool_bytes if pool else sz.dram_per_node_bytes * sz.nodes
        node_target = sz.dram_per_node_bytes
        units = unit_sizes(sz, mode)
        assert units
        for u in units:
            assert u.total_bytes == target
            # The exact share, rounded up to a byte, gives the total back within 1%.
            assert u.bytes_per_unit * u.units == pytest.approx(target, rel=0.01, abs=u.units)
            # What the files carry differs only by the product's own step (whole GB for
            # SGLang's --hicache-size), never by more.
            assert (
                0
                <= u.written_bytes * u.units - target
                <= u.units * max(u.granularity_bytes, 1) + max(1, target // 100)
            )
            if instances % sz.instances_per_node == 0 and u.unit != "node":
                # A full node's processes hold the node's sized DRAM (which is rounded
                # up to a whole token).
                assert u.bytes_per_unit * u.units_per_node == pytest.approx(
                    node_target, rel=0.01, abs=u.units_per_node + sz.bytes_per_token
                )


def test_segments_are_per_rank_not_per_node():
    # 8 ranks per node (tp 1) on 2 nodes: dividing the pool by nodes would deploy 8x.
    sz = deploy_sizing(True, instances=16, gpus_per_node=8)
    by = {u.key: u for u in unit_sizes(sz, "pooled")}
    assert sz.nodes == 2 and sz.ranks == 16 and sz.ranks_per_node == 8
    assert by["vllm-mooncake-embedded"].bytes_per_unit == -(-sz.pool_bytes // 16)
    assert by["mooncake-standalone"].bytes_per_unit == -(-sz.pool_bytes // 2)
    assert by["sglang-mooncake"].bytes_per_unit == -(-sz.pool_bytes // 16)
    tp2 = deploy_sizing(True, instances=8, tp=2, gpus_per_node=8)
    by2 = {u.key: u for u in unit_sizes(tp2, "pooled")}
    # LMCache and vLLM's connector run per rank; SGLang takes the size per server and
    # divides it over the server's tp ranks itself.
    assert by2["lmcache-mooncake"].units == 16 and by2["sglang-mooncake"].units == 8
    local = deploy_sizing(False, instances=8, tp=2, gpus_per_node=8)
    lby = {u.key: u for u in unit_sizes(local, "local-offload")}
    assert lby["vllm-offloading"].bytes_per_unit == -(-local.dram_per_node_bytes // 4)
    assert lby["lmcache-cpu"].bytes_per_unit == -(-local.dram_per_node_bytes // 8)
    assert lby["lmcache-cpu"].bytes_per_unit == pytest.approx(local.dram_per_rank_bytes, abs=1)


def test_uneven_nodes_size_the_fullest_node():
    sz = deploy_sizing(True, instances=10, gpus_per_node=8)
    assert sz.nodes == 2
    # 8 of the 10 ranks sit on the first node: it holds 80% of the pool.
    assert sz.dram_per_node_tokens == -(-2_000_000 * 8 // 10)


# -- the emitted files, read back by the products' loaders ------------------------------


@pytest.fixture(scope="module")
def pooled_files():
    sizings = deploy_sizings(deploy_sizing(True), "deploy-pooled", lambda p: deploy_sizing(p))
    assert list(sizings) == ["pooled", "local-offload"]
    return sizings, _files(sizings, "pooled")


def test_mooncake_json_loads_with_mooncakes_own_loader(pooled_files, tmp_path):
    sizings, files = pooled_files
    MooncakeConfig = L.mooncake_config()
    text = _node(files["deploy/pooled/vllm-mooncake-store/mooncake.json"].text)
    p = tmp_path / "mooncake.json"
    p.write_text(text)
    cfg = MooncakeConfig.from_file(str(p))
    sz = sizings["pooled"]
    assert cfg.global_segment_size * sz.ranks == pytest.approx(sz.pool_bytes, rel=0.01)
    assert cfg.local_hostname == "10.0.0.7" and cfg.master_server_address
    for key in ("local_hostname", "metadata_server", "master_server_address"):
        raw = json.loads(text)
        del raw[key]
        p.write_text(json.dumps(raw))
        with pytest.raises(ValueError, match=key):
            MooncakeConfig.from_file(str(p))


def test_mooncake_json_passes_vllms_store_config_schema(pooled_files):
    sizings, files = pooled_files
    raw = json.loads(files["deploy/pooled/vllm-mooncake-store/mooncake.json"].text)
    got = L.check_vllm_mooncake_store(raw)
    sz = sizings["pooled"]
    assert got["mode"] == "embedded"
    assert got["global_segment_size"] * sz.ranks == pytest.approx(sz.pool_bytes, rel=0.01)
    for key in ("metadata_server", "master_server_address", "global_segment_size"):
        broken = dict(raw)
        if key == "global_segment_size":
            broken[key] = 0  # embedded mode needs a segment
        else:
            del broken[key]
        with pytest.raises(L.SchemaError):
            L.check_vllm_mooncake_store(broken)
    # The launch script points vLLM at the file (the wiring the issue found missing).
    launch = files["deploy/pooled/vllm-mooncake-store/launch.sh"].text
    assert "MOONCAKE_CONFIG_PATH=" in launch and "MooncakeStoreConnector" in launch


def test_lmcache_yaml_loads_with_lmcaches_own_loader(pooled_files, tmp_path):
    sizings, files = pooled_files
    Cfg = L.lmcache_engine_config()
    MooncakeConfig = L.mooncake_config()
    text = _node(files["deploy/pooled/vllm-lmcache-mooncake/lmcache.yaml"].text)
    p = tmp_path / "lmcache.yaml"
    p.write_text(text)
    cfg = Cfg.from_file(str(p))
    cfg.validate()
    sz = sizings["pooled"]
    assert cfg.remote_url == "mooncakestore://mooncake-master:50051/"
    assert cfg.local_cpu is False and cfg.chunk_size == sz.chunk_size_tokens
    seg = cfg.extra_config["global_segment_size"]
    assert seg * sz.ranks == pytest.approx(sz.pool_bytes, rel=0.01)
    # LMCache forwards these keys to Mooncake's setup(): Mooncake's own config accepts
    # them, and LMCache 0.3.9 reads three of them without a default.
    extra = cfg.extra_config
    L.check_lmcache_039_mooncake(extra)
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    assert MooncakeConfig.from_file(str(tmp_path / "extra.json")).global_segment_size == seg
    for key in L.LMCACHE_039_MOONCAKE["required"]:
        raw = yaml.safe_load(text)
        del raw["extra_config"][key]
        p.write_text(yaml.safe_dump(raw))
        dropped = Cfg.from_file(str(p)).extra_config
        with pytest.raises(L.SchemaError, match=key):
            L.check_lmcache_039_mooncake(dropped)
        (tmp_path / "extra.json").write_text(json.dumps(dropped))
        with pytest.raises(ValueError, match=key):
            MooncakeConfig.from_file(str(tmp_path / "extra.json"))


def test_local_lmcache_size_is_gib_per_rank(tmp_path):
    sz = deploy_sizing(False, instances=8, tp=2, gpus_per_node=8)
    files = _files({"local-offload": sz}, "local-offload")
    p = tmp_path / "lmcache.yaml"
    p.write_text(files["deploy/local-offload/vllm-lmcache-cpu/lmcache.yaml"].text)
    cfg = L.lmcache_engine_config().from_file(str(p))
    cfg.validate()
    # LMCache allocates max_local_cpu_size * 2^30 bytes in each rank's engine.
    per_rank = cfg.max_local_cpu_size * GIB
    assert per_rank * sz.ranks_per_node == pytest.approx(sz.dram_per_node_bytes, rel=0.01)
    assert cfg.local_cpu is True and cfg.remote_url is None


def test_kubernetes_form_parses_and_its_env_loads_in_lmcache(pooled_files, monkeypatch):
    sizings, files = pooled_files
    docs = list(
        yaml.safe_load_all(files["deploy/pooled/kubernetes/vllm-lmcache-mooncake.yaml"].text)
    )
    kinds = [d["kind"] for d in docs]
    assert kinds == ["ConfigMap", "Deployment", "Service", "Deployment"]
    cm = docs[0]["data"]
    vllm = docs[3]["spec"]["template"]["spec"]["containers"][0]
    assert docs[3]["spec"]["replicas"] == sizings["pooled"].instances
    env = {e["name"]: e for e in vllm["env"]}
    assert [e["name"] for e in vllm["env"]].index("POD_IP") < [
        e["name"] for e in vllm["env"]
    ].index("LMCACHE_EXTRA_CONFIG")  # $(POD_IP) expands only from earlier variables
    Cfg = L.lmcache_engine_config()
    for k in list(os.environ):
        if k.startswith("LMCACHE_"):
            monkeypatch.delenv(k)
    for k, v in cm.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv(
        "LMCACHE_EXTRA_CONFIG",
        env["LMCACHE_EXTRA_CONFIG"]["value"].replace("$(POD_IP)", "10.1.2.3"),
    )
    cfg = Cfg.from_env()
    assert cfg.extra_config["local_hostname"] == "10.1.2.3"
    assert cfg.remote_url.startswith("mooncakestore://")
    L.check_lmcache_039_mooncake(cfg.extra_config)


def test_sglang_flags_parse_with_sglangs_own_parser(pooled_files):
    sizings, files = pooled_files
    parser = L.sglang_parser()
    launch = files["deploy/pooled/sglang-hicache-mooncake/launch.sh"].text
    extra_text = files["deploy/pooled/sglang-hicache-mooncake/hicache-mooncake.json"].text
    argv = _sglang_argv(launch, extra_text)
    ns, _rest = parser.parse_known_args(argv)
    assert ns.enable_hierarchical_cache is True
    assert isinstance(ns.hicache_size, int) and ns.hicache_size >= 1
    assert ns.hicache_storage_backend == "mooncake"
    extra = json.loads(ns.hicache_storage_backend_extra_config)
    seg = L.check_sglang_mooncake(extra)["global_segment_size"]
    sz = sizings["pooled"]
    assert seg * sz.instances == pytest.approx(sz.pool_bytes, rel=0.01)
    assert "MOONCAKE_LOCAL_HOSTNAME" in launch
    del extra["master_server_address"]
    with pytest.raises(L.SchemaError, match="master_server_address"):
        L.check_sglang_mooncake(extra)
    # A fractional --hicache-size is refused by SGLang's own parser.
    with pytest.raises(Exception):  # noqa: B017 - argparse raises ArgumentError
        parser.parse_known_args(["--hicache-size", "2.5"])


def _sglang_argv(launch: str, extra_text: str) -> list[str]:
    body = launch.split("python -m sglang.launch_server", 1)[1].split(" &\n", 1)[0]
    body = body.replace("\\\n", " ").replace(
        '"$(cat hicache-mooncake.json)"', shlex.quote(extra_text)
    )
    body = re.sub(r"\$\(\([^)]*\)\)", "30000", body)
    return shlex.split(body)[2:]  # drop --model-path MODEL


def test_local_offload_files_pass_the_products_checks(tmp_path):
    sz = deploy_sizing(False, instances=8, tp=2, gpus_per_node=8)
    files = _files({"local-offload": sz}, "local-offload")
    launch = files["deploy/local-offload/vllm-offloading/launch.sh"].text
    kv = json.loads(re.search(r"--kv-transfer-config '([^']*)'", launch).group(1))
    got = L.check_vllm_offloading(kv, engine_block=16)
    assert got["cpu_bytes_to_use"] * sz.instances_per_node == pytest.approx(
        sz.dram_per_node_bytes, rel=0.01
    )
    kv["kv_connector_extra_config"].pop("cpu_bytes_to_use")
    with pytest.raises(L.SchemaError, match="cpu_bytes_to_use"):
        L.check_vllm_offloading(kv, engine_block=16)
    sgl = files["deploy/local-offload/sglang-hicache/launch.sh"].text
    hicache = int(re.search(r"--hicache-size (\d+)", sgl).group(1))
    # Whole GB per rank, rounded up: never less than the sized DRAM.
    assert hicache * GB * sz.ranks_per_node >= sz.dram_per_node_bytes
    assert (hicache - 1) * GB * sz.ranks_per_node < sz.dram_per_node_bytes


def test_every_file_parses_and_names_the_versions_checked(pooled_files, tmp_path):
    _sizings, files = pooled_files
    versions = [d["version"] for d in DOCS_CHECKED]
    for path, f in files.items():
        assert any(v in f.text for v in versions) or f.kind == "markdown", path
        if f.kind == "json":
            assert json.loads(f.text)["_checked_against"] == f.checked
        elif f.kind == "yaml":
            list(yaml.safe_load_all(f.text))
        elif f.kind in ("bash", "env"):
            script = tmp_path / "x.sh"
            script.write_text(f.text)
            subprocess.run(["bash", "-n", str(script)], check=True)


# -- end to end: a deploy-pooled analysis on 4 nodes ------------------------------------


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    d = tmp_path_factory.mktemp("deploy")
    log = make_logs.high_reuse(d / "high.jsonl.gz")
    r = run_analysis([str(log)], make_logs.pooled_options())
    out = d / "report"
    paths = write_reports(ReportDocument.of(r), out)
    return r, out, paths


@pytest.mark.slow
def test_deploy_pooled_writes_the_plans_own_bundle_whose_segments_add_up(analysed):
    r, out, paths = analysed
    plan = next(p for p in r.plans if p.option == "pooled")
    assert r.verdict == "deploy-pooled"
    # the bundle deploys the plan: its instances, nodes and pool, as replayed
    assert (r.sizing.instances, r.sizing.nodes) == (plan.instances, plan.nodes)
    assert r.sizing.pool_capacity_tokens == plan.capacities.pool
    assert paths["deploy"] == out / "deploy"
    pool = r.sizing.pool_bytes
    mc = json.loads((out / "deploy/pooled/vllm-mooncake-store/mooncake.json").read_text())
    lm = yaml.safe_load((out / "deploy/pooled/vllm-lmcache-mooncake/lmcache.yaml").read_text())
    sg = json.loads(
        (out / "deploy/pooled/sglang-hicache-mooncake/hicache-mooncake.json").read_text()
    )
    ranks, servers = r.sizing.ranks, r.sizing.instances
    assert mc["global_segment_size"] * ranks == pytest.approx(pool, rel=0.01)
    assert lm["extra_config"]["global_segment_size"] * ranks == pytest.approx(pool, rel=0.01)
    assert sg["global_segment_size"] * servers == pytest.approx(pool, rel=0.01)
    assert pool == plan.capacities.pool * r.sizing.bytes_per_token
    launch = out / "deploy/pooled/vllm-mooncake-store/launch.sh"
    assert os.access(launch, os.X_OK)
    # The runner-up the summary names is written beside it, and nothing else.
    second = {
        "local+dram": "local-offload",
        "local+dram+nvme": "local-offload-nvme",
        "local": "prefix-cache-only",
    }
    folders = {f.path.split("/")[1] for f in r.deploy if f.role != "index"}
    assert folders == {"pooled", second[r.runner_up]}
    readme = (out / "deploy/README.md").read_text()
    assert "Start order for the pooled option" in readme


def test_a_pool_over_four_nodes_adds_up_per_rank_and_per_server():
    from analyzer.advisor.deploy import bundle

    sz = size(
        pool=True,
        knee_tokens=2_000_000,
        cluster=ClusterFigures(
            instances=8,
            tp=2,
            gpus_per_node=4,
            hbm_cache_tokens_per_instance=400_000,
            bytes_per_token=131072,
        ),
        break_even_short_gbps=6.0,
        replay_pool_read_gbps_per_node=3.0,
        network_tiers=[("rdma-200", 21.75)],
        granularity={},
        engine_block=16,
        same_session_share=0.1,
        sessions_known=True,
        policy_at_knee={},
    )
    assert sz.nodes == 4 and sz.ranks == 16
    files = {
        f.path: f.text
        for f in bundle({DeployOption.POOLED: sz}, DeployOption.POOLED, model=ServedModel(repo="m"))
    }
    mc = json.loads(files["deploy/pooled/vllm-mooncake-store/mooncake.json"])
    assert mc["global_segment_size"] * sz.ranks == pytest.approx(sz.pool_bytes, rel=0.001)
    # no runner-up given: the README names none and gives no local-offload start order
    assert "Runner-up" not in files["deploy/README.md"]


def test_report_links_every_deploy_file_and_gives_the_pilot_commands(analysed):
    r, out, _ = analysed
    doc = json.loads((out / "report.json").read_text())
    listed = [f["path"] for f in doc["deploy"]["files"]]
    on_disk = sorted(str(p.relative_to(out)) for p in (out / "deploy").rglob("*") if p.is_file())
    assert sorted(listed) == on_disk
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    for path in listed:
        assert f"]({path})" in md and f'href="{path}"' in html
    cmds = {c["tool"]: c["command"] for c in doc["pilot"]["commands"]}
    assert "--custom-dataset-type mooncake_trace" in cmds["AIPerf"]
    assert "--input-file pilot-trace.jsonl" in cmds["AIPerf"]
    assert f"--benchmark-duration {int(-(-r.trace.duration_s // 1))}" in cmds["AIPerf"]
    assert (
        "--dataset-name mooncake --dataset-path pilot-trace.jsonl" in cmds["SGLang bench_serving"]
    )
    rate = r.trace.n_requests / r.trace.duration_s
    assert f"--request-rate {rate:.4g}" in cmds["vLLM bench serve"]
    # inputs are named input-N unless --keep-names (the report is made to be shared)
    assert cmds["kvpool"].startswith("kvpool convert input-1 --to mooncake")
    assert "```bash" in md and "Pilot commands" in md


@pytest.mark.slow
def test_cli_analyze_writes_deploy_and_reruns_replace_it(tmp_path):
    log = make_logs.high_reuse(tmp_path / "high.jsonl.gz")
    out = tmp_path / "rep"
    (out / "deploy" / "stale").mkdir(parents=True)
    (out / "deploy" / "stale" / "old.sh").write_text("echo old\n")
    args = [
        "analyze",
        str(log),
        "-o",
        str(out),
        "--force",  # a rerun into the same directory (without it: rep-2)
        "--pool-gbps",
        "50",
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
        "--no-rate-search",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert (out / "deploy" / "README.md").is_file()
    assert not (out / "deploy" / "stale").exists()  # one analysis's files, not a mix
    assert not (out / ".deploy.tmp").exists()


def test_unusable_logs_write_no_bundle(tmp_path):
    sz = replace(deploy_sizing(False), dram_per_node_tokens=0)
    sizings = deploy_sizings(sz, "not-worth-it", lambda p: deploy_sizing(p))
    assert next(iter(sizings)) == "prefix-cache-only"
    files = _files(sizings, "prefix-cache-only")
    assert "deploy/prefix-cache-only/vllm/launch.sh" in files


# -- the pilot export ---------------------------------------------------------------------


def _chat(ts: float, session: str | None, turns: list[str]) -> str:
    msgs = []
    for i, t in enumerate(turns):
        msgs.append({"role": "user", "content": t})
        if i < len(turns) - 1:
            msgs.append({"role": "assistant", "content": "ok " * 5})
    rec: dict = {"timestamp": ts, "messages": msgs}
    if session is not None:
        rec["session_id"] = session
    return json.dumps(rec)


def test_mooncake_export_keeps_sessions_and_aiperfs_schema_accepts_it(tmp_path):
    words = " ".join(f"w{i}" for i in range(700))  # more than one 512-token block
    log = tmp_path / "chat.jsonl"
    log.write_text(
        "\n".join(
            [
                _chat(100.0, "alice@example.com", [words]),
                _chat(101.5, "bob", [words + " other"]),
                _chat(103.0, "alice@example.com", [words, "and more"]),
                _chat(104.0, None, ["no session here"]),
                _chat(107.25, "alice@example.com", [words, "and more", "third"]),
            ]
        )
        + "\n"
    )
    out = tmp_path / "pilot.jsonl"
    res = CliRunner().invoke(app, ["convert", str(log), "--to", "mooncake", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "input_length / output_length: cl100k_base tokens" in res.output
    assert "sessions: 2 kept as session_id + delay" in res.output
    text = out.read_text()
    assert "alice" not in text and "bob" not in text  # no name from the log leaves
    recs = [json.loads(line) for line in text.splitlines()]
    for rec in recs:
        L.check_aiperf_mooncake(rec)
        assert isinstance(rec["timestamp"], int)  # SGLang's reader sorts on it
    by_session: dict[str, list[dict]] = {}
    for rec in recs:
        if "session_id" in rec:
            by_session.setdefault(rec["session_id"], []).append(rec)
    assert sorted(len(v) for v in by_session.values()) == [1, 3]
    alice = next(v for v in by_session.values() if len(v) == 3)
    assert "delay" not in alice[0]
    assert [r["delay"] for r in alice[1:]] == [3000, 4250]  # ms since the previous turn
    # The turns share their first 512-token block, as in the log.
    assert alice[0]["hash_ids"][0] == alice[1]["hash_ids"][0] == alice[2]["hash_ids"][0]
    assert "session_id" not in recs[3] and "delay" not in recs[3]
    broken = dict(recs[0])
    del broken["input_length"]
    with pytest.raises(L.SchemaError):
        L.check_aiperf_mooncake(broken)
    with pytest.raises(L.SchemaError):
        L.check_aiperf_mooncake({**recs[0], "session_id": 7})


def test_dashboard_zip_holds_the_bundle_byte_for_byte(analysed):
    import io
    import zipfile

    from analyzer.report import deploy_zip

    _r, out, _ = analysed
    doc = json.loads((out / "report.json").read_text())
    data = deploy_zip(doc)
    assert data == deploy_zip(json.loads((out / "report.json").read_text()))  # deterministic
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        names = sorted(z.namelist())
        assert names == sorted(f["path"] for f in doc["deploy"]["files"])
        for name in names:
            assert z.read(name) == (out / name).read_bytes()


def _sourced(text: str, tmp_path: Path) -> dict[str, str]:
    """The variables an env file sets, as bash reads it (set -a; . FILE)."""
    f = tmp_path / "vars.env"
    f.write_text(_node(text))
    script = f"set -a; . {shlex.quote(str(f))}; set +a; env -0"
    out = subprocess.run(
        ["bash", "-c", script], check=True, capture_output=True, env={"PATH": os.environ["PATH"]}
    ).stdout.decode()
    return dict(kv.split("=", 1) for kv in out.split("\0") if "=" in kv)


def test_env_files_load_in_lmcache_and_mooncake(pooled_files, tmp_path, monkeypatch):
    sizings, files = pooled_files
    sz = sizings["pooled"]
    env = _sourced(files["deploy/pooled/vllm-lmcache-mooncake/lmcache.env"].text, tmp_path)
    for k in list(os.environ):
        if k.startswith(("LMCACHE_", "MOONCAKE_")):
            monkeypatch.delenv(k)
    for k, v in env.items():
        if k.startswith("LMCACHE_"):
            monkeypatch.setenv(k, v)
    cfg = L.lmcache_engine_config().from_env()
    assert cfg.local_cpu is False and cfg.remote_url.startswith("mooncakestore://")
    assert cfg.extra_config["local_hostname"] == "10.0.0.7"
    assert cfg.extra_config["global_segment_size"] * sz.ranks == pytest.approx(
        sz.pool_bytes, rel=0.01
    )
    L.check_lmcache_039_mooncake(cfg.extra_config)
    menv = _sourced(files["deploy/pooled/sglang-hicache-mooncake/mooncake.env"].text, tmp_path)
    for k, v in menv.items():
        if k.startswith("MOONCAKE_"):
            monkeypatch.setenv(k, v)
    mc = L.mooncake_config().load_from_env()  # Mooncake's own reader of these variables
    assert mc.master_server_address == "mooncake-master:50051"
    assert mc.local_hostname == "10.0.0.7"
    assert mc.global_segment_size * sz.instances == pytest.approx(sz.pool_bytes, rel=0.01)
    # SGLang reads the same variables; without MOONCAKE_MASTER it refuses to start.
    monkeypatch.delenv("MOONCAKE_MASTER")
    with pytest.raises(ValueError, match="MOONCAKE_MASTER"):
        L.mooncake_config().load_from_env()


def test_report_shows_each_products_size_per_process(analysed):
    r, out, _ = analysed
    doc = json.loads((out / "report.json").read_text())
    rows = doc["deploy"]["per_process"]
    assert "pooled" in {row["option"] for row in rows}
    emb = next(
        row for row in rows if row["setting"] == "global_segment_size" and row["per"] == "GPU rank"
    )
    mc = json.loads((out / "deploy/pooled/vllm-mooncake-store/mooncake.json").read_text())
    assert emb["bytes_each"] == mc["global_segment_size"]
    assert emb["total_bytes"] == r.sizing.pool_bytes
    md = (out / "report.md").read_text()
    assert f"({emb['bytes_each']:,} B)" in md


def test_pilot_commands_keep_tokenizer_paths_private():
    from analyzer.advisor.pilot import pilot_commands

    kw = dict(
        inputs=["a b.jsonl"],
        model=ServedModel(repo="m/x"),
        rate_rps=2.5,
        duration_s=99.2,
        n_requests=248,
        mean_input_tokens=1000.4,
        mean_output_tokens=0,
        sessions=False,
    )
    plain = {c.tool: c for c in pilot_commands(tokenizer="cl100k_base", **kw)}
    assert (
        plain["kvpool"].command == "kvpool convert 'a b.jsonl' --to mooncake -o pilot-trace.jsonl"
    )
    assert "each request replays alone" in plain["kvpool"].note
    assert "--benchmark-duration 100" in plain["AIPerf"].command
    assert "--random-input-len 1000 --random-output-len 1" in plain["vLLM bench serve"].command
    served = {c.tool: c for c in pilot_commands(tokenizer="hf:tokenizer.json*1.12", **kw)}
    cmd = served["kvpool"].command
    assert cmd.endswith('--tokenizer "$TOKENIZER" --token-ratio 1.12')
    assert "hf:tokenizer.json: set TOKENIZER" in served["kvpool"].note


# -- the real Mooncake Store: master started from start.sh, a client from the config ----


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mooncake_store_class():  # type: ignore[no-untyped-def]
    import ctypes.util

    if ctypes.util.find_library("ibverbs") is None:
        pytest.skip("libibverbs is not installed (.ci/run installs libibverbs1)")
    L.mooncake_config()  # the package is installed (or the test fails in CI)
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"Mooncake's store client does not load here: {exc}")
    return MooncakeDistributedStore


@pytest.mark.e2e
def test_real_mooncake_master_and_store_accept_the_emitted_configs(tmp_path):
    import socket
    import sys
    import time

    Store = _mooncake_store_class()
    rpc = _free_port()
    sz = replace(
        deploy_sizing(True, instances=4, gpus_per_node=4, knee=2048), nic="tcp"
    )  # 2048 tokens x 128 KiB = 256 MiB of pool over 4 ranks
    files = {
        f.path: f
        for f in bundle(
            {"pooled": sz}, "pooled", model=ServedModel(repo="m"), master=f"127.0.0.1:{rpc}"
        )
    }
    start = tmp_path / "start.sh"
    start.write_text(files["deploy/pooled/mooncake-master/start.sh"].text)
    bindir = str(Path(sys.executable).parent)  # mooncake_master's console script
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ["PATH"]}
    master = subprocess.Popen(
        [
            "bash",
            str(start),
            f"--metrics_port={_free_port()}",
            "--rpc_address=127.0.0.1",
            "--enable_metric_reporting=false",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", rpc), 0.2).close()
                break
            except OSError:
                assert master.poll() is None, "mooncake_master exited"
                assert time.monotonic() < deadline, "mooncake_master did not listen"
                time.sleep(0.1)
        configs = {
            "mooncake.json": json.loads(
                _node(files["deploy/pooled/vllm-mooncake-store/mooncake.json"].text)
            ),
            "lmcache extra_config": yaml.safe_load(
                _node(files["deploy/pooled/vllm-lmcache-mooncake/lmcache.yaml"].text)
            )["extra_config"],
            # SGLang takes the address from MOONCAKE_LOCAL_HOSTNAME and splits the
            # server's segment over its tp ranks (tp 1 here).
            "hicache-mooncake.json": json.loads(
                files["deploy/pooled/sglang-hicache-mooncake/hicache-mooncake.json"].text
            ),
        }
        MooncakeConfig = L.mooncake_config()
        for name, raw in configs.items():
            raw["local_hostname"] = "127.0.0.1"
            # The staging buffer is shrunk for the test machine; the segment is as sized.
            raw["local_buffer_size"] = 16 * 2**20
            path = tmp_path / "cfg.json"
            path.write_text(json.dumps(raw))
            cfg = MooncakeConfig.from_file(str(path))
            assert cfg.protocol == "tcp"
            assert cfg.global_segment_size * sz.ranks == pytest.approx(sz.pool_bytes, rel=0.01)
            assert cfg.master_server_address == f"127.0.0.1:{rpc}"
            store = Store()
            rc = store.setup(
                cfg.local_hostname,
                cfg.metadata_server,
                cfg.global_segment_size,
                cfg.local_buffer_size,
                cfg.protocol,
                cfg.device_name,
                cfg.master_server_address,
            )
            assert rc == 0, name
            try:
                key = f"kvpool-{name}"
                assert store.put(key, b"a KV block") == 0, name
                assert store.get(key) == b"a KV block", name
            finally:
                store.close()
    finally:
        master.terminate()
        master.wait(10)


def test_deploy_options_are_one_enum_written_as_its_plain_names():
    """The options are named once (DeployOption, in the advisor); every output writes
    the plain names, so the folders under deploy/ and report.json keep their bytes."""
    from analyzer.advisor import products as P
    from analyzer.advisor.figures import DeployOption, Verdict

    assert [str(o) for o in DeployOption] == [
        "pooled",
        "local-offload",
        "local-offload-nvme",
        "prefix-cache-only",
    ]
    assert P.mode_for(Verdict.DEPLOY_POOLED) is DeployOption.POOLED
    assert P.mode_for(Verdict.LOCAL_OFFLOAD_ONLY) is DeployOption.LOCAL_OFFLOAD
    assert P.mode_for(Verdict.NOT_WORTH_IT) is DeployOption.PREFIX_CACHE_ONLY
    assert P.runner_up(DeployOption.POOLED) is DeployOption.LOCAL_OFFLOAD
    assert P.runner_up(DeployOption.PREFIX_CACHE_ONLY) is DeployOption.LOCAL_OFFLOAD
    assert json.dumps({DeployOption.POOLED: [DeployOption.LOCAL_OFFLOAD]}) == (
        '{"pooled": ["local-offload"]}'
    )
    assert f"deploy/{DeployOption.LOCAL_OFFLOAD}/x" == "deploy/local-offload/x"

"""The command's start-up skips two imports libraries make for features kvpool does not
use (analyzer/cli/startup.py), and the figures stay the same without them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from analyzer.cli import app


@pytest.mark.slow
def test_reuse_skips_pandas_and_scipy_linalg_with_the_same_figures(tmp_path, shared_traces):
    moon = shared_traces / "mooncake" / "synthetic_trace.jsonl"
    args = ["reuse", str(moon), "--capacity-tokens", "20k,200k", "--policies", "lru,optimal"]
    args += ["--salt-file", str(tmp_path / "salt")]
    # The process of `kvpool reuse`, as the console script runs it (main()).
    code = (
        "import json, sys\n"
        "from analyzer.cli import main\n"
        f"sys.argv = ['kvpool', '-q', *{[*args, '-j', '1', '--json', '-']!r}]\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    skipped = [m for m in ('pandas', 'scipy.linalg') if m not in sys.modules]\n"
        "    assert 'numba.np.arraymath' in sys.modules  # compiled kernels did run\n"
        "    print(json.dumps(skipped), file=sys.stderr)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stderr.strip().splitlines()[-1]) == ["pandas", "scipy.linalg"]
    # In this process (a test runner's: no start-up trimming) the figures are the same.
    same = CliRunner().invoke(app, [*args, "-j", "1", "--json", "-"])
    assert same.exit_code == 0, same.output
    assert json.loads(r.stdout) == json.loads(same.stdout)


# What `kvpool reuse` never prints from: the advisor's decision records and pipeline,
# the replay stage they pull in, and the report writer.
NOT_FOR_REUSE = (
    "analyzer.advisor.decide",
    "analyzer.advisor.figures",
    "analyzer.advisor.pipeline",
    "analyzer.replay",
    "analyzer.report",
    "pandas",
    "scipy.linalg",
)


@pytest.mark.slow
def test_reuse_imports_only_what_it_prints_from(tmp_path, shared_traces):
    moon = shared_traces / "mooncake" / "synthetic_trace.jsonl"
    args = ["reuse", str(moon), "--model", "llama-3.1-8b", "--capacity-gib", "1,4"]
    args += ["--policies", "lru,optimal", "--salt-file", str(tmp_path / "salt"), "-j", "1"]
    code = (
        "import json, sys\n"
        "from analyzer.cli import main\n"
        f"sys.argv = ['kvpool', '-q', *{args!r}]\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        f"    loaded = [m for m in {NOT_FOR_REUSE!r} if m in sys.modules]\n"
        "    ran = ['analyzer.advisor.models', 'analyzer.cost', 'numba.np.arraymath']\n"
        "    print(json.dumps([loaded, [m for m in ran if m in sys.modules]]), file=sys.stderr)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert r.returncode == 0, r.stderr
    loaded, ran = json.loads(r.stderr.strip().splitlines()[-1])
    assert loaded == []
    # The model check, the --model catalog and the compiled kernels did run.
    assert ran == ["analyzer.advisor.models", "analyzer.cost", "numba.np.arraymath"]
    assert "Steady hit rate against cache size" in r.stdout


def test_the_advisor_package_names_load_on_first_use():
    code = (
        "import sys\n"
        "import analyzer.advisor as a\n"
        "assert 'analyzer.advisor.figures' not in sys.modules\n"
        "from analyzer.advisor import VERDICTS, Verdict, run_analysis\n"
        "from analyzer.advisor.figures import Verdict as V\n"
        "from analyzer.advisor.pipeline import run_analysis as r\n"
        "assert Verdict is V and run_analysis is r and VERDICTS\n"
        "assert sorted(a.__all__) == sorted(a._LAZY)\n"
        "try:\n"
        "    a.nothing\n"
        "except AttributeError:\n"
        "    print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "ok", r.stderr


def test_a_command_runs_from_an_app_holding_only_it_with_the_same_help_and_errors():
    from analyzer.cli import only

    names = [c.name for c in app.registered_commands] + [g.name for g in app.registered_groups]
    assert {"reuse", "convert", "analyze", "cost", "dashboard"} <= set(names)
    for name in names:
        solo = only(name)
        assert solo is not app
        assert len(solo.registered_commands) + len(solo.registered_groups) == 1
        for args in (["--help"], ["--no-such-flag"]):
            want = CliRunner().invoke(app, [name, *args])
            got = CliRunner().invoke(solo, [name, *args])
            assert (got.exit_code, got.output) == (want.exit_code, want.output), (name, args)
    # no command, or one that is not there: the whole app (its list, its suggestions)
    assert only(None) is app and only("reus") is app
    assert app.registered_commands and len(app.registered_commands) == len(names) - 1

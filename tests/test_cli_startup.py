"""The command's start-up skips two imports libraries make for features kvpool does not
use (analyzer/cli/startup.py), and the figures stay the same without them."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from analyzer.cli import app


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

"""Runs kvpool commands for tests/safety/test_fuzz.py inside one memory- and CPU-capped process.

``python tests/helpers/fuzz_driver.py CASES.json RESULTS.json``: CASES holds the address-space
limit and a list of argument lists; each is run through the real entry point
(``analyzer.cli.main``) in the working directory, and RESULTS gets, per case, the exit
code (or ``"traceback"`` when an exception escaped) and the end of stderr. One process
for many cases keeps start-up (numba, pyarrow) out of the fuzzing budget.
"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import sys
import traceback


def main() -> None:
    cases_path, results_path = sys.argv[1], sys.argv[2]  # sys.argv is reused per case
    with open(cases_path, encoding="utf-8") as f:
        spec = json.load(f)
    mem = int(spec["mem_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu = int(spec.get("cpu_s", 120))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    from analyzer.cli import main as kvpool

    results = []
    for args in spec["cases"]:
        out, err = io.StringIO(), io.StringIO()
        code: int | str
        sys.argv = ["kvpool", *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                kvpool()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # exactly what the fuzzer looks for
                code = "traceback"
                err.write(traceback.format_exc())
        results.append({"args": args, "code": code, "stderr": err.getvalue()[-3000:]})
    with open(results_path, "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()

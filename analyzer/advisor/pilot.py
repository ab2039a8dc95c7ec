"""The exact pilot commands: the log exported for replayers, and each replayer's command
line with the export, the logged rate and the duration filled in.

What each replayer does with a Mooncake-format file (checked in its source):

* AIPerf 0.13.0 (``aiperf/dataset/loader/models.py`` ``MooncakeTrace``,
  ``aiperf/timing/strategies/fixed_schedule.py``): ``--custom-dataset-type
  mooncake_trace`` reads ``input_length``/``output_length``/``hash_ids`` and groups
  turns by ``session_id``; a trace with timestamps runs under its fixed schedule (the
  logged arrivals, so the logged rate). Prompts are synthesized from ``hash_ids`` so
  requests sharing an id share that prefix.
* SGLang 0.5.23 ``python -m sglang.bench_serving --dataset-name mooncake``
  (``sglang/benchmark/datasets/mooncake.py``): replays ``timestamp`` only with
  ``--backend sglang``; it builds each prompt from ``hash_ids`` (128 words a block),
  so ``input_length`` and sessions are not reproduced, only which requests share which
  blocks and when they arrive.
* ``vllm bench serve`` has no Mooncake dataset (its ``--dataset-name`` choices are
  sharegpt, burstgpt, sonnet, random, hf, custom, prefix_repetition, ...): it applies
  to the arrival gate only, at the logged rate with the logged mean lengths, and its
  ``--save-result`` JSON is what ``kvpool validate`` reads. A log whose requests share
  one timestamp has no rate: ``--request-rate inf`` sends every request at time 0,
  which is what such a log records (``vllm/benchmarks/serve.py``, ``--request-rate``:
  "If this is inf, then all the requests are sent at time 0").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from analyzer.advisor.served import ServedModel
from analyzer.quoting import comment, shell

EXPORT = "pilot-trace.jsonl"
PROBE_RESULTS = "isolation-probe.json"


@dataclass(frozen=True, slots=True)
class PilotCommand:
    tool: str
    purpose: str
    command: str
    note: str  # one line: the reports print it as a comment above the command

    def __post_init__(self) -> None:
        object.__setattr__(self, "note", comment(self.note))

    def to_json(self) -> dict[str, object]:
        return {
            "tool": self.tool,
            "purpose": self.purpose,
            "command": self.command,
            "note": self.note,
        }


def pilot_commands(
    *,
    inputs: list[str],
    model: ServedModel,
    rate_rps: float,
    duration_s: float,
    n_requests: int,
    mean_input_tokens: float,
    mean_output_tokens: float | None,
    tokenizer: str,
    sessions: bool,
    url: str = "http://localhost:8000",
    sglang_port: int = 30000,
) -> tuple[PilotCommand, ...]:
    """Commands to replay the analysed log against a pilot deployment."""
    logs = " ".join(shell(n) for n in inputs) or "LOG"
    duration = max(1, math.ceil(duration_s))
    # The trace records the tokenizer's name, not its path (paths stay private): a
    # served model's tokenizer is named by a variable the user sets.
    name, _, ratio = tokenizer.partition("*")
    tok = "" if name in ("", "cl100k", "cl100k_base") else ' --tokenizer "$TOKENIZER"'
    if ratio:
        tok += f" --token-ratio {shell(ratio)}"
    burst = not rate_rps > 0  # one timestamp: no rate, every request at once
    rate = "inf" if burst else f"{rate_rps:.4g}"
    logged = (
        "every request at once: the log's requests share one timestamp"
        if burst
        else f"{rate_rps:.3g} req/s, the logged rate"
    )
    mean_in = max(1, round(mean_input_tokens))
    out_known = mean_output_tokens is not None
    mean_out = max(1, round(mean_output_tokens)) if mean_output_tokens is not None else 256
    host = url.removeprefix("http://").partition(":")[0]
    # The probe's second engine: the next instance of the launch scripts' serve loop.
    base, _, port = url.rpartition(":")
    second = f"{base}:{int(port) + 1}" if port.isdigit() else "http://ENGINE_B:8000"
    return (
        PilotCommand(
            "kvpool",
            "export the analysed log for the replayers",
            f"kvpool convert {logs} --to mooncake -o {EXPORT}{tok}",
            "input_length counts tokens of the tokenizer the analysis used"
            + (
                " (cl100k; --tokenizer names the served model's tokenizer instead)"
                if name in ("", "cl100k", "cl100k_base")
                else f" ({name}: set TOKENIZER to its path)"
            )
            + (
                "; sessions are kept as session_id and delay"
                if sessions
                else "; the log has no sessions, so each request replays alone"
            ),
        ),
        PilotCommand(
            "AIPerf",
            "replay the log at its logged arrivals (main and stability gates)",
            " ".join(
                [
                    "aiperf profile",
                    f"--model {model.arg}",
                    f"--url {url}",
                    "--endpoint-type chat --streaming",
                    f"--input-file {EXPORT}",
                    "--custom-dataset-type mooncake_trace",
                    "--fixed-schedule --fixed-schedule-auto-offset",
                    f"--benchmark-duration {duration}",
                ]
            ),
            f"{n_requests:,} requests over {duration:,} s ({logged}, for the whole "
            "cluster: point --url at its router)" + (f"; {model.setup}" if model.setup else ""),
        ),
        PilotCommand(
            "SGLang bench_serving",
            "replay arrivals and shared blocks against SGLang",
            " ".join(
                [
                    "python -m sglang.bench_serving --backend sglang",
                    f"--host {host or 'localhost'} --port {sglang_port}",
                    f"--model {model.arg}",
                    f"--dataset-name mooncake --dataset-path {EXPORT}",
                    f"--num-prompts {n_requests}",
                    "--use-trace-timestamps --mooncake-slowdown-factor 1",
                    "--output-file sglang-pilot.jsonl",
                ]
            ),
            "prompts are built from hash_ids (input_length and sessions are not replayed); "
            "--request-rate is ignored for this dataset",
        ),
        PilotCommand(
            "kvpool probe",
            "tenant isolation gate: the same prefix under two cache salts must not hit",
            f"kvpool probe {url} {second} --model {model.arg} -o {PROBE_RESULTS}",
            "two engines sharing the pool (the second reaches the first one's blocks only "
            "through it: another instance or node), run idle; vLLM reports cached tokens "
            "with --enable-prompt-tokens-details, SGLang with --enable-cache-report; then "
            f"`kvpool validate {PROBE_RESULTS} --report report.json`",
        ),
        PilotCommand(
            "vLLM bench serve",
            "arrival gate: the logged rate and mean lengths (no prefix reuse)",
            " ".join(
                [
                    "vllm bench serve",
                    f"--model {model.arg}",
                    f"--base-url {url}",
                    "--dataset-name random",
                    f"--random-input-len {mean_in} --random-output-len {mean_out}",
                    f"--request-rate {rate}",
                    f"--num-prompts {n_requests}",
                    "--save-result --result-filename baseline.json",
                ]
            ),
            "vllm bench serve has no Mooncake dataset; use its JSON with "
            "`kvpool validate baseline=baseline.json --report report.json`"
            + ("" if out_known else "; the log has no output lengths, so 256 is assumed"),
        ),
    )

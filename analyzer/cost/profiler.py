"""``kvpool cost profile``: measure prefill and copy bandwidth on the user's own device.

Needs PyTorch (the optional ``profile`` extra); nothing else in kvpool imports it, and
this module imports it on first use, inside the functions that time (not at the top:
it takes seconds to load and may be absent). It
times one transformer layer with the user's model shapes (per tensor-parallel rank:
attention projections, causal scaled-dot-product attention with grouped KV heads, a
gated MLP as wide as the model's active MLP parameters, RMSNorms) at several prompt
lengths and batch sizes, scales it by the layer count and adds the last token's
vocabulary projection. Weights are random: nothing is downloaded. On a CUDA device it
also times pinned host-to-device and device-to-host copies, and, with ``--nvme-dir``,
reads of a fresh file from that directory (page cache dropped first) into GPU memory.

The raw points are written beside the profile as CSV (``<name>.prefill.csv``,
``<name>.h2d.csv``, ...) and fitted with the same code as ``kvpool cost fit``, so the
profile is an ordinary ``kvpool.cost-profile/1`` file that ``--profile`` accepts. What
it does not measure: the tensor-parallel all-reduce (one rank's shard is timed), fp8/fp4
GEMMs (it runs bf16 on GPU, fp32 on CPU), and a serving engine's scheduling (vLLM is not
driven yet).
"""

from __future__ import annotations

import csv
import io
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from analyzer.cost.model import CostModel
from analyzer.cost.model_spec import ModelSpec
from analyzer.errors import OutputError, UsageError
from analyzer.outputs import write_text

if TYPE_CHECKING:
    import torch

DEFAULT_PROMPTS = (512, 1024, 2048, 4096)
DEFAULT_BATCHES = (1, 4)
COPY_MIB = (1, 4, 16, 64, 256)


@dataclass(frozen=True, slots=True)
class LayerShape:
    """One rank's shapes of one transformer layer (equivalent in FLOPs to the model's)."""

    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    mlp_width: int  # gated MLP (gate, up, down) as wide as the active MLP parameters
    layers: int
    vocab: int

    @classmethod
    def of(cls, model: ModelSpec, tp: int) -> LayerShape:
        h = model.hidden_size
        hd = model.head_dim
        attn = h * hd * (2 * model.num_q_heads + 2 * model.num_kv_heads)
        per_layer = model.active_nonembedding_params / model.num_layers
        width = max(round((per_layer - attn) / (3 * h)), 1)
        return cls(
            hidden=h,
            q_heads=max(model.num_q_heads // tp, 1),
            kv_heads=max(model.num_kv_heads // tp, 1),
            head_dim=hd,
            mlp_width=max(width // tp, 1),
            layers=model.num_layers,
            vocab=max(model.vocab_size // tp, 1),
        )


def _require_torch() -> None:
    """A usage error naming what to install when PyTorch is missing."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise UsageError(
            "kvpool cost profile needs PyTorch",
            hint="pip install 'kvpool-advisor[profile]' (or any torch >= 2.1) on the GPU machine",
        ) from exc


def pick_device(requested: str) -> str:
    _require_torch()
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: PyTorch sees no CUDA device on this machine")
    if requested not in ("cuda", "cpu"):
        raise UsageError(f"--device must be auto, cuda or cpu, got '{requested}'")
    return requested


def device_name(device: str) -> str:
    _require_torch()
    import torch

    if device == "cuda":
        return f"cuda: {torch.cuda.get_device_name(0)}"
    return f"cpu: {platform.machine()} {os.cpu_count()} threads (no GPU: not a GPU profile)"


class _Timer:
    def __init__(self, device: str):
        self.cuda = device == "cuda"

    def __call__(self, fn: Callable[[], object], repeats: int) -> float:
        """Fastest of ``repeats`` timed runs of ``fn()`` (it runs the work) after one
        warm-up run.

        The minimum, not the mean: whatever else runs on the machine only ever adds time.
        """
        _require_torch()
        import torch

        fn()
        times = []
        for _ in range(repeats):
            if self.cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if self.cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return min(times)


def _layer(shape: LayerShape, device: str, dtype: torch.dtype) -> Callable[..., torch.Tensor]:
    """A callable running one layer forward on ``x`` of (batch, tokens, hidden)."""
    _require_torch()
    import torch

    f = torch.nn.functional
    g = torch.Generator(device=device).manual_seed(0)

    def w(*dims: int) -> torch.Tensor:
        return torch.randn(*dims, generator=g, device=device, dtype=dtype) * 0.02

    h, hd = shape.hidden, shape.head_dim
    wq, wk, wv = w(h, shape.q_heads * hd), w(h, shape.kv_heads * hd), w(h, shape.kv_heads * hd)
    wo = w(shape.q_heads * hd, h)
    wg, wu, wd = w(h, shape.mlp_width), w(h, shape.mlp_width), w(shape.mlp_width, h)
    group = shape.q_heads // shape.kv_heads

    def rms(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)

    def forward(
        x: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``past``: cached (k, v) of earlier tokens; ``mask``: causal mask with offset."""
        b, s, _ = x.shape
        y = rms(x)
        q = (y @ wq).view(b, s, shape.q_heads, hd).transpose(1, 2)
        k = (y @ wk).view(b, s, shape.kv_heads, hd).transpose(1, 2)
        v = (y @ wv).view(b, s, shape.kv_heads, hd).transpose(1, 2)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        if past is None:
            a = f.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            a = f.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + a.transpose(1, 2).reshape(b, s, -1) @ wo
        y = rms(x)
        return x + (f.silu(y @ wg) * (y @ wu)) @ wd

    return forward


def time_prefill(
    shape: LayerShape,
    device: str,
    prompts: tuple[int, ...],
    batches: tuple[int, ...],
    repeats: int,
) -> list[dict[str, float]]:
    """Measured prefill seconds per (prompt, batch): layers x one layer + the head."""
    _require_torch()
    import torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    timer = _Timer(device)
    layer = _layer(shape, device, dtype)
    head = torch.randn(shape.hidden, shape.vocab, device=device, dtype=dtype) * 0.02
    out = []
    with torch.inference_mode():
        for b in batches:
            last = torch.randn(b, shape.hidden, device=device, dtype=dtype)
            t_head = timer(partial(torch.matmul, last, head), repeats)
            for s in prompts:
                x = torch.randn(b, s, shape.hidden, device=device, dtype=dtype)
                t_layer = timer(partial(layer, x), repeats)
                out.append(
                    {
                        "prompt_tokens": s,
                        "cached_tokens": 0,
                        "concurrency": b,
                        "prefill_s": shape.layers * t_layer + t_head,
                    }
                )
                # the same new tokens after a cached prefix as long: their attention
                # reads the cached keys (what a cache hit leaves to compute)
                kv = (b, shape.kv_heads, s, shape.head_dim)
                past = (
                    torch.randn(*kv, device=device, dtype=dtype),
                    torch.randn(*kv, device=device, dtype=dtype),
                )
                rows = torch.arange(s, device=device).unsqueeze(1)
                cols = torch.arange(2 * s, device=device).unsqueeze(0)
                mask = cols <= rows + s
                t_layer = timer(partial(layer, x, past, mask), repeats)
                out.append(
                    {
                        "prompt_tokens": 2 * s,
                        "cached_tokens": s,
                        "concurrency": b,
                        "prefill_s": shape.layers * t_layer + t_head,
                    }
                )
    return out


def time_copies(device: str, repeats: int) -> dict[str, list[dict[str, float]]]:
    """Pinned host<->device copies of 1-256 MiB (CUDA only)."""
    _require_torch()
    import torch

    if device != "cuda":
        return {}
    timer = _Timer(device)
    h2d, d2h = [], []
    for mib in COPY_MIB:
        n = mib << 20
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        t = timer(partial(dev.copy_, host, non_blocking=True), repeats)
        h2d.append({"bytes": n, "concurrency": 1, "seconds": t})
        t = timer(partial(host.copy_, dev, non_blocking=True), repeats)
        d2h.append({"bytes": n, "concurrency": 1, "seconds": t})
    return {"h2d": h2d, "d2h": d2h}


def time_nvme(directory: str, device: str, mib: int = 256) -> list[dict[str, float]]:
    """Reads of a fresh file in ``directory`` (page cache dropped) into device memory."""
    _require_torch()
    import torch

    d = Path(directory)
    if not d.is_dir():
        raise UsageError(f"--nvme-dir {d} is not a directory")
    path = d / f".kvpool-profile-{os.getpid()}.bin"
    chunk = 8 << 20
    out = []
    try:
        with open(path, "wb") as fh:
            block = os.urandom(chunk)
            for _ in range(max(mib * (1 << 20) // chunk, 1)):
                fh.write(block)
            fh.flush()
            os.fsync(fh.fileno())
        size = path.stat().st_size
        for part in (size // 8, size // 2, size):
            fd = os.open(path, os.O_RDONLY)
            try:
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                buf = torch.empty(part, dtype=torch.uint8, pin_memory=device == "cuda")
                view = buf.numpy().data  # a writable memoryview of the pinned buffer
                if device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                got = 0
                while got < part:
                    n = os.readv(fd, [view[got : min(got + chunk, part)]])
                    if n <= 0:
                        break
                    got += n
                if device == "cuda":
                    buf.to("cuda", non_blocking=True)
                    torch.cuda.synchronize()
                out.append({"bytes": got, "concurrency": 1, "seconds": time.perf_counter() - t0})
            finally:
                os.close(fd)
    except OSError as exc:
        raise OutputError(f"cannot write or read the NVMe test file in {d}: {exc}") from exc
    finally:
        path.unlink(missing_ok=True)
    return out


def write_csv(path: Path, rows: list[dict[str, float]]) -> Path:
    """The measured points as CSV, written atomically (analyzer/outputs.py)."""
    buf = io.StringIO(newline="")
    wr = csv.DictWriter(buf, fieldnames=list(rows[0]))
    wr.writeheader()
    for r in rows:
        wr.writerow({k: (f"{v:.9g}" if isinstance(v, float) else v) for k, v in r.items()})
    return write_text(path, buf.getvalue())


@dataclass(frozen=True, slots=True)
class ProfileRun:
    """What one run measured, and where the raw points went."""

    device: str
    dtype: str
    shape: LayerShape
    csv: dict[str, str]  # kind -> path of its raw points
    points: dict[str, int]  # kind -> how many


def measure(
    cm: CostModel,
    output: str,
    *,
    device: str = "auto",
    prompts: tuple[int, ...] = DEFAULT_PROMPTS,
    batches: tuple[int, ...] = DEFAULT_BATCHES,
    repeats: int = 3,
    nvme_dir: str | None = None,
) -> ProfileRun:
    """Time prefill (and copies) for ``cm``'s model shapes; write the raw CSVs."""
    if repeats < 1:
        raise UsageError(f"--repeats must be at least 1, got {repeats}")
    dev = pick_device(device)
    if dev == "cpu":
        import torch

        torch.set_num_threads(1)  # one thread: steadier timings on a shared machine
    shape = LayerShape.of(cm.model, cm.tp)
    stem = Path(output).with_suffix("")
    paths: dict[str, str] = {}
    counts: dict[str, int] = {}
    prefill = time_prefill(shape, dev, prompts, batches, repeats)
    kinds = {"prefill": prefill, **time_copies(dev, repeats)}
    if nvme_dir:
        kinds["nvme"] = time_nvme(nvme_dir, dev)
    for kind, rows in kinds.items():
        if rows:
            paths[kind] = str(write_csv(stem.with_name(f"{stem.name}.{kind}.csv"), rows))
            counts[kind] = len(rows)
    dtype = "bf16" if dev == "cuda" else "fp32"
    return ProfileRun(device_name(dev), dtype, shape, paths, counts)

"""Precisions and their bytes per element: KV caches, weights and the GEMMs' tensor cores.

One table for every byte count the cost model multiplies (GB are 10^9 bytes, GiB 2^30;
the two are never mixed).
"""

from __future__ import annotations

from analyzer.errors import UsageError

# mxfp4: 4-bit values plus one 8-bit scale per 32 (4.25 bits), as in gpt-oss checkpoints
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int8": 1,
    "mxfp4": 4.25 / 8,
    "fp4": 4.5 / 8,  # NVFP4: 4-bit values plus one FP8 scale per 16
    "int4": 0.5,
}
KV_DTYPES = ("bf16", "fp16", "fp8")
# Deployment precisions of the weights (--weights-dtype): what the GEMMs run at when the
# GPU has tensor cores for it (W8A8 fp8, W4A4 fp4); otherwise the weights are dequantized
# and the GEMMs run at the next precision the GPU has (see GpuSpec.compute_dtype_for).
WEIGHT_DTYPES = ("bf16", "fp8", "fp4")


def dtype_bytes(dtype: str, *, allowed: tuple[str, ...] | None = None) -> float:
    """Bytes per element of ``dtype``; UsageError naming the valid choices otherwise."""
    key = dtype.strip().lower()
    choices = allowed or tuple(DTYPE_BYTES)
    if key not in DTYPE_BYTES or key not in choices:
        raise UsageError(f"unknown dtype '{dtype}'", hint=f"choose one of {', '.join(choices)}")
    return DTYPE_BYTES[key]


def weights_dtype_named(value: str | None) -> str | None:
    """A deployment precision of the weights as the user names it (``--weights-dtype``,
    the dashboard), as the catalog names it: ``fp16`` is ``bf16``; None: the
    checkpoint's own."""
    if value is None:
        return None
    key = value.strip().lower()
    if key == "fp16":
        key = "bf16"
    if key not in WEIGHT_DTYPES:
        raise UsageError(
            f"--weights-dtype must be one of {', '.join(WEIGHT_DTYPES)}, got '{value}'"
        )
    return key

"""Hardware specs: GPUs (dense peaks, HBM, interconnect) and the tiers and links KV is
loaded over (effective bandwidth, first-byte latency), as ``models/hardware.toml`` lists
them with their sources."""

from __future__ import annotations

from dataclasses import dataclass

from analyzer.errors import UsageError


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator: dense peak compute and HBM."""

    id: str
    name: str
    vendor: str
    bf16_tflops: float
    fp8_tflops: float | None
    hbm_gib: float
    hbm_tbps: float
    source: str = ""
    aliases: tuple[str, ...] = ()
    fp4_tflops: float | None = None
    interconnect_gbps: float = 0.0  # GPU-to-GPU bandwidth each way (NVLink / Infinity Fabric)

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gib * 2**30)

    def compute_dtype_for(self, weight_dtype: str) -> str:
        """The precision GEMMs run at for weights stored in ``weight_dtype``.

        fp8 weights run on fp8 tensor cores (W8A8) and fp4 weights on fp4 ones (W4A4) where
        the GPU has them; otherwise they are dequantized on the fly and the GEMMs run in
        bf16 (W4A16 / W8A16 kernels: mxfp4 gpt-oss on H100, fp8 on A100).
        """
        wants = {"fp4": "fp4", "mxfp4": "fp4", "int4": "fp4", "fp8": "fp8", "int8": "fp8"}
        key = wants.get(weight_dtype.strip().lower(), "bf16")
        if key == "fp4" and self.fp4_tflops is not None:
            return "fp4"
        if key == "fp8" and self.fp8_tflops is not None:
            return "fp8"
        return "bf16"

    def tflops(self, dtype: str = "bf16") -> float:
        """Dense peak TFLOP/s for ``dtype`` (bf16/fp16 or fp8)."""
        key = dtype.strip().lower()
        if key in ("bf16", "fp16"):
            return self.bf16_tflops
        if key == "fp8":
            if self.fp8_tflops is None:
                raise UsageError(
                    f"{self.name} has no fp8 tensor cores", hint="use --compute-dtype bf16"
                )
            return self.fp8_tflops
        if key == "fp4":
            if self.fp4_tflops is None:
                raise UsageError(
                    f"{self.name} has no fp4 tensor cores", hint="use --weights-dtype fp8 or bf16"
                )
            return self.fp4_tflops
        raise UsageError(f"unknown compute dtype '{dtype}'", hint="choose bf16, fp8 or fp4")

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "name": self.name,
            "vendor": self.vendor,
            "bf16_tflops": self.bf16_tflops,
            "fp8_tflops": self.fp8_tflops,
            "fp4_tflops": self.fp4_tflops,
            "interconnect_gbps": self.interconnect_gbps,
            "hbm_gib": self.hbm_gib,
            "hbm_tbps": self.hbm_tbps,
            "source": self.source,
        }


@dataclass(frozen=True, slots=True)
class TierSpec:
    """A place KV can be loaded from, with its effective bandwidth and first-byte latency."""

    name: str
    bandwidth_gbps: float
    latency_s: float
    kind: str = "network"
    description: str = ""
    source: str = ""
    aliases: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "kind": self.kind,
            "bandwidth_gbps": self.bandwidth_gbps,
            "latency_s": self.latency_s,
            "description": self.description,
            "source": self.source,
        }


def check_bandwidth(bandwidth_gbps: float, what: str = "bandwidth") -> float:
    """UsageError unless ``bandwidth_gbps`` is a finite positive number."""
    if (
        not bandwidth_gbps == bandwidth_gbps
        or bandwidth_gbps <= 0
        or bandwidth_gbps == float("inf")
    ):
        raise UsageError(
            f"{what} must be a positive number of GB/s, got {bandwidth_gbps}",
            hint="GB/s are decimal (1e9 bytes/s); a 200 Gb/s NIC is about 21.75 GB/s effective",
        )
    return float(bandwidth_gbps)

"""Cost stage: model and hardware catalogs, prefill and load models, break-even.

Lower stages never import this one; replay and advisor call :class:`CostModel`. The
modules import one another as a tree (tests/project/test_layering.py checks it); each row
imports only rows above it:

    dtypes, engine_constants, step_formula,   precisions; the engine model's constants;
    coefficients, breakdown                   the step-time formula; fitted coefficients;
                                              what the cost questions return
    model_spec, hardware                      a model's KV geometry; GPUs, tiers, links
    hf_config, instance                       config.json -> ModelSpec; one instance's
                                              step coefficients
    catalog                                   models/*.toml loaded, names looked up
    model                                     CostModel: prefill, load, break-even, TTFT
    profile_file, aic, prices, profiler       profile files; aiconfigurator-core's step
                                              times; prices; `kvpool cost profile`
    calibrate, step, reference                fits to your measurements; the replay's
                                              step model; the published-measurement check
    uncertainty                               error bands from that check
"""

from analyzer.cost.breakdown import BreakEvenRow, TierBreakEven, TtftBreakdown
from analyzer.cost.catalog import (
    get_gpu,
    get_model,
    get_tier,
    list_gpus,
    list_models,
    list_tiers,
    model_from_config_file,
    recognize_model,
)
from analyzer.cost.coefficients import (
    DEFAULT_OVERHEAD_S,
    LoadLink,
    PrefillCoefficients,
    TtftCoefficients,
)
from analyzer.cost.hardware import GpuSpec, TierSpec
from analyzer.cost.hf_config import spec_from_hf_config
from analyzer.cost.model import DEFAULT_MFU_DENSE, DEFAULT_MFU_MOE, CostModel
from analyzer.cost.model_spec import ModelSpec
from analyzer.cost.profile_file import load_profile
from analyzer.cost.step import StepModel, step_model, step_seconds

__all__ = [
    "DEFAULT_MFU_DENSE",
    "DEFAULT_MFU_MOE",
    "DEFAULT_OVERHEAD_S",
    "BreakEvenRow",
    "CostModel",
    "GpuSpec",
    "LoadLink",
    "ModelSpec",
    "PrefillCoefficients",
    "StepModel",
    "TierBreakEven",
    "TierSpec",
    "TtftBreakdown",
    "TtftCoefficients",
    "get_gpu",
    "get_model",
    "get_tier",
    "list_gpus",
    "list_models",
    "list_tiers",
    "load_profile",
    "model_from_config_file",
    "recognize_model",
    "spec_from_hf_config",
    "step_model",
    "step_seconds",
]

"""Cost stage: model and hardware catalogs, prefill and load models, break-even.

Lower stages never import this one; replay and advisor call :class:`CostModel`.
"""

from analyzer.cost.catalog import (
    GpuSpec,
    ModelSpec,
    TierSpec,
    get_gpu,
    get_model,
    get_tier,
    list_gpus,
    list_models,
    list_tiers,
    model_from_config_file,
    recognize_model,
    spec_from_hf_config,
)
from analyzer.cost.model import (
    DEFAULT_MFU_DENSE,
    DEFAULT_MFU_MOE,
    DEFAULT_OVERHEAD_S,
    CostModel,
    LoadLink,
    PrefillCoefficients,
    TtftBreakdown,
    TtftCoefficients,
)
from analyzer.cost.step import StepModel, step_model, step_seconds

__all__ = [
    "DEFAULT_MFU_DENSE",
    "DEFAULT_MFU_MOE",
    "DEFAULT_OVERHEAD_S",
    "CostModel",
    "GpuSpec",
    "LoadLink",
    "ModelSpec",
    "PrefillCoefficients",
    "StepModel",
    "TierSpec",
    "TtftBreakdown",
    "TtftCoefficients",
    "get_gpu",
    "get_model",
    "get_tier",
    "list_gpus",
    "list_models",
    "list_tiers",
    "model_from_config_file",
    "recognize_model",
    "spec_from_hf_config",
    "step_model",
    "step_seconds",
]

"""An aggregated engine's KV pool and scheduler limits, as the engines size them.

**The KV pool.** vLLM sizes its paged KV cache at start-up from a memory profile: of the
GPU's memory it may use ``total * --gpu-memory-utilization``, less the weights (its
``Model loading took ... GiB``), the peak activation of a profiling forward pass of
``max_num_batched_tokens`` tokens and the memory outside PyTorch (CUDA context, NCCL
buffers); what is left is the KV cache, logged as ``Available KV cache memory`` and, in
tokens, ``GPU KV cache size`` (vllm/v1/worker/gpu_worker.py, ``determine_available_memory``;
vllm/v1/core/kv_cache_utils.py). SGLang does the same with ``--mem-fraction-static``
(the fraction for weights and KV together). Per GPU of a tensor-parallel instance::

    kv_bytes = hbm * utilization - weights / tp - activation - non_torch
    activation = 13.5 * max_num_batched_tokens * hidden_size * 2 B
    tokens   = kv_bytes / (KV bytes per token per GPU)

``activation`` is the profiling pass's peak, 13.5 16-bit hidden-state-sized buffers per
token in flight (the MLP's gate and up projections, residuals, attention workspace), and
``non_torch`` 0.35 GiB: both read off vLLM's memory-profiling lines for Llama-3.1-8B at
20,000 and 29,000 profiled tokens (vllm-project/vllm issue 10517: peak torch memory
17.06 and 17.98 GiB over 14.99 GiB of weights, non-torch memory 0.35 GiB). The
published capacity lines it is checked against, those two and one held out, are in
docs/validation.md (tests/replay/test_replay_validation.py).

**Scheduler limits.** vLLM's defaults for an OpenAI-compatible server
(``EngineArgs.get_batch_defaults``, vllm/engine/arg_utils.py): on GPUs with 70 GiB or
more other than the A100, ``max_num_batched_tokens`` 8,192 and ``max_num_seqs`` 1,024;
otherwise 2,048 and 256.
"""

from __future__ import annotations

from typing import Any

ACTIVATION_PER_TOKEN_HIDDEN = 13.5  # 16-bit hidden-state buffers per profiled token
NON_TORCH_GIB = 0.35  # CUDA context, NCCL and allocator memory outside PyTorch, per GPU
LARGE_GPU_GIB = 70.0  # vLLM's threshold for its larger batch defaults


def batch_defaults(gpu: Any) -> tuple[int, int]:
    """vLLM's ``(max_num_batched_tokens, max_num_seqs)`` for an API server on ``gpu``."""
    large = float(gpu.hbm_gib) >= LARGE_GPU_GIB and "a100" not in str(gpu.name).lower()
    return (8192, 1024) if large else (2048, 256)


def kv_pool_bytes_per_gpu(
    hbm_bytes: float,
    utilization: float,
    weight_bytes_per_gpu: float,
    hidden_size: int,
    max_num_batched_tokens: int,
) -> float:
    """KV cache bytes one GPU of the instance holds (see the module docstring)."""
    activation = ACTIVATION_PER_TOKEN_HIDDEN * max_num_batched_tokens * hidden_size * 2.0
    return hbm_bytes * utilization - weight_bytes_per_gpu - activation - NON_TORCH_GIB * 2**30


def kv_pool_tokens(cost: Any, utilization: float, max_num_batched_tokens: int) -> int:
    """The engine's KV pool per instance, in tokens (0 when the weights leave none)."""
    per_gpu = kv_pool_bytes_per_gpu(
        float(cost.gpu.hbm_bytes),
        utilization,
        float(cost.model.weight_bytes(cost.weight_dtype)) / cost.tp,
        int(cost.model.hidden_size),
        max_num_batched_tokens,
    )
    per_token = cost.bytes_per_token_per_rank or cost.model.kv_window_bytes_per_token_per_rank(
        cost.kv_dtype, cost.tp
    )
    if per_gpu <= 0 or per_token <= 0:
        return 0
    return int(per_gpu // per_token)

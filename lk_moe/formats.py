"""The engine's expert formats, one row each: the id, the vLLM parameter names the engine reads (as
vLLM 0.33's MoE method holds them after loading, except where lvllm's hand-over says otherwise), and
what the format can do. `MoELayer`, the GPU paths, the plugin's layer policy and the tests read this
table. The module itself is plain Python (importing it still loads the lk_moe package, torch and
the engine); the C++ side of each row is csrc/cpu/formats/<family>.cpp, and `_C.formats()` lists
its rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class Format:
    name: str
    family: str  # "bf16": 16-bit floats; "byte": one-byte codes + fp32 scales; "four_bit": 4-bit codes + scales
    tensors: Tuple[str, ...]  # vLLM parameter names, in the engine's argument order
    optional: Tuple[str, ...] = ()  # passed only when vLLM's method created them
    # What the engine computes with it (the model picks one): every format's kernels end in the same
    # activation step (csrc/cpu/kernels/simd.h gate_act_16): silu, silu_clamp (silu with vLLM's swiglu_limit,
    # DeepSeek-V4), situ (Kimi's SituGLU, Kimi-K3), swigluoai (gpt-oss; MiniMax-M3's, with gate and up rows
    # not interleaved).
    activations: Tuple[str, ...] = ("silu", "silu_clamp", "situ", "swigluoai")
    biases: bool = False  # expert biases (w13_bias / w2_bias)
    gpu_path: bool = True  # streamed prefill and GPU-resident layers (lk_moe.hybrid)


TABLE = (
    # bf16 / fp16: w13 [E, 2I, H] (rows gate then up), w2 [E, H, I]; fp16 is repacked as bf16.
    Format("bf16", "bf16", ("w13_weight", "w2_weight")),
    # FP8 block (Fp8MoEMethod): e4m3 codes as bf16's shapes, fp32 scales per (rows x cols) block
    # [E, 2I/bn, H/bk] / [E, H/bn, I/bk].
    Format("fp8_block", "byte", ("w13_weight", "w2_weight", "w13_weight_scale_inv", "w2_weight_scale_inv")),
    # compressed-tensors FP8 / INT8 per output channel: codes as bf16's shapes, fp32 scales [E, N, 1].
    Format("fp8_channel", "byte", ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale")),
    Format("int8_channel", "byte", ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale")),
    # OCP MX FP8 (ModelOptMxFp8FusedMoE, as it creates them: MiniMax-M3's release): e4m3 codes as bf16's shapes,
    # uint8 e8m0 scales per output row and 32 inputs [E, 2I, H/32] / [E, H, I/32]; weight = code * 2^(scale - 127).
    # The GPU paths dequantize it by torch ops (lk_moe.gpu_dequant.dequant_mx_blocks); a GPU-resident layer stays
    # vLLM's own method.
    Format("mxfp8", "byte", ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale")),
    # compressed-tensors WNA16 int4, K-first: packed int32 [E, H/8, 2I] / [E, I/8, H], bf16/fp16 scales
    # [E, H/gs, 2I] / [E, I/gs, H], optional zero points [E, H/gs, 2I/8] / [E, I/gs, H/8] (asymmetric).
    # vLLM 0.33 holds them N-first (the checkpoint's layout); lvllm's hand-over transposes them.
    Format("wna16_int4", "four_bit", ("w13_weight_packed", "w2_weight_packed", "w13_weight_scale", "w2_weight_scale"),
           optional=("w13_weight_zero_point", "w2_weight_zero_point")),
    # OCP MX FP4 (GptOssMxfp4MoEMethod / Mxfp4MoEMethod): uint8 e2m1 pairs [E, 2I, H/2] / [E, H, I/2]
    # (element 2i in the low nibble), uint8 e8m0 scales [E, 2I, H/32] / [E, H, I/32]; optional bf16
    # w13_bias [E, 2I] / w2_bias [E, H] (gpt-oss). H, I may be padded. swigluoai is gpt-oss's activation.
    Format("mxfp4", "four_bit", ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"),
           optional=("w13_bias", "w2_bias"), biases=True),
    # ModelOpt NVFP4 (ModelOptNvFp4FusedMoE): uint8 e2m1 pairs [E, 2I, H/2] / [E, H, I/2], float8_e4m3fn
    # block scales [E, 2I, H/16] / [E, H, I/16], fp32 global scales (weight_scale_2) [E, 2] (gate, up) /
    # [E]; weight = e2m1 * block scale * global scale. Optional fp32 activation scales w13_input_scale
    # [E', 2] / w2_input_scale [E'] are checked and ignored (the engine computes W4A16-style).
    Format("nvfp4", "four_bit", ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale",
                                 "w13_weight_scale_2", "w2_weight_scale_2"),
           optional=("w13_input_scale", "w2_input_scale")),
)

FORMATS = {f.name: f for f in TABLE}
NAMES = tuple(FORMATS)
BYTE = tuple(f.name for f in TABLE if f.family == "byte")
FOUR_BIT = tuple(f.name for f in TABLE if f.family == "four_bit")
GPU = tuple(f.name for f in TABLE if f.gpu_path)


def get(name: str) -> Format:
    """The row of `name`; ValueError naming the supported formats otherwise."""
    f = FORMATS.get(name)
    if f is None:
        raise ValueError(f"unsupported expert format {name!r}; supported: {', '.join(NAMES)}")
    return f

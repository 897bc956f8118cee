"""Helper process for test_plugin_loads_checkpoints.py: build a tiny checkpoint's model with the
real vLLM 0.33.0 (CPU platform lent for construction; no GPU here), the plugin switched on, and
its real loader; then compare one hybrid layer's engine output with a reference computed
straight from the checkpoint files (their own layout, not vLLM's). Prints one JSON line.

Only lvllm's own GPU wrapper (lk_moe.HybridMoE, which needs CUDA) is replaced, by a holder of
the engine layer it would have wrapped."""
import json
import os
import sys

import torch

os.environ["LVLLM_MOE_NUMA_ENABLED"] = "1"
os.environ.setdefault("LK_THREADS", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import vllm.platforms as platforms  # noqa: E402
from vllm.platforms.cpu import CpuPlatform  # noqa: E402

platforms._current_platform = CpuPlatform()

import lk_moe.hybrid  # noqa: E402
import lvllm.runtime  # noqa: E402


class EngineLayerHolder:
    def __init__(self, w13, w2, *, layer, **kwargs):
        self.layer, self.streamer, self.kwargs = layer, None, kwargs


lk_moe.hybrid.HybridMoE = EngineLayerHolder
lvllm.runtime.WorkerRuntime.io = lambda self, *a, **k: None  # pinned buffers need CUDA
# DRAFT_TEST=1: build the MTP draft model vLLM's deepseek_mtp speculative decoding builds from the checkpoint
# (vLLM's own hf_config_override), not the target; its MoE layers follow LVLLM_DRAFT_MOE. DRAFT_TEST=eagle3: the
# EAGLE-3 draft at DRAFT_MODEL (vLLM's Eagle3LlamaForCausalLM), its weights compared with the draft's files.
# DRAFT_TEST=dspark: DeepSeek-V4.1's DSpark draft (its stages in the checkpoint, a block of DSPARK_BLOCK tokens).
DRAFT_METHOD = {"1": "mtp", "eagle3": "eagle3", "dspark": "dspark"}.get(os.environ.get("DRAFT_TEST", ""))
DRAFT = DRAFT_METHOD is not None
if os.environ.get("AUTOFIT_TEST_MACHINE") or DRAFT:  # resident layers here (there is no GPU)
    if os.environ.get("AUTOFIT_TEST_MACHINE"):  # LVLLM_AUTO_FIT on a described machine
        import lvllm.autofit_inputs
        from lvllm.autofit import Machine
        _described = Machine(**json.loads(os.environ["AUTOFIT_TEST_MACHINE"]))
        lvllm.autofit_inputs.describe_machine = lambda gpu_gib, util, host_gib=0, probe=True: _described
    # the plan's GPU-resident layers keep vLLM's own experts: its CPU kernel's prepacking needs vllm._C,
    # which this build lacks, and the test computes only hybrid layers
    from vllm.model_executor.layers.fused_moe.experts import cpu_moe
    cpu_moe.CPUUnquantizedExperts.process_weights_after_loading = lambda self, layer: None
    lvllm.runtime.WorkerRuntime.staging_for = lambda self, *a, **k: None  # the plan's GPU prefill: CUDA streams

from safetensors.torch import load_file  # noqa: E402
from vllm.config import LoadConfig, ModelConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed import init_distributed_environment, initialize_model_parallel  # noqa: E402
from vllm.model_executor.model_loader import get_model  # noqa: E402
from vllm.plugins import load_general_plugins  # noqa: E402

from lk_moe.reference import moe_reference, random_routing  # noqa: E402
from lvllm.testing.deepseek_v41 import DSPARK_BLOCK  # noqa: E402
from lvllm.cli.checkpoint_info import experts_per_token  # noqa: E402
from lvllm.testing.expert_reference import reference_layer, text_config  # noqa: E402
from lvllm.testing.tiny_checkpoint import LANGUAGE_MODEL_ONLY  # noqa: E402


def lend_marlin_backend():
    """vLLM's CPU platform cannot pick a WNA16 MoE backend (its int4 scalar type is missing
    without vLLM's compiled ops). Answer that one question as a CUDA machine would (Marlin, whose
    host tensors are K-first); the method, its create_weights and the loader stay vLLM's own."""
    from vllm.model_executor.layers.fused_moe.oracle.int_wna16 import WNA16MoEBackend
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_wna16 as wna16)
    wna16.select_wna16_moe_backend = lambda *a, **k: (WNA16MoEBackend.MARLIN, None)


def lend_nvfp4_backend():
    """ModelOptNvFp4FusedMoE.__init__ asks the NVFP4 oracle for a backend (select_nvfp4_moe_backend);
    on the CPU platform every candidate declines (FlashInfer/CUTLASS/Marlin need CUDA, the emulation
    backend's Triton experts need a CUDA-alike or XPU device), so construction raises NotImplementedError
    ("No NvFp4 MoE backend supports the deployment configuration"). Answer as a CUDA machine would
    (Marlin, W4A16); the method, its create_weights (the tensors the engine reads) and the loader stay
    vLLM's own. Its process_weights_after_loading, which would build the backend's kernel, is replaced by
    the plugin's hand-over anyway."""
    from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend
    from vllm.model_executor.layers.quantization import modelopt
    modelopt.select_nvfp4_moe_backend = lambda *a, **k: (NvFp4MoeBackend.MARLIN, None)


def lend_mxfp4_backend():
    """vLLM 0.33's MXFP4 oracle (select_mxfp4_moe_backend) finds no backend on the CPU platform, so
    the gpt-oss method's constructor raises. Answer as a CUDA machine would (Triton); the method, its
    create_weights and gpt-oss's own loader stay vLLM's."""
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend
    from vllm.model_executor.layers.quantization import mxfp4
    mxfp4.select_mxfp4_moe_backend = lambda *a, **k: (Mxfp4MoeBackend.TRITON, None)


def lend_int8_backend():
    """The same for compressed-tensors W8A8 INT8 (select_int8_moe_backend: no CPU-platform backend
    without vLLM's compiled CPU ops)."""
    from vllm.model_executor.layers.fused_moe.oracle.int8 import Int8MoeBackend
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_w8a8_int8 as int8)
    int8.select_int8_moe_backend = lambda *a, **k: (Int8MoeBackend.TRITON, None)


def lend_plain_cpu_gemm():
    """On a CPU with AMX tiles (and, for causal-conv weights, AVX512-BF16), vLLM's CPU platform packs
    small bf16 GEMMs (routers, norms' neighbours) for its sgl kernels, which live in vLLM's compiled CPU
    ops; the CUDA wheel installed here has none (`torch.ops._C.convert_weight_packed` is missing). Answer as a CPU without AMX would: the plain
    torch linear. Only the dense layers' GEMM choice changes; the MoE layers are the plugin's."""
    from vllm import _custom_ops
    from vllm.model_executor.layers import utils
    utils.check_cpu_sgl_kernel = lambda *a, **k: False
    # The same for the GDN layers' causal-conv weights (Qwen3-Next): no prepack without the compiled op.
    if hasattr(_custom_ops, "causal_conv1d_weight_pack"):
        delattr(_custom_ops, "causal_conv1d_weight_pack")
    # And for MLA (DeepSeek-V3, GLM-5, Kimi): on an AMX CPU vLLM picks its AMX_MLA backend, whose weight
    # processing packs with the same missing op; a CPU without AMX gets the reference CPU_MLA backend.
    import vllm.platforms.cpu as cpu_platform
    cpu_platform.torch.cpu._is_amx_tile_supported = lambda: False


def lend_deepseek_v4_cpu_attention():
    """vLLM's CPU DeepSeek-V4 attention packs its wo_a weight with a compiled CPU op of vLLM's
    (`torch.ops._C.convert_weight_packed`, missing from the CUDA wheel installed here) when weights are
    processed; leave wo_a as it was loaded. Only the attention's inference speed path changes; the MoE
    layers are the plugin's."""
    from vllm.models.deepseek_v4.cpu import cpu_sparse
    cpu_sparse.DeepseekV4CPUAttention._wrap_wo_a_process_weights_after_loading = lambda self: None


def lend_deepseek_v4_mxfp4_backend():
    """DeepSeek-V4's MXFP4 experts pick their backend through their own oracle
    (select_deepseek_v4_mxfp4_moe_backend), which finds none on the CPU platform (a CPU without AMX,
    or with AMX hidden by lend_plain_cpu_gemm). Answer as a Hopper GPU would (Marlin: the model's
    sizes stay unpadded at these shapes); the method, its create_weights and the loader stay vLLM's."""
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend
    from vllm.model_executor.layers.quantization import mxfp4
    mxfp4.select_deepseek_v4_mxfp4_moe_backend = lambda *a, **k: (Mxfp4MoeBackend.MARLIN, None)


def lend_deepseek_v4_gpu_scale_names():
    """vLLM's CPU build of DeepSeek-V4 (models/deepseek_v4/cpu) renames every ".input_scale" to ".input_scale_2" for
    its own CPU experts; the GPU build (models/deepseek_v4/nvidia), which a hybrid run loads, keeps the name that
    ModelOpt's NVFP4 method registers (w13_input_scale). Load as the GPU build does."""
    from vllm.models.deepseek_v4.cpu import model
    model.DeepseekV4ForCausalLM.hf_to_vllm_mapper.orig_to_new_suffix.pop(".input_scale", None)


def lend_unquantized_moe_backend():
    """MiniMax-M3's bf16 experts (vLLM's swigluoai_uninterleave activation) and Kimi-K3's (SITU): vLLM's CPU MoE
    backend does not compute those activations, so the unquantized oracle finds no backend on the CPU platform. Answer
    as a CUDA machine would (Triton); the method, its create_weights and the loader stay vLLM's, and the hand-over
    replaces its kernel."""
    from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as method
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend
    method.select_unquantized_moe_backend = lambda *a, **k: (UnquantizedMoeBackend.TRITON, None)


def lend_qwen4_exp_cpu_parts():
    """Qwen3.8-Flash-Next (Qwen4Exp): its sparse-indexer attention (QSA) refuses construction without FlashAttention
    (`is_flash_attn_varlen_func_available`, False on the CPU platform): answer as a CUDA machine would. Its PLE
    tables go to pinned host memory by default, which needs a CUDA driver: main() builds them in plain memory
    (EngramConfig(cpu_offload=False)). Only attention and the PLE tables are concerned; the MoE layers are the
    plugin's."""
    import vllm.models.qwen4_exp.nvidia.model  # noqa: F401  (first: nvidia.qsa imports it)
    from vllm.models.qwen4_exp.nvidia import qsa
    qsa.is_flash_attn_varlen_func_available = lambda: True


def lend_prefix_caching():
    """Kimi-K3 (KDA linear attention beside MLA; GLM-5.3 has the same, but its DSA sparse attention has no CPU
    backend at all, as GLM-5's): vLLM's CPU platform turns prefix caching off for MLA without AMX (the AMX MLA
    backend is hidden by lend_plain_cpu_gemm), and the KDA layers' mamba block size is then refused by VllmConfig's
    validation; keep prefix caching as a CUDA machine does. Only the attention's cache setup is concerned; the MoE
    layers are the plugin's."""
    orig = CpuPlatform.check_and_update_config.__func__

    def keep_prefix_caching(cls, vllm_config):
        before = vllm_config.cache_config.enable_prefix_caching
        orig(cls, vllm_config)
        vllm_config.cache_config.enable_prefix_caching = before

    CpuPlatform.check_and_update_config = classmethod(keep_prefix_caching)


def lend_no_cuda_streams():
    """Constructors that make auxiliary CUDA streams (used only in forward, to overlap work) get None."""
    class NoStream:
        def __new__(cls, *a, **k):
            return None

    torch.cuda.Stream = NoStream


def lend_kimi_k3_cpu_parts():
    """Kimi-K3: prefix caching (lend_prefix_caching), the auxiliary CUDA stream its constructor makes
    (lend_no_cuda_streams), and its SituGLU experts' backend question (lend_unquantized_moe_backend)."""
    lend_prefix_caching()
    lend_no_cuda_streams()
    lend_unquantized_moe_backend()


def lend_deepseek_v4_mtp_parts():
    """DeepSeek-V4's MTP draft (DRAFT_TEST=1): vLLM's CPU package has only a stub that refuses MTP, so build its GPU
    one (vllm.models.deepseek_v4.nvidia.mtp: the same weights and layers), whose constructor makes CUDA streams
    (lend_no_cuda_streams), asks the GPU for its FP8 einsum recipe (the o-projection's kernel choice; a Hopper's
    answer) and meets the backend question of its MoE layers' experts (lend_unquantized_moe_backend). The MoE
    layers are the plugin's; the loader and the draft model are vLLM's."""
    import vllm.models.deepseek_v4 as v4
    from vllm.models.deepseek_v4.nvidia import flashmla, mtp

    lend_no_cuda_streams()
    v4.DeepSeekV4MTP = mtp.DeepSeekV4MTP
    flashmla.compute_fp8_einsum_recipe = lambda block_size=128: ((1, 128, 128), False)
    lend_unquantized_moe_backend()


UNLOADED: dict = {}  # parameter name -> elements the checkpoint left unset (lend_load_coverage)


def lend_load_coverage():
    """Every float parameter NaN before vLLM's loader runs (vLLM leaves new parameters uninitialised): whatever is
    NaN after it (UNLOADED) no checkpoint tensor reached, a shard of a fused projection included, which vLLM's own
    tracking (per parameter) does not see. Rows a fused weight is padded with (pad_rows: never loaded) and the
    attention's quantization parameters (q/k/v/prob scales, q/k/v zero points: vLLM's defaults where a checkpoint
    has none) are left out."""
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    load = DefaultModelLoader.load_weights
    defaulted = ("q_scale", "k_scale", "v_scale", "prob_scale", "q_zero_point", "k_zero_point", "v_zero_point")

    def pad_rows(m, parent) -> int:
        """A fused weight's padding rows: the module's padding_size, or its last shard where that is the padding
        its owner adds (pad_size: Qwen3.8-Flash-Next's hyper-connection GEMM padded to 16 rows)."""
        owner_pad = getattr(parent, "pad_size", 0)
        return getattr(m, "padding_size", 0) or (owner_pad if (getattr(m, "output_sizes", None) or [0])[-1] == owner_pad
                                                 else 0)

    def tracked(model):
        modules = dict(model.named_modules())
        for name, m in modules.items():
            parent = modules.get(name.rpartition(".")[0])
            for pn, p in m.named_parameters(recurse=False):
                if p.is_floating_point() and pn not in defaulted:
                    pad = pad_rows(m, parent) if pn == "weight" else 0
                    yield f"{name}.{pn}", p.data[:-pad] if pad else p.data

    def load_and_track(self, model, model_config):
        for _, t in tracked(model):
            t.fill_(float("nan"))
        load(self, model, model_config)
        for name, t in tracked(model):
            unset = int(torch.isnan(t).sum())
            if unset:
                UNLOADED[name] = unset
    DefaultModelLoader.load_weights = load_and_track


def lend_deepseek_v41_cpu_parts():
    """DeepSeek-V4.1's construction on the CPU (its GPU model: vLLM's CPU package has none): DeepSeek-V4's CPU
    attention question, CUDA streams, its o-projection's FP8 einsum recipe (a Hopper's answer), the MoE backend
    questions (unquantized and MXFP4), the GPU's SM count its Engram embedding sizes its lookup by (a Hopper's
    132), and the FP8 quantization config class a CUDA platform picks (V4.1's: the CPU platform picks V4's, which does
    not know model_type deepseek_v41 and leaves the checkpoint to plain Fp8Config); build it with
    EngramConfig(cpu_offload=False) (its tables in plain memory, not pinned)."""
    import types

    from vllm.models import deepseek_v4, deepseek_v41
    from vllm.models.deepseek_v41.nvidia import flashmla
    deepseek_v4.DeepseekV4FP8Config = deepseek_v41.DeepseekV4FP8Config
    lend_deepseek_v4_cpu_attention()
    lend_no_cuda_streams()
    lend_unquantized_moe_backend()
    lend_deepseek_v4_mxfp4_backend()
    flashmla.compute_fp8_einsum_recipe = lambda block_size=128: ((1, 128, 128), False)
    torch.accelerator.current_device_index = lambda: 0
    torch.cuda.get_device_properties = lambda *a: types.SimpleNamespace(multi_processor_count=132, major=9, minor=0)


LENDERS = {"mxfp4_ct_a8": lend_deepseek_v4_mxfp4_backend, "w4a16": lend_marlin_backend, "nvfp4": lend_nvfp4_backend, "int8_channel": lend_int8_backend}
ARCH_LENDERS = {"gpt_oss": lend_mxfp4_backend, "deepseek_v4": lend_deepseek_v4_cpu_attention,
                "minimax_m3": lend_unquantized_moe_backend, "qwen4_exp": lend_qwen4_exp_cpu_parts,
                "qwen4_exp_vl": lend_qwen4_exp_cpu_parts,
                "kimi_k3": lend_kimi_k3_cpu_parts, "deepseek_v41": lend_deepseek_v41_cpu_parts}
# Kimi-K3's compressed-tensors MXFP4 experts: its quantization config hands them to vLLM's Mxfp4MoEMethod, which asks
# DeepSeek-V4's backend question
QUANT_LENDERS = {("deepseek_v4", "mxfp4"): lend_deepseek_v4_mxfp4_backend,
                 ("kimi_k3", "mxfp4_ct"): lend_deepseek_v4_mxfp4_backend,
                 ("deepseek_v4", "nvfp4"): lend_deepseek_v4_gpu_scale_names}


def lend_for(arch: str, quant: str) -> None:
    """What this checkpoint's construction on the CPU needs: its format's, its architecture's and their pair's
    lenders (dev/list_vllm_params.py builds with them too)."""
    for table, key in ((LENDERS, quant), (ARCH_LENDERS, arch), (QUANT_LENDERS, (arch, quant))):
        if key in table:
            table[key]()


def eagle3_weights_as_written(model, draft_dir, spec_config) -> dict:
    """Whether vLLM's EAGLE-3 draft holds what the draft's files say, each parameter against its release tensors
    (q/k/v and gate/up fused vLLM's way); the draft vocabulary's target ids (vLLM keeps d2t's offsets)."""
    t = load_file(os.path.join(draft_dir, "model.safetensors"))
    p = dict(model.named_parameters())
    m = "midlayer."
    want = {"model.layers.0.self_attn.qkv_proj.weight": torch.cat([t[m + f"self_attn.{x}_proj.weight"] for x in "qkv"]),
            "model.layers.0.self_attn.o_proj.weight": t[m + "self_attn.o_proj.weight"],
            "model.layers.0.mlp.gate_up_proj.weight": torch.cat([t[m + "mlp.gate_proj.weight"], t[m + "mlp.up_proj.weight"]]),
            "model.layers.0.mlp.down_proj.weight": t[m + "mlp.down_proj.weight"],
            "model.layers.0.hidden_norm.weight": t[m + "hidden_norm.weight"],
            "model.fc.weight": t["fc.weight"], "model.norm.weight": t["norm.weight"], "lm_head.weight": t["lm_head.weight"]}
    differ = sorted(n for n, w in want.items() if n not in p or not torch.equal(p[n].data.cpu(), w))
    ids = model.draft_id_to_target_id
    vocab_ok = ids is not None and torch.equal(torch.arange(len(ids)) + ids.cpu(), t["t2d"].nonzero().flatten())
    # the target layers vLLM's model runner (V2, 0.33's default) hands the draft, read from the draft's config
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config
    aux = get_eagle3_aux_layers_from_config(spec_config)
    return {"weights_checked": len(want), "weights_differ": differ, "draft_vocab_maps_to_target": bool(vocab_ok),
            "aux_layers": list(aux or ())}


def main():
    model_dir, arch, quant, layer_idx = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    lend_for(arch, quant)
    if DRAFT_METHOD == "mtp" and arch == "deepseek_v4":
        lend_deepseek_v4_mtp_parts()
    lend_plain_cpu_gemm()
    if quant != "dummy":
        lend_load_coverage()
    load_general_plugins()
    # a release written without its vision tower: built as `--language-model-only` builds it
    target = ModelConfig(model=model_dir, dtype="bfloat16", max_model_len=512,
                         language_model_only=arch in LANGUAGE_MODEL_ONLY)
    engram = {}
    if ARCH_LENDERS.get(arch) in (lend_qwen4_exp_cpu_parts, lend_deepseek_v41_cpu_parts):  # tables in plain memory
        from vllm.config import EngramConfig
        engram = dict(engram_config=EngramConfig(cpu_offload=False))
    vc = VllmConfig(model_config=target, load_config=LoadConfig(load_format="dummy" if quant == "dummy" else "auto"),
                    **engram)
    if DRAFT:  # as vLLM's engine sets it up for --speculative-config '{"method": "mtp" / "eagle3", ...}'
        from vllm.config.speculative import SpeculativeConfig
        draft = dict(model=os.environ["DRAFT_MODEL"], num_speculative_tokens=3) if DRAFT_METHOD == "eagle3" else \
            dict(num_speculative_tokens=DSPARK_BLOCK if DRAFT_METHOD == "dspark" else 1)
        vc.speculative_config = SpeculativeConfig(method=DRAFT_METHOD, target_model_config=target,
                                                  target_parallel_config=vc.parallel_config, **draft)
    # Optional: tensor parallelism, one process per rank (argv 6, 7 = world size, rank; argv 8 =
    # where to save this rank's partial output; rank 0 also saves the reference).
    world = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    rank = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    vc.parallel_config.tensor_parallel_size = world
    vc.parallel_config.world_size = world
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{sys.argv[5]}")
        initialize_model_parallel(world)
        if DRAFT:  # the target first, then the draft beside it under the model tag vLLM's proposers build drafts
            # with (llm_base_proposer._get_model), both in one config as in vLLM's engine: a draft layer that takes
            # a target layer's name stops here as it stops vLLM ("Duplicate layer name")
            from vllm.compilation.backends import set_model_tag
            get_model(vllm_config=vc)  # the target
            with set_model_tag("dspark_head" if DRAFT_METHOD == "dspark" else "eagle_head"):
                model = get_model(vllm_config=vc, model_config=vc.speculative_config.draft_model_config)
        else:
            model = get_model(vllm_config=vc)
    hybrid = {name: m.quant_method for name, m in model.named_modules()
              if hasattr(getattr(m, "quant_method", None), "_lk_hybrid")}
    if DRAFT:
        rt = lvllm.runtime.get_runtime()
        loaded = (eagle3_weights_as_written(model, os.environ["DRAFT_MODEL"], vc.speculative_config)
                  if DRAFT_METHOD == "eagle3" else {})
        print("DRAFT " + json.dumps({"model": type(model).__name__, "draft_layers": rt.draft_layers,
                                     "hybrid": sorted(hybrid), "draft_moe": rt.cfg.draft_moe, **loaded}))
        if not hybrid:
            return
    # (a DSpark draft numbers its stages' modules from 0, their layer prefixes after the target's)
    index = layer_idx - text_config(model_dir)["num_hidden_layers"] if DRAFT_METHOD == "dspark" else layer_idx
    method = next(qm for name, qm in hybrid.items() if f".layers.{index}." in name)
    engine = method._lk_hybrid.layer
    ref = reference_layer(model_dir, arch, quant, layer_idx, draft=DRAFT)
    w13, w2 = ref.pop("w13"), ref.pop("w2")
    g = torch.Generator().manual_seed(0)
    M = 37
    K = experts_per_token(text_config(model_dir))
    x = torch.randn(M, w2.shape[1], generator=g)
    if ref.get("activation") == "silu_clamp":  # pre-activations of ~limit: the clamps engage (and are checked)
        x *= ref["swiglu_limit"]
    x = x.to(torch.bfloat16)
    ids, wts = random_routing(M, w13.shape[0], K, generator=g)
    out = engine.forward(x, ids, wts).float()
    if world > 1:
        torch.save(out, f"{sys.argv[8]}/rank{rank}.pt")
        if rank == 0:
            torch.save(moe_reference(x, w13, w2, ids, wts, **ref), f"{sys.argv[8]}/reference.pt")
        print("RESULT " + json.dumps({"hybrid_layers": len(hybrid), "format": engine.format, "rank": rank,
                                      "intermediate": engine.intermediate_size}))
        return
    want = moe_reference(x, w13, w2, ids, wts, **ref)
    rel = ((out - want).norm() / want.norm()).item()
    for shared, param in (("has_own_embed_tokens", "model.embed_tokens.weight"), ("has_own_lm_head", "lm_head.weight")):
        if DRAFT and getattr(type(model), shared, True) is False:  # the target's, aliased by vLLM's speculator after
            UNLOADED.pop(param, None)
    rt = lvllm.runtime.get_runtime()
    print("RESULT " + json.dumps({"hybrid_layers": len(hybrid), "format": engine.format, "rel_rms": rel,
                                  "unloaded": UNLOADED,
                                  "method": type(method).__name__, "activation": engine.activation,
                                  "resident": sorted(rt.cfg.resident_layers), "threads": rt.threads.threads,
                                  "gpu_prefill_min_batch": rt.cfg.gpu_prefill_min_batch, "fit_lines": rt.fit_lines}))


if __name__ == "__main__":
    main()

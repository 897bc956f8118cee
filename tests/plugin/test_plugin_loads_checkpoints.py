"""The plugin through the real vLLM 0.33.0 model construction and loader, on the CPU (CI): tiny
checkpoints of real architectures and formats are built, loaded, handed to the engine, and one
hybrid layer's output is compared with a reference decoded straight from the checkpoint files
(their own layouts: N-first packing, interleaved gpt-oss rows, MXFP4 blocks), so every layout
step in between (vLLM's loader, its transposes and TP narrowing, our hand-off) is checked.

Every float parameter is NaN before vLLM's loader runs, and none may be NaN after it (vllm_cpu_load.lend_load_coverage):
a tensor the checkpoint lacks (one shard of a fused projection too, which vLLM's own per-parameter tracking misses)
fails the case.

Tolerance: relative RMS <= 0.01. The engine rounds the layer input and the SwiGLU output to bf16
(2^-8 relative each; measured 0.0023-0.0024 on every case); a wrong layout (transposed, swapped
gate/up, wrong nibble or scale) gives O(1).

Each case runs in its own process (vLLM's distributed state is per process). vLLM's CPU platform
stands in for the GPU one during construction (and answers the W4A16 and NVFP4 backend questions as
a CUDA machine would: Marlin; on the CPU platform ModelOptNvFp4FusedMoE's constructor finds no NVFP4
backend and raises, see vllm_cpu_load.lend_nvfp4_backend; the compressed-tensors W8A8 FP8 / INT8
per-channel methods need no such help); MLA models take vLLM's reference CPU_MLA backend (the AMX one
packs its weights with a compiled op of vLLM's CPU build, see vllm_cpu_load.lend_plain_cpu_gemm); GLM-5's
DSA sparse attention has no CPU backend (tests/e2e on the GPU machine covers it); Qwen3.8-Flash-Next's QSA attention
asks for FlashAttention and its PLE tables for pinned memory (vllm_cpu_load.lend_qwen4_exp_cpu_parts); Kimi-K3 loses
prefix caching (MLA on a CPU without AMX) which its KDA layers need, makes a CUDA stream in its constructor and has
SituGLU experts no CPU MoE backend computes (vllm_cpu_load.lend_kimi_k3_cpu_parts); DeepSeek-V4's CPU build renames the
input scales of NVFP4 experts, which its GPU build keeps (vllm_cpu_load.lend_deepseek_v4_gpu_scale_names)."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from lvllm.testing.tiny_checkpoint import make_checkpoint  # noqa: E402

HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_cpu_load.py")
# FP8 / NVFP4 / W8A8 attention needs GPU kernels: these checkpoints keep attention in bf16 (experts quantized).
EXPERTS_ONLY = ("fp8", "nvfp4", "fp8_channel", "int8_channel", "mxfp8")
CASES = [  # arch, quant, first MoE layer, expected engine format
    ("qwen3_moe", "bf16", 0, "bf16"),
    ("mixtral", "bf16", 0, "bf16"),
    ("qwen3_moe", "fp8", 0, "fp8_block"),
    ("qwen3_moe", "w4a16", 0, "wna16_int4"),
    ("gpt_oss", "bf16", 0, "mxfp4"),
    ("qwen3_moe", "nvfp4", 0, "nvfp4"),  # ModelOpt NVFP4 (gate/up global scales differ)
    ("qwen3_moe", "fp8_channel", 0, "fp8_channel"),  # compressed-tensors FP8 per channel (FP8-dynamic)
    ("qwen3_moe", "mxfp8", 0, "mxfp8"),  # ModelOpt MXFP8 (OCP MX FP8: e8m0 scales per row and 32 inputs)
    ("mixtral", "int8_channel", 0, "int8_channel"),  # compressed-tensors INT8 W8A8 per channel
    ("qwen3_moe", "mxfp4_ct", 0, "mxfp4"),  # compressed-tensors MXFP4 experts (Kimi-K3's release format)
    ("qwen3_moe", "mxfp4_ct_a8", 0, "mxfp4"),  # and its W4A8 variant (FP8 activations: vLLM's Mxfp4MoEMethod under it)
    ("minimax_m2", "bf16", 0, "bf16"),  # w1/w2/w3 names, sigmoid routing with a selection bias
    ("minimax_m2", "fp8", 0, "fp8_block"),  # as MiniMax-M2 is released: FP8 block experts
    ("qwen3_next", "bf16", 0, "bf16"),  # gated DeltaNet + gated attention layers, gated shared expert
    ("qwen3_next", "fp8", 0, "fp8_block"),  # as Qwen3-Next-80B-A3B-*-FP8 is released
    ("qwen3_5_moe", "bf16", 0, "bf16"),  # Qwen3.5-MoE's text model: the GDN input projections split
    ("qwen3_5_moe", "fp8", 0, "fp8_block"),  # as Qwen3.5-*-FP8 is released
    ("qwen3_5_moe_vl", "bf16", 0, "bf16"),  # as Qwen3.5-MoE is released: the text model beside a vision tower
    ("deepseek_v4", "bf16", 0, "bf16"),  # hash-routed layer 0: the engine sees ids and weights only
    ("deepseek_v4", "bf16", 2, "bf16"),  # sqrtsoftplus-routed layer (with a CSA attention), clamped SwiGLU
    ("deepseek_v4", "mxfp4", 1, "mxfp4"),  # as DeepSeek-V4-Flash is released: MXFP4 experts (vLLM's Mxfp4MoEMethod)
    ("deepseek_v4", "fp8", 1, "fp8_block"),  # as V4-Flash-Base: FP8 block experts (expert_dtype "fp8", fp32 scales)
    ("deepseek_v4", "nvfp4", 1, "nvfp4"),  # NVFP4 experts (moe_quant_algo "NVFP4": ModelOpt's method under V4's config)
    ("deepseek_v41", "bf16", 1, "bf16"),  # DeepSeek-V4.1: kv / index source layers, Engram FP8 tables, a vision tower
    ("deepseek_v41", "mxfp4", 1, "mxfp4"),  # and its MXFP4 experts (V4.1's own FP8 quantization config class)
    ("deepseek_v41", "fp8", 1, "fp8_block"),  # and the FP8 block / NVFP4 experts that config selects too
    ("deepseek_v41", "nvfp4", 1, "nvfp4"),
    ("qwen3_moe", "dummy", 0, "bf16"),  # --load-format dummy: host experts filled by the plugin
    ("minimax_m3", "dummy", 1, "bf16"),  # MiniMax-M3 with dummy weights: swigluoai on [gate; up] rows
    ("minimax_m3", "bf16", 1, "bf16"),  # and its bf16 checkpoint (w1 gate / w3 up through vLLM's own loader)
    ("minimax_m3", "mxfp8", 1, "mxfp8"),  # and as its MXFP8 release (scales under weight_scale_inv, quant_method mxfp8)
    ("kimi_k3", "dummy", 1, "bf16"),  # Kimi-K3 with dummy weights: KDA + MLA, latent MoE, SituGLU (beta 4, linear 25)
    ("kimi_k3", "bf16", 1, "bf16"),  # and its bf16 checkpoint (KimiLinear's names, the latent MoE's) with MoonViT
    ("kimi_k3", "mxfp4_ct", 1, "mxfp4"),  # and as released: compressed-tensors MXFP4 experts on the latent width
    ("qwen4_exp", "dummy", 0, "bf16"),  # Qwen3.8-Flash-Next: GDN + QSA, hyper-connections, PLE, MoE in every layer
    ("qwen4_exp", "bf16", 3, "bf16"),  # and its bf16 checkpoint (transformers' Hub names) through vLLM's loader
    ("qwen4_exp", "fp8", 3, "fp8_block"),  # and with FP8 block experts
    ("qwen4_exp", "nvfp4", 3, "nvfp4"),  # and ModelOpt NVFP4 ones
    ("qwen4_exp_vl", "bf16", 3, "bf16"),  # its vision-language layout (Qwen4ExpForConditionalGeneration), text only
    ("deepseek_v3", "bf16", 1, "bf16"),  # MLA (vLLM's reference CPU_MLA backend), grouped sigmoid routing
    ("deepseek_v3", "fp8", 1, "fp8_block"),  # as DeepSeek-V3 / R1 are released
    ("deepseek_v3", "w4a16", 1, "wna16_int4"),  # Kimi-K2-Thinking's int4 experts on its DeepSeek-V3 architecture
    ("glm4_moe", "bf16", 1, "bf16"),  # a dense first layer, partial rotary, attention biases
    ("kimi_k25", "bf16", 1, "bf16"),  # as Kimi-K2.5 is released: DeepSeek-V3 under language_model. beside MoonViT
    ("kimi_k25", "w4a16", 1, "wna16_int4"),  # and its int4 experts (quantization_config in text_config)
]
# The activation the engine must compute (the model's swiglu_limit makes vLLM's silu a clamped one).
ACTIVATIONS = {"gpt_oss": "swigluoai", "deepseek_v4": "silu_clamp", "deepseek_v41": "silu_clamp",
               "minimax_m3": "swigluoai", "kimi_k3": "situ"}
# The vLLM method the plugin must have recognized (where several could read a format's tensors), by quant.
VLLM_METHODS = {"mxfp8": "ModelOptMxFp8FusedMoE", "fp8_channel": "CompressedTensorsW8A8Fp8MoEMethod", "int8_channel": "CompressedTensorsW8A8Int8MoEMethod",
                "mxfp4_ct": "CompressedTensorsW4A4Mxfp4MoEMethod", "mxfp4_ct_a8": "CompressedTensorsW4A8Mxfp4MoEMethod"}
# ... where an architecture's own quantization config picks another (Kimi-K3's: the MXFP4 method DeepSeek-V4's takes)
ARCH_METHODS = {("kimi_k3", "mxfp4_ct"): "Mxfp4MoEMethod", ("deepseek_v41", "mxfp4"): "Mxfp4MoEMethod",
                **{(a, "fp8"): "Fp8MoEMethod" for a in ("deepseek_v4", "deepseek_v41")},
                **{(a, "nvfp4"): "ModelOptNvFp4FusedMoE" for a in ("deepseek_v4", "deepseek_v41")}}


def _run_helper(model, arch, quant, layer, port, **env_extra):
    """vllm_cpu_load.py on `model` in its own process, with none of this process's LVLLM_ / LK_ settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LVLLM_", "LK_"))}
    env.update(env_extra)
    return subprocess.run([sys.executable, HELPER, model, arch, quant, str(layer), str(port)], env=env,
                          capture_output=True, text=True, timeout=600)


def _last(p, tag: str) -> dict:
    """The JSON of the helper's last line starting with `tag` ("RESULT", "DRAFT"); the output when it has none."""
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(tag + " ")]
    assert p.returncode == 0 and lines, (p.stdout + p.stderr)[-4000:]
    return json.loads(lines[-1][len(tag) + 1:])


@pytest.mark.parametrize("i,arch,quant,layer,fmt", [(i, *c) for i, c in enumerate(CASES)],
                         ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_loaded_experts_compute_what_the_checkpoint_says(tmp_path, i, arch, quant, layer, fmt):
    written = "bf16" if quant == "dummy" else quant
    model = make_checkpoint(arch, str(tmp_path / arch), quant=written, experts_only=quant in EXPERTS_ONLY)
    r = _last(_run_helper(model, arch, quant, layer, 29700 + (os.getpid() % 200) * 5 + i, LK_THREADS="2"), "RESULT")
    print(f"{arch} {quant}: {r}")
    assert r["format"] == fmt and r["hybrid_layers"] >= 3
    assert r["activation"] == ACTIVATIONS.get(arch, "silu"), r
    assert r["method"] == ARCH_METHODS.get((arch, quant), VLLM_METHODS.get(quant, r["method"])), r
    assert r["rel_rms"] <= 0.01, r
    assert r.get("unloaded", {}) == {}, f"parameters (elements) no checkpoint tensor reached: {r['unloaded']}"


# arch -> vLLM's MTP draft model built from its checkpoint, where that model's MoE layer lives (L: the target's
# decoder-layer count) and the index of the draft module's own layer list that holds it
MTP_DRAFTS = {"deepseek_v3": ("DeepSeekMTP", "model.layers.{L}.mlp.experts", "{L}"),
              "glm4_moe": ("Glm4MoeMTP", "model.layers.{L}.mlp.experts", "{L}"),
              "kimi_k3": ("KimiK3MTP", "model.layers.{L}.block_sparse_moe.experts", "{L}"),
              "deepseek_v4": ("DeepSeekV4MTP", "model.layers.{L}.ffn.experts", "{L}"),  # mtp.0 in the checkpoint
              "qwen3_next": ("Qwen3NextMTP", "mtp.layers.0.mlp.experts", "0"),
              "qwen3_5_moe": ("Qwen3_5MoeMTP", "mtp.layers.0.mlp.experts", "0"),
              "qwen4_exp": ("Qwen4ExpMTP", "mtp.layers.{L}.mlp.experts", "0"),
              # numbered from 0 like the target's first layer: a draft by vLLM's model tag alone
              "minimax_m3": ("MiniMaxM3MTP", "model.layers.0.block_sparse_moe.experts", "0")}
# MTP layers filled by vLLM's dummy loader: Kimi-K3's (config only)
MTP_DUMMY = ("kimi_k3",)


# Kimi-K3's, DeepSeek-V4's and MiniMax-M3's draft layers on the GPU would be vLLM's own SituGLU / clamped-SwiGLU /
# swigluoai experts, which no CPU MoE backend computes (their GPU-resident default is in tests/e2e)
MTP_DRAFT_CASES = [(m, a) for a in MTP_DRAFTS for m in ("gpu", "cpu")
                   if m == "cpu" or a not in ("kimi_k3", "deepseek_v4", "minimax_m3")]


@pytest.mark.parametrize("draft_moe,arch", MTP_DRAFT_CASES, ids=[f"{m}-{a}" for m, a in MTP_DRAFT_CASES])
def test_mtp_draft_layers_follow_the_draft_rule(tmp_path, draft_moe, arch):
    """vLLM's own MTP draft model (what `--speculative-config '{"method": "mtp"}'` builds) from a checkpoint with an
    MTP layer as the family releases it (DeepSeek-V3, GLM-4.5: model.layers.<L>; Qwen3-Next, Qwen3.5: mtp.layers.0;
    DeepSeek-V4: mtp.0, vLLM's GPU draft model, see vllm_cpu_load.lend_deepseek_v4_mtp_parts; MTP_DUMMY: vLLM's
    dummy weights, the engine's host experts filled by the plugin; GLM-5's DSA has no CPU backend: tests/e2e on the
    GPU machine covers it): its MoE layer is the draft's, GPU-resident with vLLM's kernels by default
    (LVLLM_DRAFT_MOE=gpu) and on the engine with LVLLM_DRAFT_MOE=cpu, computing what the checkpoint's MTP experts
    say; never planned as one of the target's layers."""
    model = make_checkpoint(arch, str(tmp_path / f"{arch}-mtp"), mtp=1)
    config = json.load(open(os.path.join(model, "config.json")))
    L = config.get("text_config", config)["num_hidden_layers"]
    name, draft_layer, layer = (t.format(L=L) for t in MTP_DRAFTS[arch])
    port = 29700 + (os.getpid() % 200) * 5 + len(CASES) + 3 + 2 * list(MTP_DRAFTS).index(arch) + (draft_moe == "cpu")
    p = _run_helper(model, arch, "dummy" if arch in MTP_DUMMY else "bf16", layer, port, LK_THREADS="2", DRAFT_TEST="1",
                    LVLLM_DRAFT_MOE=draft_moe)
    d = _last(p, "DRAFT")
    assert d["model"] == name and d["draft_layers"] == [draft_layer], d
    if draft_moe == "gpu":
        assert d["hybrid"] == [], d
        return
    assert len(d["hybrid"]) == 1 and f"layers.{layer}." in d["hybrid"][0], d  # (module names: vLLM's attributes)
    r = _last(p, "RESULT")
    assert r["format"] == "bf16" and r["activation"] == ACTIVATIONS.get(arch, "silu") and r["rel_rms"] <= 0.01, r


def test_dspark_draft_layers_follow_the_draft_rule(tmp_path):
    """DeepSeek-V4.1's DSpark draft as `--speculative-config '{"method": "dspark", "num_speculative_tokens": 4}'`
    builds it (vLLM's DSparkDeepseekV4ForCausalLM under its dspark_head model tag) from a checkpoint with three stages
    (mtp.0-2): each stage's MoE layer is the draft's (prefixes after the target's 4 layers), on the engine with
    LVLLM_DRAFT_MOE=cpu computing what the checkpoint's mtp.2 experts say (clamped SwiGLU), and every draft parameter
    loaded but the embedding and head it shares with the target. (On the GPU by default: tests/e2e.)"""
    model = make_checkpoint("deepseek_v41", str(tmp_path / "v41-dspark"), mtp=3)
    port = 29700 + (os.getpid() % 200) * 5 + len(CASES) + 3 + 2 * len(MTP_DRAFTS)
    p = _run_helper(model, "deepseek_v41", "bf16", 6, port, LK_THREADS="2", DRAFT_TEST="dspark", LVLLM_DRAFT_MOE="cpu")
    d = _last(p, "DRAFT")
    assert d["model"] == "DSparkDeepseekV4ForCausalLM", d
    assert d["draft_layers"] == [f"model.layers.{i}.ffn.experts" for i in (4, 5, 6)] and len(d["hybrid"]) == 3, d
    r = _last(p, "RESULT")
    assert r["format"] == "bf16" and r["activation"] == "silu_clamp" and r["rel_rms"] <= 0.01, r
    assert r["unloaded"] == {}, f"draft parameters (elements) no checkpoint tensor reached: {r['unloaded']}"


def _autofit_run(tmp_path, machine: dict, port: int, settings=None):
    model = make_checkpoint("qwen3_moe", str(tmp_path / "qwen3_moe"))
    env = dict(settings or dict(LVLLM_AUTO_FIT="1", LVLLM_GPU_EXPERT_CACHE="0"), AUTOFIT_TEST_MACHINE=json.dumps(machine))
    return model, _run_helper(model, "qwen3_moe", "bf16", 3, port, **env)


def test_auto_fit_plans_at_the_first_moe_layer_through_vllms_construction(tmp_path):
    """LVLLM_AUTO_FIT=1 through vLLM 0.33.0's own model construction and loader (CPU; the machine described):
    host RAM that holds 2 of the tiny Qwen3-MoE's 4 layers' experts makes the first two GPU-resident, the
    rest hybrid and computing what the checkpoint says; the explicit LVLLM_GPU_EXPERT_CACHE=0 wins; threads
    (LK_THREADS wins) and the prefill threshold come from the plan. Host RAM for one layer and a GPU for 1.5:
    startup stops."""
    from lvllm.autofit import ENGINE_OVERHEAD, PROCESS_HOST_BYTES
    from lvllm.cli.checkpoint_info import read_checkpoint
    from lvllm.fit import RESERVE_BYTES, STAGING_BYTES, kv_bytes_per_token
    info = read_checkpoint(make_checkpoint("qwen3_moe", str(tmp_path / "probe")))
    layer = int(info.expert_bytes_per_layer * ENGINE_OVERHEAD)
    # a GPU whose VRAM after the weights, the reserve and two 512-token sequences holds `layers` MoE layers
    fixed = info.other_bytes + RESERVE_BYTES + STAGING_BYTES + 2 * 512 * kv_bytes_per_token(info.config, 512)
    gpu = lambda layers: int((fixed + layers * info.expert_bytes_per_layer) / 0.9)  # noqa: E731
    machine = dict(gpu_bytes=gpu(3), host_bytes=PROCESS_HOST_BYTES + int(2.5 * layer), cores=8,
                   read_gbps=50, h2d_gbps=25, isa="avx512_bf16")
    model, p = _autofit_run(tmp_path, machine, 29690 + os.getpid() % 100)
    r = _last(p, "RESULT")
    assert r["resident"] == [0, 1] and r["hybrid_layers"] == 2, r
    assert r["rel_rms"] <= 0.01 and r["gpu_prefill_min_batch"] >= 64, r
    log = "\n".join(r["fit_lines"])  # what the worker logs, one line per decision
    assert "host RAM holds the experts of 2 of 4 MoE layers: 2 GPU-resident layers needed" in log, log
    assert "GPU expert cache 0.00 GiB (set)" in log, log
    # the helper sets LK_THREADS=2: it wins over the plan's 7 of the described 8 cores
    assert r["threads"] == 2 and "engine threads 2 per rank (set; the plan would take 7)" in log, r
    # a machine where it cannot fit: the message, before any weight loads
    machine.update(gpu_bytes=gpu(1.5), host_bytes=PROCESS_HOST_BYTES + layer)
    _, p = _autofit_run(tmp_path, machine, 29890 + os.getpid() % 100)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "host RAM" in out and "short by" in out and "Options:" in out, out[-3000:]
    assert "Loading weights" not in out and "RESULT" not in out


def test_expert_cache_auto_is_the_plan_with_the_other_settings_held(tmp_path):
    """LVLLM_GPU_EXPERT_CACHE=auto without LVLLM_AUTO_FIT through vLLM's construction (CPU; the machine
    described): lvllm.autofit sizes the cache alone; no resident layers (none set), the default CPU prefill
    and threads stay. The described GPU leaves no slot after the KV cache: no cache, and the line says why."""
    from lvllm.autofit import PROCESS_HOST_BYTES
    from lvllm.cli.checkpoint_info import read_checkpoint
    from lvllm.fit import RESERVE_BYTES, STAGING_BYTES, kv_bytes_per_token
    info = read_checkpoint(make_checkpoint("qwen3_moe", str(tmp_path / "probe")))
    fixed = info.other_bytes + RESERVE_BYTES + STAGING_BYTES + 2 * 512 * kv_bytes_per_token(info.config, 512)
    machine = dict(gpu_bytes=int((fixed + 4096) / 0.9), host_bytes=PROCESS_HOST_BYTES + 8 * info.expert_bytes_per_layer,
                   cores=8, read_gbps=50, h2d_gbps=25, isa="avx512_bf16")
    _, p = _autofit_run(tmp_path, machine, 29790 + os.getpid() % 100, {"LVLLM_GPU_EXPERT_CACHE": "auto"})
    r = _last(p, "RESULT")
    assert r["resident"] == [] and r["hybrid_layers"] == 4 and r["gpu_prefill_min_batch"] == 0 and r["threads"] == 2, r
    log = "\n".join(r["fit_lines"])
    assert "GPU-resident MoE layers: 0 (set)" in log and "prefill on the CPU (set)" in log, log
    assert "no GPU expert cache: the 0.00 GiB left per GPU holds no slot of 0.8 MiB" in log, log


TP_CASES = [("qwen3_moe", "bf16"), ("qwen3_moe", "fp8"), ("qwen3_moe", "w4a16"), ("gpt_oss", "bf16"),
            ("qwen3_moe", "nvfp4"), ("qwen3_moe", "fp8_channel"), ("mixtral", "int8_channel"), ("minimax_m2", "fp8")]


@pytest.mark.parametrize("i,arch,quant", [(i, *c) for i, c in enumerate(TP_CASES)], ids=[f"{a}-{q}" for a, q in TP_CASES])
def test_tensor_parallel_shards_sum_to_the_layer(tmp_path, i, arch, quant):
    """TP=2 (two processes, gloo): vLLM narrows each expert for its rank (gpt-oss: its own loader,
    interleaved rows, w2_bias only on rank 0); each rank's engine holds that shard; vLLM would
    all-reduce the partial outputs: their sum must be the whole layer, each alone must not."""
    import torch
    model = make_checkpoint(arch, str(tmp_path / arch), quant=quant, experts_only=quant in EXPERTS_ONLY)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LVLLM_", "LK_"))}
    env["LK_THREADS"] = "1"
    port = str(30100 + (os.getpid() % 200) * 5 + i)
    procs = [subprocess.Popen([sys.executable, HELPER, model, arch, quant, "0", port, "2", str(r), str(tmp_path)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    ref = torch.load(tmp_path / "reference.pt")
    rel = ((ranks[0] + ranks[1] - ref).norm() / ref.norm()).item()
    alone = ((ranks[0] - ref).norm() / ref.norm()).item()
    print(f"{arch} {quant} TP=2: rel RMS of the sum {rel:.4f}, of rank 0 alone {alone:.3f}")
    assert rel <= 0.01 and alone > 0.1


def test_eagle3_draft_loads_as_released_beside_the_hybrid_target(tmp_path):
    """vLLM's own EAGLE-3 draft (`--speculative-config '{"method": "eagle3", "model": ...}'`) for the tiny Qwen3-MoE,
    from a draft written in the release layout (lvllm.testing.eagle3_draft): vLLM's Eagle3LlamaForCausalLM holds what
    its files say, its reduced vocabulary maps to the target's ids, and the plugin (switch on) plans no draft layer:
    EAGLE-3 drafts are dense and stay on the GPU."""
    from lvllm.testing.eagle3_draft import make_eagle3_draft
    model = make_checkpoint("qwen3_moe", str(tmp_path / "qwen3_moe"))
    draft = make_eagle3_draft(model, str(tmp_path / "qwen3_moe-eagle3"))
    port = 29700 + (os.getpid() % 200) * 5 + len(CASES) + 2
    d = _last(_run_helper(model, "qwen3_moe", "bf16", 1, port, LK_THREADS="2", DRAFT_TEST="eagle3", DRAFT_MODEL=draft),
              "DRAFT")
    print(d)
    assert d["model"] == "Eagle3LlamaForCausalLM", d
    assert d["weights_checked"] == 8 and d["weights_differ"] == [] and d["draft_vocab_maps_to_target"], d
    assert d["aux_layers"] == [1, 2, 3], d  # three distinct target layers for fc's three inputs (4-layer target)
    assert d["draft_layers"] == [] and d["hybrid"] == [], d

"""The newer MoE architectures end to end through the real vLLM 0.33.0, switch on vs off, as
tests/e2e/test_switch.py does for the older ones (its runs, criterion and teacher-forced fp32 check):
a file of its own so the older suites' device runs keep their size (`pytest tests/e2e/test_architectures.py`;
LVLLM_E2E_ARCHS=deepseek_v4,kimi_k25 runs only those architectures' vLLM runs).

Qwen3-Next: Gated-DeltaNet linear attention in 3 of 4 layers and gated full attention in the 4th (two
KV-cache groups: vLLM's padding marks hold for both), a shared expert behind a sigmoid gate in every
MoE layer (vLLM's, on the GPU, overlapping the CPU call).
GLM-5 (GlmMoeDsaForCausalLM): DeepSeek-V3's MLA and grouped sigmoid routing plus DSA's lightning indexer,
under the breakable CUDA graphs vLLM turns on for it; its first layer dense.
MiniMax-M2: w1/w2/w3 expert names, sigmoid routing with a selection bias, q/k norms over all heads.
Qwen3.5-MoE (its text model): Qwen3-Next's layers with the GDN input projections split as released;
and as released (qwen3_5_moe_vl): the text model under model.language_model. beside a vision tower (text
prompts here; vLLM profiles the vision tower at startup with its own dummy images).
Kimi-K2.5 (as released): DeepSeek-V3's text model under language_model. beside a MoonViT vision tower (text
prompts; vLLM profiles the tower at startup), vLLM's own Kimi_K25Config and media processor.
DeepSeek-V4 (bf16, and its MXFP4 experts as released against the bf16 twin): mHC residual streams, sliding /
CSA / HCA compressed attention, a hash-routed first MoE layer, sqrtsoftplus routing, clamped SwiGLU experts
(the engine's silu_clamp).
MiniMax-M3 (its text model, bf16, and its MXFP8 experts as released against the bf16 twin): swigluoai experts on [gate; up] rows (vLLM's swigluoai_uninterleave), block-
sparse attention with a lightning indexer, dense first layer; the fp32 oracle is transformers' MiniMax-M3 text model
(MiniMaxM3VLForCausalLM) with the checkpoint's tensors renamed and fused its way (tests/e2e/oracle.py).
Qwen3.8-Flash-Next (Qwen4Exp, bf16): Gated-DeltaNet layers and a gated attention layer with a sparse indexer (QSA),
four hyper-connection residual streams, per-layer n-gram embedding (PLE) tables in pinned host memory, a MoE with a
gated shared expert in every layer; transformers' own model is the fp32 oracle; and in its vision-language layout
(qwen4_exp_vl: Qwen4ExpForConditionalGeneration, the text model under model.language_model., served with
--language-model-only).
GLM-5.3 (Glm5NextForCausalLM, bf16): Kimi Delta Attention layers and an indexed NoPE sparse MLA layer, mHC residual
streams, a dense first layer, grouped sigmoid routing with a shared expert, silu experts clamped at swiglu_limit (the
engine's silu_clamp); the fp32 oracle is transformers' Glm5NextTextModel under the checkpoint's lm_head.
Kimi-K3 (KimiK3ForConditionalGeneration, bf16, and its compressed-tensors MXFP4 experts as released against the bf16
twin): KimiLinear's KDA layers with a full-rank output gate and a NoPE MLA layer with an output gate, a dense first
layer, a latent MoE (routed experts on a narrower RMS-normed projection of the hidden state, SituGLU), beside a MoonViT
tower (text prompts; vLLM profiles the tower at startup). transformers has no Kimi-K3: no teacher-forced fp32 check
(the criterion then holds the scored prompts to the reference's own teacher-forced logprobs).
DeepSeek-V4.1 (DeepseekV41ForCausalLM, bf16, and its MXFP4 experts against the bf16 twin): V4's decoder block with
V4.1's attention topology (sliding-window layers, kv / index source layers and the compressed layers reading them),
an Engram layer (FP8 n-gram tables in pinned host memory), a small vision tower (text prompts); no fp32 check either.
Both bring stock yardstick runs for the criterion (RECHUNKED, compare.py): stock's own noise on them exceeds its floors.
MTP drafts (DeepSeek-V3 with an MTP layer as released, vLLM's `mtp` speculative decoding, 2 draft tokens), switch
on: greedy outputs as without drafts (the suite's criterion), the draft's MoE layer GPU-resident by default and on
the engine with LVLLM_DRAFT_MOE=cpu; GLM-4.5's, GLM-5's, DeepSeek-V4's (mtp.0), Qwen3-Next's and Qwen3.5's
(mtp.layers.0), MiniMax-M3's (language_model.model.mtp.layers.0), Qwen3.8-Flash-Next's (mtp.layers.0) and
GLM-5.3's (model.layers.4) MTP layers the same, and DeepSeek-V4.1's DSpark drafts (three stages, a block of 4), by
the default rule (LVLLM_E2E_ARCHS=mtp: only these runs; mtp_<family>: one family's). n-gram drafts (Qwen3-MoE, 3
tokens a step, prompts that repeat; LVLLM_E2E_ARCHS=ngram): the same greedy outputs as without, with drafts verified.
EAGLE-3 drafts (Qwen3-MoE with a random-weight draft in the release layout, 3 tokens a step; LVLLM_E2E_ARCHS=eagle3):
the same.
MiniMax-M3's switch-on run with every MoE layer GPU-resident (LVLLM_E2E_ARCHS=minimax_m3_resident, only when named):
vLLM's own experts with the plugin around them against the switch-off run, which puts a switch-on difference inside
or outside the engine's layers.
"""
from __future__ import annotations

import json
import os

import pytest

from .test_switch import (CAPTURE, CPU, KV, OFF, _check, _checkpoint, _get, _run_all, check_cpu_run,  # noqa: F401
                          check_gpu_run, gpu_env, pytestmark, yardstick_run)

# architecture -> its first MoE layer (made GPU-resident in the "gpu" run)
NEW_ARCHS = {"qwen3_next": 0, "glm_moe_dsa": 1, "minimax_m2": 0, "qwen3_5_moe": 0, "qwen3_5_moe_vl": 0, "deepseek_v4": 1,
             "kimi_k25": 1, "minimax_m3": 1, "qwen4_exp": 0, "qwen4_exp_vl": 0, "glm5_next": 1, "glm5_next_vl": 1,
             "kimi_k3": 1, "deepseek_v41": 0}


# Quantized releases: switch on against stock vLLM on the checkpoint's bf16 twin (the same experts decoded;
# vLLM's own MXFP4 MoE for DeepSeek-V4 quantizes the activations to MXFP8, the engine keeps them bf16);
# Kimi-K2.5's int4 experts (compressed-tensors W4A16 group 32, its quantization_config in text_config); MiniMax-M3's
# MXFP8 experts as released (the engine's mxfp8: CPU prefill; vLLM's own MXFP8 MoE on Hopper is Humming / Marlin);
# Kimi-K3's compressed-tensors MXFP4 experts on the latent width (the engine's mxfp4); DeepSeek-V4.1's MXFP4 experts;
# and DeepSeek-V4's / V4.1's other expert formats their quantization config selects: FP8 block (expert_dtype "fp8",
# V4-Flash-Base) and ModelOpt NVFP4 (moe_quant_algo "NVFP4").
NEW_QUANTIZED = [("deepseek_v4", "mxfp4"), ("kimi_k25", "w4a16"), ("minimax_m3", "mxfp8"), ("kimi_k3", "mxfp4_ct"),
                 ("deepseek_v41", "mxfp4"), ("deepseek_v4", "fp8"), ("deepseek_v4", "nvfp4"), ("deepseek_v41", "fp8"),
                 ("deepseek_v41", "nvfp4")]


# Where transformers has no model of the architecture (no fp32 truth: Kimi-K3, DeepSeek-V4.1), each comparison brings a
# yardstick (tests/e2e/compare.py): stock vLLM again with another prefill chunking ("off-again"), and for a quantized
# checkpoint stock on the quantized file itself ("<quant>-off", vLLM's own kernels for the format)
RECHUNKED = ["--max-num-batched-tokens", "256"]


# The CPU-prefill runs log the statistics every second: their lines count the CPU-path steps replayed from CUDA graphs
# (lvllm.stats), which decode must stay inside under the breakable graphs vLLM turns on for the newest architectures
STATS_EACH_SECOND = {"LVLLM_STATS_INTERVAL": "1"}
# Of a run's decode steps (two passes over 8 prompts of 32 tokens, at most 4 at a time: about 128 steps, fewer where a
# step also carries a prompt's chunk and runs eagerly), at least this many replayed from graphs; a decode outside them
# replays none. (The last second's line may be lost at shutdown.)
MIN_GRAPH_STEPS = 32


# Switch on with every MoE layer GPU-resident (LVLLM_E2E_ARCHS=<arch>_resident): what the plugin changes besides the
# experts' math (routing inputs, padding, the shared expert's overlap), against the same switch-off run.
ALL_RESIDENT = {"minimax_m3": "1-3"}


# Speculative decoding with MTP drafts: the checkpoint's first MTP layer drafts 2 tokens a step.
MTP = ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 2})]
# The other families with their MTP layer as released, the draft's MoE layer by the default rule (on the GPU), and
# where vLLM's MTP model puts it (every tiny checkpoint has 4 decoder layers). GLM-5.3 drafts in its release layout
# only: vLLM 0.33 has no MTP for the text-only glm5_next_text (test_minimax_m3_glm5_next_configs.py)
MTP_FAMILIES = {"glm4_moe": "model.layers.4.mlp.experts", "glm_moe_dsa": "model.layers.4.mlp.experts",
                "deepseek_v4": "model.layers.4.ffn.experts", "qwen3_next": "mtp.layers.0.mlp.experts",
                "qwen3_5_moe": "mtp.layers.0.mlp.experts", "minimax_m3": "model.layers.0.block_sparse_moe.experts",
                "qwen4_exp": "mtp.layers.4.mlp.experts", "glm5_next_vl": "model.layers.4.mlp.experts"}
# DeepSeek-V4.1's DSpark drafts: its three stages (mtp.0-2) draft a block of 4 tokens a step; their MoE layers follow
# the target's (model.layers.4-6) and stay on the GPU by the default rule
DSPARK = ["--speculative-config", json.dumps({"method": "dspark", "num_speculative_tokens": 4})]
DSPARK_LAYERS = "model.layers.4.ffn.experts, model.layers.5.ffn.experts, model.layers.6.ffn.experts"
# ... and with n-gram drafts (any model; Qwen3-MoE here), 3 tokens a step, on prompts that repeat a run of 16 tokens
# (both runs: the same prompts) so the drafts find matches and vLLM verifies them
NGRAM_PROMPTS = ["--prompt-period", "16"]
NGRAM = ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
                                             "prompt_lookup_max": 4})]


def eagle3(draft_dir: str) -> list:
    """EAGLE-3 drafts from the draft at draft_dir, 3 tokens a step (the target layers it reads: its config's)."""
    return ["--speculative-config", json.dumps({"method": "eagle3", "model": draft_dir, "num_speculative_tokens": 3})]


# "mtp": every family's MTP runs; mtp_<family>: one family's (deepseek_v3: its three runs)
DRAFT_RUNS = {"mtp", "ngram", "eagle3"} | {f"mtp_{a}" for a in ("deepseek_v3", "deepseek_v41", *MTP_FAMILIES)}


def _selected() -> set:
    """LVLLM_E2E_ARCHS=a,b: run only these architectures' vLLM runs (a device run's time; "mtp": the drafts'
    runs); default all."""
    names = {a for a in os.environ.get("LVLLM_E2E_ARCHS", "").split(",") if a}
    diagnostics = {f"{a}_resident" for a in ALL_RESIDENT}
    unknown = names - set(NEW_ARCHS) - DRAFT_RUNS - diagnostics
    if unknown:
        raise ValueError(f"LVLLM_E2E_ARCHS: unknown {sorted(unknown)}; choose from {', '.join(NEW_ARCHS)}, "
                         f"{', '.join(sorted(DRAFT_RUNS))}, {', '.join(sorted(diagnostics))}")
    return names or set(NEW_ARCHS) | DRAFT_RUNS  # the diagnostic runs only when named


def _mtp_selected(arch: str, chosen: set) -> bool:
    return "mtp" in chosen or f"mtp_{arch}" in chosen


def _only_selected(arch: str) -> None:
    if arch not in _selected():
        pytest.skip(f"{arch} not in LVLLM_E2E_ARCHS")


def _only_mtp_selected(arch: str) -> None:
    if not _mtp_selected(arch, _selected()):
        pytest.skip(f"neither mtp nor mtp_{arch} in LVLLM_E2E_ARCHS")


@pytest.fixture(scope="module")
def arch_runs(tmp_path_factory):
    from .oracle import has_fp32_truth
    specs, chosen = [], _selected()
    workdir = tmp_path_factory.mktemp("e2e-archs")
    for arch in [a for a in NEW_ARCHS if a in chosen]:
        specs += [(arch, "off", OFF, KV), (arch, "cpu", {**CPU, **STATS_EACH_SECOND}, KV),
                  (arch, "gpu", gpu_env(NEW_ARCHS[arch]), KV)]
        if not has_fp32_truth(_checkpoint(workdir, arch)):  # stock's own noise, and the MoE layers held to fp32
            specs += [(arch, "off-again", OFF, KV + RECHUNKED), (arch, f"off{CAPTURE}", OFF, KV),
                      (arch, f"cpu{CAPTURE}", CPU, KV), (arch, f"gpu{CAPTURE}", gpu_env(NEW_ARCHS[arch]), KV)]
    for arch, quant in [(a, q) for a, q in NEW_QUANTIZED if a in chosen]:
        specs += [(arch, "cpu", CPU, KV, quant), (arch, "gpu", gpu_env(NEW_ARCHS[arch]), KV, quant),
                  (arch, "stock", OFF, KV, f"{quant}-twin")]
        if not has_fp32_truth(_checkpoint(workdir, arch, quant)):
            specs.append((arch, "off", OFF, KV, quant))
    for arch in [a for a in ALL_RESIDENT if f"{a}_resident" in chosen]:
        if arch not in chosen:
            specs.append((arch, "off", OFF, KV))
        specs.append((arch, "all-resident", {**CPU, "LVLLM_GPU_RESIDENT_MOE_LAYERS": ALL_RESIDENT[arch]}, KV))
    if _mtp_selected("deepseek_v3", chosen):
        specs += [("deepseek_v3", "cpu", CPU, KV, "mtp"), ("deepseek_v3", "cpu-drafts", CPU, KV + MTP, "mtp"),
                  ("deepseek_v3", "cpu-drafts-cpu", {**CPU, "LVLLM_DRAFT_MOE": "cpu"}, KV + MTP, "mtp")]
    for arch in [a for a in MTP_FAMILIES if _mtp_selected(a, chosen)]:
        specs += [(arch, "cpu", CPU, KV, "mtp"), (arch, "cpu-drafts", CPU, KV + MTP, "mtp")]
    if _mtp_selected("deepseek_v41", chosen):
        specs += [("deepseek_v41", "cpu", CPU, KV, "mtp"), ("deepseek_v41", "cpu-drafts", CPU, KV + DSPARK, "mtp")]
    if "ngram" in chosen:
        specs += [("qwen3_moe", "cpu-repeat", CPU, KV + NGRAM_PROMPTS),
                  ("qwen3_moe", "cpu-repeat-ngram", CPU, KV + NGRAM_PROMPTS + NGRAM)]
    if "eagle3" in chosen:
        from lvllm.testing.eagle3_draft import make_eagle3_draft
        draft = make_eagle3_draft(_checkpoint(workdir, "qwen3_moe"), str(workdir / "qwen3_moe-eagle3-draft"))
        specs += [("qwen3_moe", "cpu-plain", CPU, KV), ("qwen3_moe", "cpu-eagle3", CPU, KV + eagle3(draft))]
    return _run_all(workdir, specs)


@pytest.mark.parametrize("arch", list(NEW_ARCHS))
def test_new_architecture_cpu_experts_match_switch_off(arch_runs, arch):
    _only_selected(arch)
    check_cpu_run(arch_runs, arch)


@pytest.mark.parametrize("arch", list(NEW_ARCHS))
def test_new_architecture_decode_stays_inside_cuda_graphs(arch_runs, arch):
    """The CPU experts' calls are captured in vLLM's CUDA graphs (breakable ones for DeepSeek-V4 / V4.1, Kimi-K3,
    GLM-5 and Qwen3.8 in vLLM 0.33) and decode replays them: the engine counts every call, the plugin the eager ones."""
    from lvllm.stats import graph_steps_in
    _only_selected(arch)
    steps, graph = graph_steps_in(_get(arch_runs, f"{arch}-cpu")["log"])
    assert graph >= MIN_GRAPH_STEPS, f"{arch}: {graph} of {steps} CPU-path steps replayed from CUDA graphs"


@pytest.mark.parametrize("arch", list(NEW_ARCHS))
def test_new_architecture_gpu_prefill_and_resident_match_switch_off(arch_runs, arch):
    _only_selected(arch)
    check_gpu_run(arch_runs, arch, NEW_ARCHS[arch])


@pytest.mark.parametrize("mode", ["cpu", "gpu"])
@pytest.mark.parametrize("arch,quant", NEW_QUANTIZED)
def test_new_architecture_quantized_experts_match_the_bf16_twin(arch_runs, arch, quant, mode):
    """CPU prefill; GPU prefill (the quantized experts streamed and dequantized on the GPU) with the first MoE
    layer GPU-resident (vLLM's own kernel for the format)."""
    _only_selected(arch)
    on = _get(arch_runs, f"{arch}-{quant}-{mode}")
    assert "lk_moe: hybrid MoE layers" in on["log"]
    if mode == "gpu":
        assert f"GPU-resident [{NEW_ARCHS[arch]}]" in on["log"]
    where = "switch on" if mode == "cpu" else "gpu-prefill+resident"
    _check(_get(arch_runs, f"{arch}-{quant}-twin-stock"), on, f"{arch} {quant} {where} vs bf16 twin",
           yardstick=yardstick_run(arch_runs, f"{arch}-{quant}-off"))


@pytest.mark.parametrize("arch", list(ALL_RESIDENT))
def test_switch_on_with_every_moe_layer_resident_matches_switch_off(arch_runs, arch):
    """Switch on with every MoE layer GPU-resident (vLLM's own experts, the plugin around them) against stock: a
    failure here puts a switch-on difference outside the engine (H200, 2026-12-05: MiniMax-M3 median 0.000, p90
    0.003 where its engine runs gave 0.119 / 0.225)."""
    _only_selected(f"{arch}_resident")
    off, on = _get(arch_runs, f"{arch}-off"), _get(arch_runs, f"{arch}-all-resident")
    assert f"GPU-resident MoE layers [{ALL_RESIDENT[arch]}]" in on["log"]
    _check(off, on, f"{arch} switch on, MoE layers {ALL_RESIDENT[arch]} GPU-resident, vs off")


@pytest.mark.parametrize("draft_moe", ["gpu", "cpu"])
def test_mtp_drafts_leave_greedy_outputs_unchanged(arch_runs, draft_moe):
    """Speculative decoding with the checkpoint's MTP layer, switch on: the same greedy outputs as without
    drafts, under the suite's criterion (a verify step runs the engine on 3 tokens a request where the plain
    run ran it on 1); the draft's MoE layer where LVLLM_DRAFT_MOE puts it."""
    _only_mtp_selected("deepseek_v3")
    plain = _get(arch_runs, "deepseek_v3-mtp-cpu")
    drafts = _get(arch_runs, "deepseek_v3-mtp-cpu-drafts" + ("-cpu" if draft_moe == "cpu" else ""))
    where = "on the GPU (LVLLM_DRAFT_MOE=gpu)" if draft_moe == "gpu" else "hybrid (LVLLM_DRAFT_MOE=cpu)"
    assert f"speculative draft MoE layers model.layers.4.mlp.experts: {where}" in drafts["log"]
    assert "lk_moe: speculative decoding (" in drafts["log"] and "with k=2 draft tokens: a verify step" in drafts["log"]
    _check(plain, drafts, f"deepseek_v3 MTP drafts ({draft_moe}) vs none")


@pytest.mark.parametrize("arch", list(MTP_FAMILIES))
def test_family_mtp_drafts_leave_greedy_outputs_unchanged(arch_runs, arch):
    """GLM-4.5 (Glm4MoeMTP), GLM-5 (DeepseekV32MTP: a DSA layer), DeepSeek-V4 (DeepSeekV4MTP: mtp.0, an mHC block
    with sliding-window attention), Qwen3-Next / Qwen3.5 (a gated-attention MoE layer under mtp.), MiniMax-M3
    (MiniMaxM3MTP: a block-sparse attention MoE layer under language_model.model.mtp.), Qwen3.8-Flash-Next
    (Qwen4ExpMTP: a sparse-attention MoE layer with hyper-connection streams under mtp.), GLM-5.3 (Glm5NextMTP: a
    sparse MLA MoE layer after the decoder layers; text-only and as released, under model.language_model.) MTP
    drafts, switch on: the same greedy outputs as without drafts, the draft's MoE
    layer on the GPU by the default rule."""
    _only_mtp_selected(arch)
    plain, drafts = _get(arch_runs, f"{arch}-mtp-cpu"), _get(arch_runs, f"{arch}-mtp-cpu-drafts")
    where = f"speculative draft MoE layers {MTP_FAMILIES[arch]}: on the GPU (LVLLM_DRAFT_MOE=gpu)"
    assert where in drafts["log"], drafts["log"][-3000:]
    assert "lk_moe: speculative decoding (mtp) with k=2 draft tokens: a verify step" in drafts["log"]
    _check(plain, drafts, f"{arch} MTP drafts vs none")


def test_dspark_drafts_leave_greedy_outputs_unchanged(arch_runs):
    """DeepSeek-V4.1's DSpark drafts (vLLM's V4.1 draft: three stages from the checkpoint, a block of 4 tokens a step),
    switch on: the same greedy outputs as without drafts under the suite's criterion, the stages' MoE layers on the GPU
    by the default rule, drafts proposed and verified (random stage weights: acceptance near zero)."""
    _only_mtp_selected("deepseek_v41")
    drafts = _get(arch_runs, "deepseek_v41-mtp-cpu-drafts")
    assert f"speculative draft MoE layers {DSPARK_LAYERS}: on the GPU (LVLLM_DRAFT_MOE=gpu)" in drafts["log"]
    _check_drafts(arch_runs, "deepseek_v41-mtp-cpu", "deepseek_v41-mtp-cpu-drafts", "dspark",
                  "deepseek_v41 DSpark drafts", k=4)


def _check_drafts(arch_runs, plain_tag: str, drafts_tag: str, method: str, what: str, k: int = 3) -> None:
    """A run with vLLM's speculative decoding (k draft tokens) against the same run without: the startup's
    speculation line, drafts proposed and verified (vLLM's own counters), and the same greedy outputs under the
    suite's criterion."""
    plain, drafts = _get(arch_runs, plain_tag), _get(arch_runs, drafts_tag)
    assert f"lk_moe: speculative decoding ({method}) with k={k} draft tokens" in drafts["log"]
    n = drafts["spec_counters"]
    print(f"[e2e] {what}: {n['drafts']} drafts, {n['draft_tokens']} draft tokens, {n['accepted_tokens']} accepted "
          f"({n['accepted_tokens'] / max(1, n['draft_tokens']):.0%})")
    assert n["draft_tokens"] > 0, n
    _check(plain, drafts, f"{what} vs none")


def test_ngram_drafts_leave_greedy_outputs_unchanged(arch_runs):
    """vLLM's n-gram speculative decoding, switch on: the same greedy outputs as without drafts under the suite's
    criterion, with drafts proposed and verified (a verify step runs the engine on up to 4 tokens a request)."""
    _only_selected("ngram")
    _check_drafts(arch_runs, "qwen3_moe-cpu-repeat", "qwen3_moe-cpu-repeat-ngram", "ngram", "qwen3_moe n-gram drafts")


def test_eagle3_drafts_leave_greedy_outputs_unchanged(arch_runs):
    """vLLM's EAGLE-3 speculative decoding (a dense draft on the GPU reading the target's aux hidden states), switch
    on: the same greedy outputs as without drafts, with drafts proposed and verified (random draft weights: acceptance
    is near zero; what is tested is the verify steps' outputs)."""
    _only_selected("eagle3")
    _check_drafts(arch_runs, "qwen3_moe-cpu-plain", "qwen3_moe-cpu-eagle3", "eagle3", "qwen3_moe EAGLE-3 drafts")

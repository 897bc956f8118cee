"""tests/e2e/oracle.py on tiny checkpoints: router hooks, boundary gaps, bf16 noise, a forced tie."""
import json
import math
import os
import random
import shutil

import pytest
import torch

from lvllm.testing.tiny_checkpoint import make_checkpoint
from tests.e2e.oracle import explain_flip, router_gaps, swapped_margin

ARCHS = ("qwen3_moe", "deepseek_v3", "glm4_moe", "mixtral", "gpt_oss")
N_TOKENS = 64


def _ids(vocab=2000, n=N_TOKENS):
    rng = random.Random(0)
    return [rng.randrange(3, vocab) for _ in range(n)]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("oracle")
    return {a: make_checkpoint(a, str(root / a)) for a in ARCHS}


@pytest.fixture(scope="module")
def results(ckpts):
    return {a: router_gaps(d, _ids()) for a, d in ckpts.items()}


def _config(d):
    with open(os.path.join(d, "config.json")) as f:
        return json.load(f)


def _moe_layers(cfg):
    return list(range(cfg.get("first_k_dense_replace", 0), cfg["num_hidden_layers"]))


def _expected_gap(row, cfg):
    """Plain-python recomputation of one position's top-k boundary gap from its selection scores."""
    k = cfg["num_experts_per_tok"]
    if "n_group" not in cfg:
        s = sorted(row, reverse=True)
        return s[k - 1] - s[k]
    n, tg = cfg["n_group"], cfg["topk_group"]
    size = len(row) // n
    groups = [row[g * size:(g + 1) * size] for g in range(n)]
    gscore = [sum(sorted(g, reverse=True)[:2]) for g in groups]
    order = sorted(range(n), key=lambda g: -gscore[g])
    group_gap = gscore[order[tg - 1]] - gscore[order[tg]] if n > tg else math.inf
    cand = sorted((x for g in order[:tg] for x in groups[g]), reverse=True)
    expert_gap = cand[k - 1] - cand[k] if len(cand) > k else math.inf
    return min(group_gap, expert_gap)


@pytest.mark.parametrize("arch", ARCHS)
def test_hooks_capture_every_moe_layer_and_position(arch, ckpts, results):
    cfg, r = _config(ckpts[arch]), results[arch]
    n_experts = cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg["num_local_experts"]
    assert r.layers == _moe_layers(cfg)
    assert tuple(r.gaps.shape) == (N_TOKENS, len(r.layers))
    assert tuple(r.noise.shape) == (len(r.layers),)
    for layer in r.layers:
        assert tuple(r.scores[layer].shape) == (N_TOKENS, n_experts)
    assert r.logprobs.shape == (cfg["vocab_size"],)
    assert abs(float(r.logprobs.exp().sum()) - 1) < 1e-6
    # positions differ: the hook sees every token, not one broadcast row
    assert len({round(float(x), 6) for x in r.gaps[:, 0]}) > N_TOKENS // 2


@pytest.mark.parametrize("arch", ARCHS)
def test_gaps_match_a_direct_recomputation(arch, ckpts, results):
    cfg, r = _config(ckpts[arch]), results[arch]
    assert (r.gaps >= 0).all()
    for i, layer in enumerate(r.layers):
        want = [_expected_gap(row, cfg) for row in r.scores[layer].tolist()]
        assert r.gaps[:, i].tolist() == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("arch", ARCHS)
def test_noise_is_positive_and_small(arch, results):
    r = results[arch]
    for i, layer in enumerate(r.layers):
        noise = float(r.noise[i])
        assert noise > 0
        # bf16 keeps ~8 bits: the drift through 4 layers stays well under the scores' spread
        assert noise < 0.25 * float(r.scores[layer].std()), (layer, noise)


def _tied_copy(src, dst):
    """A copy whose last MoE layer routes with identical gate rows (and bias): every expert ties."""
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, dst)
    t = load_file(os.path.join(src, "model.safetensors"))
    layer = _moe_layers(_config(src))[-1]
    hit = 0
    for name in list(t):
        if f"layers.{layer}." in name and (".gate." in name or ".router." in name):
            w = t[name]
            t[name] = w[:1].expand_as(w).contiguous()
            hit += 1
    assert hit, "no router tensor found"
    save_file(t, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return layer


@pytest.mark.parametrize("arch", ARCHS)
def test_forced_tie_gives_gap_zero_and_is_explained(arch, ckpts, results, tmp_path):
    layer = _tied_copy(ckpts[arch], tmp_path / "tied")
    ids = _ids()
    r = router_gaps(str(tmp_path / "tied"), ids, noise=False)
    i = r.layers.index(layer)
    assert r.gaps[:, i].abs().max() == 0
    # a flip between the fp32 top-1 and the least likely token: the output is no near-tie,
    # only the router tie explains it
    top, last = int(r.logprobs.argmax()), int(r.logprobs.argmin())
    e = explain_flip(str(tmp_path / "tied"), ids, top, last)
    assert e.margin > 0.5
    assert e.explained and e.layer == layer and e.gap == 0 and e.ratio == 0, str(e)


def test_large_margin_without_router_tie_is_not_explained(ckpts, results):
    d, r = ckpts["qwen3_moe"], results["qwen3_moe"]
    top, last = int(r.logprobs.argmax()), int(r.logprobs.argmin())
    e = explain_flip(d, _ids(), top, last, factor=1e-9)  # only an exact tie could explain it
    assert e.margin > 0.5 and not e.explained and e.ratio > 1e-9, str(e)
    second = int(r.logprobs.topk(2).indices[1])
    if r.logprobs[top] - r.logprobs[second] < 0.5:  # an output near-tie explains itself
        assert explain_flip(d, _ids(), top, second, factor=1e-9).explained


@pytest.mark.parametrize("bad", [[], ["vocab"], [5, -1], [5, 2.0], [True]])
def test_bad_token_ids(ckpts, bad):
    vocab = _config(ckpts["qwen3_moe"])["vocab_size"]
    with pytest.raises(ValueError):
        router_gaps(ckpts["qwen3_moe"], [vocab if t == "vocab" else t for t in bad])


def test_bad_flip_tokens(ckpts):
    with pytest.raises(ValueError):
        explain_flip(ckpts["qwen3_moe"], [5, 6], 1, 10 ** 6)
    with pytest.raises(ValueError):
        explain_flip(ckpts["qwen3_moe"], [], 1, 2)


def test_swapping_the_boundary_expert_moves_the_output(ckpts, results):
    """The counterfactual: swapping one expert choice at the last token changes the last logits
    (and only through the swap: the unswapped margin matches router_gaps' fp32 logprobs)."""
    d, r = ckpts["qwen3_moe"], results["qwen3_moe"]
    top, second = (int(x) for x in r.logprobs.topk(2).indices)
    base = float(r.logprobs[top] - r.logprobs[second])
    moved = [abs(swapped_margin(d, _ids(), top, second, layer) - base) for layer in r.layers]
    assert max(moved) > 1e-3, moved
    with pytest.raises(ValueError):
        swapped_margin(d, _ids(), top, second, layer=99)


def test_spike_flips_of_a_comparison_get_oracle_notes(ckpts):
    from tests.e2e.compare import compare_outputs
    from tests.e2e.oracle import diagnose_spikes
    prompt = _ids(n=40)

    def run(tokens, top):  # two agreed positions, then a flip where the reference margin is 1.0
        return [{"tokens": tokens, "logprobs": [{str(tokens[0]): -0.1, "7": -3.0}, {str(tokens[1]): -0.1, "7": -3.0},
                                                 top]}]
    ref = run([11, 12, 13], {"13": -0.2, "14": -1.2})
    test = run([11, 12, 14], {"14": -0.3, "13": -0.9})
    c = compare_outputs(ref, test)
    assert list(c.spike_cases) == [(0, 2)] and c.spike_cases[(0, 2)] == ([11, 12], 13, 14)
    lines = diagnose_spikes({"model": ckpts["qwen3_moe"], "prompts": [prompt]}, c)
    assert len(lines) == 1 and lines[0].startswith("prompt 0 pos 2 (13 vs 14): fp32 margin")
    assert "boundary expert swapped the fp32 margin is" in lines[0]
    with pytest.raises(ValueError, match="no model/prompts"):
        diagnose_spikes({"runs": []}, c)


def test_grouped_routers_keep_their_groups_for_the_next_candidate():
    from types import SimpleNamespace
    from tests.e2e.oracle import _kept_groups
    router = SimpleNamespace(num_group=2, topk_group=1)
    scores = torch.tensor([[0.9, 0.8, 0.1, 0.95, 0.05, 0.0]])  # groups {0,1,2} (sum 1.7) and {3,4,5} (1.0)
    masked, group_scores = _kept_groups(router, scores)
    assert torch.equal(group_scores, torch.tensor([[1.7, 0.95 + 0.05]], dtype=scores.dtype))
    assert masked[0, :3].tolist() == pytest.approx([0.9, 0.8, 0.1]) and torch.isinf(masked[0, 3:]).all()
    # the best expert outside the top-2 {0, 1} within the kept group is 2 (not 3, whose group was dropped)
    rest = masked[0].clone()
    rest[[0, 1]] = -math.inf
    assert int(rest.argmax()) == 2


@pytest.mark.parametrize("arch", ("gpt_oss", "qwen3_moe"))
def test_the_fp32_truth_has_every_weight_in_fp32(arch, ckpts):
    """gpt-oss's MXFP4 experts are dequantized on load; transformers 5.17 left them in bf16 under an
    fp32 request (seen on the GPU machine, 2026-12-01), which made the oracle's experts run in bf16."""
    from tests.e2e.oracle import _load
    model = _load(ckpts[arch], torch.float32, "cpu")
    assert {p.dtype for p in model.parameters() if p.is_floating_point()} == {torch.float32}


def test_teacher_forced_logprobs_are_the_fp32_predictions(ckpts):
    from tests.e2e.oracle import teacher_forced_logprobs
    ids = _ids()
    for arch in ("qwen3_moe", "gpt_oss"):
        lp = teacher_forced_logprobs(ckpts[arch], [ids, ids[:10]])
        assert [t.shape[0] for t in lp] == [N_TOKENS - 1, 9] and lp[0].dtype == torch.float32
        # row i predicts token i + 1: the last row is router_gaps' prediction after ids[:-1], and a
        # shorter prompt's rows are the longer one's first rows (causal)
        after = router_gaps(ckpts[arch], ids[:-1], noise=False).logprobs
        d_last = (lp[0][-1].double() - after).abs().max().item()
        d_prefix = (lp[1] - lp[0][:9]).abs().max().item()
        assert d_last <= 1e-4 and d_prefix <= 1e-4, f"{arch}: last row off by {d_last:.3g}, prefix rows by {d_prefix:.3g}"
    with pytest.raises(ValueError, match="at least 2 tokens"):
        teacher_forced_logprobs(ckpts["qwen3_moe"], [[5]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        teacher_forced_logprobs(ckpts["qwen3_moe"], [[5, 10 ** 6]])


def _scored_by_hf(model_dir, prompts, edit=None):
    """What generate.py records for scored prompts, from HF transformers in bf16 (top-5 per position);
    edit(model) may alter the weights first."""
    from tests.e2e.oracle import _load
    model = _load(model_dir, torch.bfloat16, "cpu")
    if edit:
        with torch.no_grad():
            edit(model)
    out = []
    with torch.no_grad():
        for ids in prompts:
            lp = torch.log_softmax(model(torch.tensor([ids]), use_cache=False).logits[0, :-1].float(), -1)
            v, i = lp.topk(5, dim=-1)
            out.append({"tokens": ids, "top": [{str(int(t)): float(x) for t, x in zip(ti, vi)}
                                               for ti, vi in zip(i, v)]})
    return out


def test_the_teacher_forced_check_passes_rounding_noise_and_fails_a_wrong_expert(ckpts):
    """The verdict's power on a real tiny model (the CPU calibration in small): bf16 against fp32 is the
    reference; the same bf16 model with every expert weight re-rounded after a relative jitter of
    2^-9 (another implementation's rounding) passes; one expert's down projection x2 in one layer
    (a wrong scale) fails on the flip count."""
    from tests.e2e.compare import oracle_problems, oracle_stats
    from tests.e2e.oracle import teacher_forced_logprobs
    d = ckpts["qwen3_moe"]
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 2000) for _ in range(300)] for _ in range(4)]
    fp32 = teacher_forced_logprobs(d, prompts)
    ref = oracle_stats(_scored_by_hf(d, prompts), fp32)
    gen = torch.Generator().manual_seed(0)

    def jitter(model):
        for name, w in model.named_parameters():
            if ".experts." in name:
                w.copy_((w.float() * (1 + 2.0 ** -9 * torch.randn(w.shape, generator=gen))).to(w.dtype))

    def wrong_scale(model):
        experts = model.model.layers[1].mlp.experts
        experts.down_proj[3] *= 2

    benign = oracle_stats(_scored_by_hf(d, prompts, jitter), fp32)
    bug = oracle_stats(_scored_by_hf(d, prompts, wrong_scale), fp32)
    print(f"reference {ref.summary()}; jitter {benign.summary()}; x2 {bug.summary()}")
    assert ref.positions == 4 * 299 and ref.flips > 0
    assert not oracle_problems(ref, benign), oracle_problems(ref, benign)
    assert any("teacher-forced flips" in p for p in oracle_problems(ref, bug)), bug.summary()


def test_minimax_partial_rope_survives_a_transformers_that_ignores_rotary_dim(tmp_path):
    """MiniMax-M2's `rotary_dim` (the release's spelling of partial RoPE) must reach the fp32 truth even
    where transformers (5.17) does not turn it into partial_rotary_factor: rotating every dimension gave
    a truth ~1.2 nats from vLLM's on the GPU machine."""
    from transformers import AutoConfig

    from tests.e2e.oracle import _load, _partial_rope_from_rotary_dim
    d = make_checkpoint("minimax_m2", str(tmp_path / "minimax_m2"))
    cfg = AutoConfig.from_pretrained(d)
    want = _config(d)["rotary_dim"] / cfg.head_dim
    cfg.rope_parameters.pop("partial_rotary_factor", None)  # as transformers 5.17 leaves it
    _partial_rope_from_rotary_dim(cfg)
    assert cfg.rope_parameters["partial_rotary_factor"] == want
    model = _load(d, torch.float32, "cpu")
    inv_freq = model.model.rotary_emb.inv_freq
    assert inv_freq.numel() * 2 == _config(d)["rotary_dim"]  # rotates rotary_dim of head_dim dimensions


def test_prompts_leave_out_the_tokenizers_special_tokens(tmp_path):
    """Kimi-K2.5's media placeholders (ids 3-7 of the tiny tokenizer) never reach a prompt: transformers
    embeds them as token 0, vLLM as themselves, so the fp32 truth would part from every run from there on.
    Checkpoints with only the three text specials keep the prompts they always had."""
    from tests.e2e.generate import prompts, special_token_ids
    kimi = make_checkpoint("kimi_k25", str(tmp_path / "kimi"), experts_only=True)
    avoid = special_token_ids(kimi)
    assert avoid == set(range(8))
    assert not {t for p in prompts(2048, [600] * 6, seed=1, avoid=avoid) for t in p} & avoid
    qwen = make_checkpoint("qwen3_moe", str(tmp_path / "qwen"))
    rng = random.Random(1)
    assert prompts(2048, [50], seed=1, avoid=special_token_ids(qwen)) == [[rng.randrange(3, 2048) for _ in range(50)]]


@pytest.mark.parametrize("arch", ["glm5_next", "glm5_next_vl", "qwen4_exp", "qwen4_exp_vl", "minimax_m3"])
def test_the_newest_text_models_have_an_fp32_truth(arch, tmp_path):
    """GLM-5.3 (transformers implements its text model without a causal-LM head: the checkpoint's lm_head over
    Glm5NextTextModel), Qwen3.8-Flash-Next (Qwen4ExpForCausalLM; its vision-language layout the whole
    Qwen4ExpForConditionalGeneration, the tower at transformers' initialisation) and MiniMax-M3 (vLLM's checkpoint renamed and fused
    into MiniMaxM3VLForCausalLM, loaded strictly): every weight loaded, in fp32, and the teacher-forced rows causal (a
    shorter prompt's rows are the longer one's first rows)."""
    from safetensors.torch import load_file

    from tests.e2e.oracle import _load, teacher_forced_logprobs
    d = make_checkpoint(arch, str(tmp_path / arch))
    model = _load(d, torch.float32, "cpu")
    assert {p.dtype for p in model.parameters() if p.is_floating_point()} == {torch.float32}
    held = {k: v for k, v in load_file(f"{d}/model.safetensors").items() if v.is_floating_point()}
    mine = {k: v for k, v in model.state_dict().items() if v.is_floating_point()}  # parameters and buffers
    assert sum(v.numel() for v in mine.values()) >= sum(v.numel() for v in held.values())
    if arch == "glm5_next":
        assert torch.equal(model.lm_head.weight, held["lm_head.weight"].float())
    ids = _ids()[:24]
    lp = teacher_forced_logprobs(d, [ids, ids[:10]])
    assert [t.shape[0] for t in lp] == [23, 9] and torch.isfinite(lp[0]).all()
    assert (lp[1] - lp[0][:9]).abs().max().item() <= 1e-4


def test_minimax_m3_renaming_fuses_gate_then_up():
    """The MiniMax-M3 converter: expert e's w1 (gate) rows then w3 (up) rows in gate_up_proj[e], w2 as down_proj[e];
    gate/up pairs fused gate first; the router and its bias under mlp.gate; the indexer under self_attn.indexer; the
    release's language_model. prefix dropped, its MTP module (vLLM's draft) left out."""
    from tests.e2e.oracle import minimax_m3_as_transformers
    m = "language_model.model"
    t = {f"{m}.layers.1.block_sparse_moe.experts.{e}.{w}.weight": torch.full((2, 3), 10.0 * e + int(w[1]))
         for e in range(2) for w in ("w1", "w2", "w3")}
    t.update({f"{m}.layers.1.block_sparse_moe.gate.weight": torch.zeros(2, 3),
              f"{m}.layers.1.block_sparse_moe.e_score_correction_bias": torch.zeros(2),
              f"{m}.layers.0.mlp.gate_proj.weight": torch.ones(4, 3),
              f"{m}.layers.0.mlp.up_proj.weight": torch.zeros(4, 3),
              f"{m}.layers.1.self_attn.index_q_proj.weight": torch.zeros(1),
              f"{m}.layers.1.self_attn.index_k_norm.weight": torch.zeros(1),
              f"{m}.mtp.layers.0.enorm.weight": torch.zeros(3)})
    out = minimax_m3_as_transformers(t)
    gate_up = out["model.layers.1.mlp.experts.gate_up_proj"]
    assert gate_up.shape == (2, 4, 3) and gate_up[1, :2].eq(11).all() and gate_up[1, 2:].eq(13).all()
    assert out["model.layers.1.mlp.experts.down_proj"][1].eq(12).all()
    assert out["model.layers.0.mlp.gate_up_proj.weight"][:4].eq(1).all() and out["model.layers.0.mlp.gate_up_proj.weight"][4:].eq(0).all()
    assert {"model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
            "model.layers.1.self_attn.indexer.q_proj.weight", "model.layers.1.self_attn.indexer.k_norm.weight"} <= set(out)
    assert not any(n.startswith(("language_model.", "model.mtp.")) for n in out)

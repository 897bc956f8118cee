"""tests/e2e/moe_oracle.py (the MoE-layer oracle) on a tiny DeepSeek-V4.1 checkpoint's experts, with recorded calls
made here: the CPU engine's output, vLLM's Triton roundings emulated, and a fault; and the recording itself
(lvllm.testing.moe_capture) on a stand-in for vLLM's RoutedExperts."""
import os
import types

import pytest
import torch

from lk_moe.layer import MoELayer
from lk_moe.reference import moe_like_triton, moe_reference
from lvllm.testing.expert_reference import reference_layer
from lvllm.testing.moe_capture import _patch, install_from_env, layer_index
from lvllm.testing.tiny_checkpoint import make_checkpoint
from tests.e2e.moe_capture import gather
from tests.e2e.moe_oracle import main, problems, run_errors, verdict

LAYER, ROWS, TOP_K = 1, 256, 4


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint("deepseek_v41", str(tmp_path_factory.mktemp("moe_oracle") / "v41"), experts_only=True)


@pytest.fixture(scope="module")
def ref(ckpt):
    return reference_layer(ckpt, "deepseek_v41", "bf16", LAYER)


def _inputs(E, H, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(ROWS, H, generator=g) * 4).bfloat16()
    ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(ROWS)]).int()
    w = torch.rand(ROWS, TOP_K, generator=g) + 0.1
    return x, ids, (w / w.sum(1, keepdim=True)).float()


def _triton_like(x, ids, w, ref):
    """vLLM's TritonExperts' roundings (lk_moe.reference.moe_like_triton) on the reference's experts."""
    return moe_like_triton(x, ref["w13"], ref["w2"], ids, w, activation="silu_clamp", swiglu_limit=ref["swiglu_limit"])


def _exact(x, ids, w, ref):
    """The layer in fp32 on the reference's experts (the oracle's truth)."""
    return moe_reference(x.float(), ref["w13"], ref["w2"], ids.long(), w, activation="silu_clamp",
                         swiglu_limit=ref["swiglu_limit"])


def _capture(rec_out, x, ids, w):
    return {"model": "", "layers": {f"model.layers.{LAYER}.ffn.experts": [
        {"layer": LAYER, "x": x, "topk_ids": ids, "topk_weights": w, "out": rec_out}]}}


def test_layer_names_give_the_decoder_layer():
    assert layer_index("model.layers.12.ffn.experts") == 12
    assert layer_index("language_model.model.layers.3.mlp.experts") == 3
    assert layer_index("layers.0.ffn.experts") == 0
    assert layer_index("model.mtp.layers.0.mlp.experts") is None
    assert layer_index("mtp.0.ffn.experts") is None


def test_the_engine_is_held_to_stock_and_a_fault_fails(ref):
    E, H = ref["w13"].shape[0], ref["w13"].shape[2]
    x, ids, w = _inputs(E, H)
    refs = lambda i: ref  # noqa: E731
    engine = MoELayer(ref["w13"].bfloat16(), ref["w2"].bfloat16(), "silu_clamp", swiglu_limit=ref["swiglu_limit"])
    stock = run_errors(_capture(_triton_like(x, ids, w, ref), x, ids, w), refs)
    ours = run_errors(_capture(engine.forward(x, ids, w), x, ids, w), refs)
    assert 0.001 < stock.layer(LAYER) < 0.01 and 0.001 < ours.layer(LAYER) < stock.layer(LAYER), (stock, ours)
    assert not problems(stock, ours)
    bad = dict(ref, w2=ref["w2"].clone())
    bad["w2"][int(ids[0, 0])] *= 1.3  # one expert's down projection 30% off
    faulty = MoELayer(bad["w13"].bfloat16(), bad["w2"].bfloat16(), "silu_clamp", swiglu_limit=ref["swiglu_limit"])
    fault = run_errors(_capture(faulty.forward(x, ids, w), x, ids, w), refs)
    assert any("relative RMS error" in p for p in problems(stock, fault)), fault.summary()
    assert problems(stock, run_errors({"layers": {}}, refs)) == ["the test run recorded no MoE layer call"]


def test_the_cli_reads_recorded_runs(ckpt, ref, tmp_path, capsys):
    E, H = ref["w13"].shape[0], ref["w13"].shape[2]
    x, ids, w = _inputs(E, H, seed=1)
    truth = _exact(x, ids, w, ref)
    torch.save(_capture(_triton_like(x, ids, w, ref), x, ids, w), tmp_path / "off.pt")
    torch.save(_capture(truth.bfloat16(), x, ids, w), tmp_path / "on.pt")
    torch.save(_capture(torch.zeros_like(x), x, ids, w), tmp_path / "zero.pt")
    args = ["--arch", "deepseek_v41", "--model", ckpt, str(tmp_path / "off.pt")]
    assert main(args + [str(tmp_path / "on.pt")]) == 0
    assert main(args + [str(tmp_path / "zero.pt")]) == 1
    out = capsys.readouterr().out
    assert "(reference): 256 rows" in out and "ok" in out and "FAIL: layer 1: relative RMS error 1.00000" in out
    exact = verdict("deepseek_v41", "bf16", str(tmp_path / "off.pt"), str(tmp_path / "on.pt"), model=ckpt)
    assert exact.at_least_as_exact and not exact.problems and "at least as exact as stock" in exact.summary
    back = verdict("deepseek_v41", "bf16", str(tmp_path / "on.pt"), str(tmp_path / "off.pt"), model=ckpt)
    assert not back.at_least_as_exact and not back.problems  # Triton's roundings: within x 1.5 of exact bf16's
    zero = verdict("deepseek_v41", "bf16", str(tmp_path / "off.pt"), str(tmp_path / "zero.pt"), model=ckpt)
    assert zero.problems and not zero.at_least_as_exact


def test_compare_cli_takes_the_oracles_word_on_recorded_runs(ckpt, ref, tmp_path, capsys):
    """python -m tests.e2e.compare --yardstick Y --experts ARCH REF.pt TEST.pt: saved runs re-judged with the MoE-layer
    oracle (a run's recordings made apart from its generation, as on the device)."""
    import json

    from tests.e2e.compare import main as compare_main
    from tests.e2e_harness.test_compare import _FORCED_REF, _scored_run, _shifted
    E, H = ref["w13"].shape[0], ref["w13"].shape[2]
    x, ids, w = _inputs(E, H, seed=2)
    truth = _exact(x, ids, w, ref)
    for name, out in (("off", _triton_like(x, ids, w, ref)), ("on", truth.bfloat16()), ("zero", torch.zeros_like(x))):
        torch.save(dict(_capture(out, x, ids, w), model=ckpt), tmp_path / f"{name}.pt")
    noisy = _shifted(lambda i: 0.5 if i < 36 else 0.0625)  # 9% of the positions beyond TOL, the median a bf16 step
    for name, run in (("ref", _scored_run(_FORCED_REF)), ("test", _scored_run(noisy))):
        (tmp_path / f"{name}.json").write_text(json.dumps(run))
    runs = [str(tmp_path / "ref.json"), str(tmp_path / "test.json")]
    yard = ["--yardstick", str(tmp_path / "ref.json")]
    assert compare_main(yard + runs) == 1  # 9% > the yardstick's share x 1.5 + slack
    assert compare_main(yard + ["--experts", "deepseek_v41", str(tmp_path / "off.pt"), str(tmp_path / "on.pt")]
                        + runs) == 0
    assert compare_main(["--experts", "deepseek_v41", str(tmp_path / "off.pt"), str(tmp_path / "zero.pt")] + yard
                        + runs) == 1
    out = capsys.readouterr().out
    assert "at least as exact as stock" in out and "MoE layers vs fp32 experts: layer 1" in out, out


def test_the_recording_keeps_prefill_calls_of_target_layers(tmp_path):
    class RoutedExperts:  # vLLM's forward_modular signature; returns what the kernels would
        def __init__(self, name):
            self.layer_name = name

        def forward_modular(self, x, topk_weights, topk_ids, shared_experts=None, shared_experts_input=None):
            return x * 2

    _patch(str(tmp_path), 4, types.SimpleNamespace(RoutedExperts=RoutedExperts))
    x, ids, w = torch.ones(8, 3, dtype=torch.bfloat16), torch.zeros(8, 2, dtype=torch.int32), torch.ones(8, 2)
    out = RoutedExperts("model.layers.2.ffn.experts").forward_modular(x=x, topk_weights=w, topk_ids=ids)
    assert torch.equal(out, x * 2)
    RoutedExperts("model.layers.2.ffn.experts").forward_modular(x[:3], w[:3], ids[:3])  # a decode step: fewer rows
    RoutedExperts("mtp.0.ffn.experts").forward_modular(x, w, ids)  # a draft layer: not the target's
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 1 and files[0].startswith(f"{os.getpid()}-")
    rec = torch.load(tmp_path / files[0], weights_only=False)
    assert rec["layer"] == 2 and rec["layer_name"] == "model.layers.2.ffn.experts"
    assert torch.equal(rec["out"], x * 2) and rec["topk_weights"].dtype == torch.float32 and rec["x"].shape == (8, 3)


def test_the_recording_is_off_unless_asked_and_checks_its_settings(tmp_path, monkeypatch):
    monkeypatch.delenv("LVLLM_TEST_MOE_CAPTURE", raising=False)
    assert install_from_env() is False
    monkeypatch.setenv("LVLLM_TEST_MOE_CAPTURE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="is not a directory"):
        install_from_env()
    monkeypatch.setenv("LVLLM_TEST_MOE_CAPTURE", str(tmp_path))
    monkeypatch.setenv("LVLLM_TEST_MOE_CAPTURE_MIN_ROWS", "0")
    with pytest.raises(ValueError, match="not a positive row count"):
        install_from_env()


def test_a_run_keeps_its_first_calls_per_layer_in_order(tmp_path):
    for n, name in enumerate(["model.layers.1.ffn.experts", "model.layers.2.ffn.experts"] * 3):
        torch.save({"layer_name": name, "layer": int(name.split(".")[2]), "n": n}, tmp_path / f"77-{n:05d}.pt")
    layers = gather(str(tmp_path), calls=2)
    assert {k: [r["n"] for r in v] for k, v in layers.items()} == {
        "model.layers.1.ffn.experts": [0, 2], "model.layers.2.ffn.experts": [1, 3]}
    assert all("layer_name" not in r for v in layers.values() for r in v)

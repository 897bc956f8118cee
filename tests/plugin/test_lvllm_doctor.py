"""`lvllm doctor`: machine checks run anywhere; checkpoint sizes from safetensors headers or config."""
import json
import struct

import pytest

from lvllm.cli.checkpoint_info import CheckpointError, read_checkpoint
from lvllm.cli.doctor import main as doctor


def write_safetensors(path, tensors):
    """tensors: name -> (dtype, shape); data is zeros (only the header matters here)."""
    header, off = {}, 0
    sizes = {"BF16": 2, "F32": 4, "F8_E4M3": 1}
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + bytes(off))


@pytest.fixture
def qwen_dir(tmp_path):
    E, H, I, L = 4, 64, 32, 2
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_hidden_layers": L,
           "hidden_size": H, "moe_intermediate_size": I, "num_experts": E, "vocab_size": 100}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    t = {"model.embed_tokens.weight": ("BF16", (100, H))}
    for layer in range(L):
        t[f"model.layers.{layer}.mlp.gate.weight"] = ("BF16", (E, H))
        for e in range(E):
            for proj, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                t[f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"] = ("BF16", shape)
    write_safetensors(tmp_path / "model.safetensors", t)
    return tmp_path, E * 3 * H * I * 2 * L, (100 * H + L * E * H) * 2


def test_expert_bytes_from_headers(qwen_dir):
    path, experts, other = qwen_dir
    info = read_checkpoint(str(path))
    assert (info.expert_bytes, info.other_bytes, info.moe_layers) == (experts, other, 2)
    assert info.expert_dtypes == {"BF16": experts} and not info.estimated


def test_config_only_is_estimated(tmp_path):
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": 4,
           "first_k_dense_replace": 1, "hidden_size": 64, "moe_intermediate_size": 32, "n_routed_experts": 8,
           "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    info = read_checkpoint(str(tmp_path))
    assert info.estimated and info.moe_layers == 3 and info.expert_bytes == 3 * 8 * 3 * 64 * 32  # 1 byte/weight


def test_nested_text_config_keeps_the_outer_model_type(tmp_path):
    """DeepSeek-V4.1's config: the text model under text_config without a model_type of its own."""
    cfg = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
           "text_config": {"num_hidden_layers": 2, "hidden_size": 64, "moe_intermediate_size": 32, "n_routed_experts": 8}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    info = read_checkpoint(str(tmp_path))
    assert info.architecture == "DeepseekV41ForCausalLM" and info.model_type == "deepseek_v41"


def test_modelopt_nvfp4_config_is_estimated_as_4_bit(tmp_path):
    # ModelOpt writes quant_method "modelopt" and names the algorithm apart.
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_hidden_layers": 2,
           "hidden_size": 64, "moe_intermediate_size": 32, "num_experts": 8,
           "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    info = read_checkpoint(str(tmp_path))
    assert info.quant_method == "modelopt/NVFP4"
    assert info.expert_bytes == int(2 * 8 * 3 * 64 * 32 * 0.56)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        read_checkpoint(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"\x01")
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        read_checkpoint(str(tmp_path))


def test_doctor_reports_and_suggests(qwen_dir, capsys):
    path, experts, _ = qwen_dir
    rc = doctor(["--model", str(path), "--gpu-gib", "24"])
    out = capsys.readouterr().out
    for words in ("cpu ", "memory", "hugepages", "locked memory", "torch", "plugin", "Qwen3MoeForCausalLM",
                  "2 MoE of 2 layers", "LVLLM_MOE_NUMA_ENABLED=1", "LK_THREADS="):
        assert words in out, words
    assert rc in (0, 1)  # 1 where something FAILs on this machine (e.g. no plugin metadata)
    assert (rc == 1) == any(ln.startswith("FAIL") for ln in out.splitlines())
    # the host RAM need names its two parts: the engine's copy of the experts and vLLM's processes
    ram = next(ln for ln in out.splitlines() if "host RAM" in ln)
    assert f"experts {experts * 1.05 / 2**20:.1f} MiB in the engine" in ram and "for vLLM's processes" in ram, ram


def test_doctor_bad_arguments():
    with pytest.raises(SystemExit):
        doctor(["--tp", "0"])


def test_plugin_line_checks_the_hooks_against_this_vllm(monkeypatch):
    """The plugin line runs what a switch-on startup checks: with vLLM 0.33.0 the hooks fit; a vLLM
    whose hooked function changed is a FAIL naming it."""
    from lvllm.cli import doctor as doctor_mod
    from lvllm import plugin
    entry = type("EP", (), {"name": "lvllm", "value": "lvllm.plugin:register"})()
    monkeypatch.setattr(doctor_mod.md, "entry_points", lambda group: [entry])
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    vllm = pytest.importorskip("vllm")
    if vllm.__version__ == plugin.SUPPORTED_VLLM:
        line = doctor_mod.plugin_check()
        assert line.level == "ok" and f"hooks fit vLLM {plugin.SUPPORTED_VLLM}" in line.text, line
    def changed():
        raise plugin.PluginError("vLLM 9.9: RoutedExperts._get_quant_method('self',) differs from the expected")
    monkeypatch.setattr(plugin, "check_hook_targets", changed)
    line = doctor_mod.plugin_check()
    assert line.level == "FAIL" and "RoutedExperts._get_quant_method" in line.text

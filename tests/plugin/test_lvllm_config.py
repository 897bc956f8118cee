"""LVLLM_* switches: typed, parsed once, a bad value names its variable."""
import pytest

from lvllm.config import LvllmConfigError, from_env, parse_layer_set


def test_defaults_are_stock_vllm():
    cfg = from_env({})
    assert not cfg.enabled and cfg.gpu_prefill_min_batch == 0 and cfg.prefetch_window == 1
    assert cfg.resident_layers == frozenset() and cfg.stats_interval == 60
    assert cfg.expert_cache_gib == 0 and not cfg.bench_routing_replay


def test_values():
    cfg = from_env({"LVLLM_MOE_NUMA_ENABLED": "1", "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE": "2048",
                    "LVLLM_GPU_PREFETCH_WINDOW": "0", "LVLLM_GPU_RESIDENT_MOE_LAYERS": "0-3, 40"})
    assert cfg.enabled and cfg.gpu_prefill_min_batch == 2048 and cfg.prefetch_window == 0
    assert cfg.resident_layers == {0, 1, 2, 3, 40} and cfg.is_resident(2) and not cfg.is_resident(4)
    assert from_env({"LVLLM_MOE_NUMA_ENABLED": "false"}).enabled is False
    assert from_env({"LVLLM_STATS_INTERVAL": "10"}).stats_interval == 10
    assert from_env({"LVLLM_STATS_INTERVAL": "0"}).stats_interval == 0  # off
    assert from_env({"LVLLM_GPU_EXPERT_CACHE": "12.5"}).expert_cache_gib == 12.5
    assert from_env({"LVLLM_GPU_EXPERT_CACHE": "0"}).expert_cache_gib == 0  # off
    assert from_env({"LVLLM_BENCH_ROUTING_REPLAY": "1"}).bench_routing_replay


def test_layer_sets():
    assert parse_layer_set("") == frozenset()
    assert parse_layer_set("5") == {5}
    assert parse_layer_set("1-2,2-3") == {1, 2, 3}


@pytest.mark.parametrize("env,words", [
    ({"LVLLM_MOE_NUMA_ENABLED": "maybe"}, "LVLLM_MOE_NUMA_ENABLED='maybe' is not a boolean"),
    ({"LVLLM_GPU_PREFILL_MIN_BATCH_SIZE": "-1"}, "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE=-1 is out of range"),
    ({"LVLLM_GPU_PREFILL_MIN_BATCH_SIZE": "1k"}, "LVLLM_GPU_PREFILL_MIN_BATCH_SIZE='1k' is not an integer"),
    ({"LVLLM_GPU_PREFETCH_WINDOW": "2"}, "LVLLM_GPU_PREFETCH_WINDOW=2 is out of range"),
    ({"LVLLM_GPU_RESIDENT_MOE_LAYERS": "3-1"}, "LVLLM_GPU_RESIDENT_MOE_LAYERS: range '3-1' must be ascending"),
    ({"LVLLM_GPU_RESIDENT_MOE_LAYERS": "a,b"}, "LVLLM_GPU_RESIDENT_MOE_LAYERS: 'a' is not a layer index"),
    # the limit is said as it is (it was "must be ascending, non-negative" for an ascending range)
    ({"LVLLM_GPU_RESIDENT_MOE_LAYERS": "0-99999"},
     "LVLLM_GPU_RESIDENT_MOE_LAYERS: range '0-99999' goes past layer index 10000, the largest accepted"),
    ({"LVLLM_GPU_RESIDENT_MOE_LAYERS": "1,20000"},
     "LVLLM_GPU_RESIDENT_MOE_LAYERS: layer 20000 is past layer index 10000, the largest accepted"),
    ({"LVLLM_STATS_INTERVAL": "-5"}, "LVLLM_STATS_INTERVAL=-5 is out of range"),
    ({"LVLLM_STATS_INTERVAL": "1.5"}, "LVLLM_STATS_INTERVAL='1.5' is not an integer"),
])
def test_bad_values_name_the_variable(env, words):
    with pytest.raises(LvllmConfigError) as ei:
        from_env(env)
    assert words in str(ei.value)

"""lvllm: the lk_moe hybrid CPU/GPU MoE engine as a vLLM plugin (see README)."""
__version__ = "0.1.0.dev0"

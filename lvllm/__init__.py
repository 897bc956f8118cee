"""lvllm: the vLLM 0.26.0 integration of the lk_moe engine (plugin in progress; see README)."""
__version__ = "0.1.0.dev0"

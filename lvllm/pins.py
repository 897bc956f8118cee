"""The serving stack this release is built and tested for; the one place that names it in code.

requirements/*.txt and pyproject.toml carry the same versions as text (a test checks they agree).
"""
VLLM = "0.33.0"
TORCH = "2.14.0"

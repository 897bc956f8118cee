"""Test fixtures: tiny checkpoints of real MoE architectures and the reference quantizers of every
expert format. Not imported by the plugin."""

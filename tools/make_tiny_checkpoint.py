#!/usr/bin/env python3
"""Command-line entry of lvllm.testing.tiny_checkpoint (see its docstring)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lvllm.testing.tiny_checkpoint import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

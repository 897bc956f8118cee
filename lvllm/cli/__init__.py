"""The `lvllm` command: `lvllm doctor [--model DIR] [--tp N]`."""
from __future__ import annotations

import sys

USAGE = "usage: lvllm doctor [--model DIR] [--tp N]"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "doctor":
        from .doctor import main as doctor
        return doctor(argv[1:])
    print(f"lvllm: unknown command {argv[0]!r}\n{USAGE}", file=sys.stderr)
    return 2

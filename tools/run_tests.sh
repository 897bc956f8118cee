#!/usr/bin/env bash
# The test command (README quick start; .ci/run calls exactly this).
# CPU tests run everywhere; tests/gpu and tests/e2e skip cleanly without an NVIDIA GPU.
# Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/tools/setup_env.sh"
cd "$root"
exec "$LVLLM_PYTHON" -m pytest -q -p no:cacheprovider tests "$@"

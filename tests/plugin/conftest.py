import contextlib
import logging

from ..engine.conftest import _seeded  # noqa: F401  (the same fixed seed for every test)


@contextlib.contextmanager
def lvllm_log_records():
    """Collect (level, message) of what lvllm logs at INFO and above inside the block. vLLM's logging
    config (if vLLM was imported) stops propagation at "vllm": listen on lvllm's own logger."""
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append((record.levelno, record.getMessage()))

    log = logging.getLogger("vllm.lvllm")
    handler, old_level = Keep(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield seen
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)

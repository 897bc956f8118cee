"""Progress of handing the experts to the engine at startup: one log line every few seconds
(layers done, GiB, GB/s of repacking), and a last one when the final layer is in."""
from __future__ import annotations

import time
from typing import Callable, Optional


class LoadProgress:
    def __init__(self, total_layers: Optional[int], log: Callable[[str], None], every_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.log, self.every_s, self.clock = total_layers, log, every_s, clock
        self.start = self.last = None
        self.layers = 0
        self.bytes = 0
        self.busy_s = 0.0  # time inside the hand-off itself (repacking), not loading from disk

    def layer_done(self, nbytes: int, seconds: float) -> None:
        now = self.clock()
        if self.start is None:
            self.start = self.last = now - seconds
        self.layers += 1
        self.bytes += nbytes
        self.busy_s += seconds
        final = self.total is not None and self.layers >= self.total
        if final or now - self.last >= self.every_s:
            self.last = now
            self.log(self.line(final))

    def line(self, final: bool = False) -> str:
        of = f"/{self.total}" if self.total else ""
        rate = self.bytes / self.busy_s / 1e9 if self.busy_s > 0 else 0.0
        head = "lk_moe: experts of all" if final else "lk_moe: experts of"
        return (f"{head} {self.layers}{of} hybrid MoE layers in host RAM ({self.bytes / (1 << 30):.1f} GiB, "
                f"repacked at {rate:.1f} GB/s in {self.busy_s:.1f} s)")

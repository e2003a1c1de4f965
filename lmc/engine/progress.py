"""The progress bar of ``lmc fit`` / ``lmc validate``: Lightning's tqdm bar, redrawn at most
every ``min_interval`` seconds.

Lightning's ``TQDMProgressBar`` redraws after every batch (``refresh_rate=1``: a forced tqdm
refresh and a postfix update, two writes to the terminal), ~0.15 ms a step on a 2-core CPU: a
tenth of a small network's step (issue 30). A bar drawn ten times a second shows the same;
the count is exact at every epoch's end, where Lightning draws the bar anyway.
"""

from __future__ import annotations

import time

from lmc.engine.seam import SeamProgressBar


class ProgressBar(SeamProgressBar):
    """``TQDMProgressBar`` that redraws a bar at most every ``min_interval`` seconds (and on
    its last batch); ``refresh_rate`` and ``leave`` as Lightning's.

    Args:
        refresh_rate: redraw at most every this many batches.
        process_position: the bar's line, as Lightning's.
        leave: keep the finished epoch's bar on screen.
        min_interval: seconds between redraws (``0``: Lightning's behaviour).
    """

    def __init__(
        self,
        refresh_rate: int = 1,
        process_position: int = 0,
        leave: bool = False,
        min_interval: float = 0.1,
    ) -> None:
        super().__init__(refresh_rate=refresh_rate, process_position=process_position, leave=leave)
        if min_interval < 0:
            raise ValueError(f"min_interval must be >= 0 seconds, got {min_interval}")
        self.min_interval = min_interval
        self._last_draw = float("-inf")

    def should_redraw(self, current: int, total: int | float) -> bool:
        if not super().should_redraw(current, total):
            return False
        now = time.monotonic()
        if current != total and now - self._last_draw < self.min_interval:
            return False
        self._last_draw = now
        return True

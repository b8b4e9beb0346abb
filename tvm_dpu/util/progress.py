"""Progress bars for long compiles: drawn on stderr only when it is a terminal (in a log file or a pipe, tqdm's
carriage-return redraws become hundreds of characters per line), and only when asked for."""
from __future__ import annotations

import os
import sys
from typing import Any, Iterable


def progress_wanted(progress: bool) -> bool:
    """Whether to draw a bar: asked for, and stderr is a terminal (TVM_DPU_PROGRESS=1 forces it, =0 hides it)."""
    forced = os.environ.get("TVM_DPU_PROGRESS")
    if forced in ("0", "1"):
        return progress and forced == "1"
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(progress and callable(isatty) and isatty())


def progress_bar(iterable: Iterable, progress: bool, **tqdm_options: Any) -> Iterable:
    """`iterable` wrapped in a tqdm bar on stderr when `progress_wanted(progress)`, else `iterable` itself."""
    if not progress_wanted(progress):
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, file=sys.stderr, dynamic_ncols=True, **tqdm_options)

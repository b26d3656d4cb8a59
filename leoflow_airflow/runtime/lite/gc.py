"""GC of settled attempts' record files and directories (``[leoflow] record_retention`` seconds).

Filesystem-driven: walk ``<runtime_dir>/attempts/<ti_id>/<epoch>`` directories older than the retention and
remove those whose ledger row is CLOSED (or gone). Bounded per pass, so the scheduler loop never stalls.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable


def collect(root: str, *, retention: float, is_closed: Callable[[str, int], bool], limit: int = 200,
            now: float | None = None) -> int:
    """Remove up to ``limit`` expired, closed attempt directories under ``root/attempts``; return how many.

    :param retention: seconds since the directory's last change before it may go.
    :param is_closed: ``is_closed(ti_id, epoch)``: True when the ledger row is CLOSED or absent.
    """
    base = os.path.join(root, "attempts")
    now = time.time() if now is None else now
    removed = 0
    try:
        ti_dirs = os.listdir(base)
    except OSError:
        return 0
    for ti_id in ti_dirs:
        ti_dir = os.path.join(base, ti_id)
        try:
            epochs = os.listdir(ti_dir)
        except OSError:
            continue
        for epoch in epochs:
            if removed >= limit:
                return removed
            path = os.path.join(ti_dir, epoch)
            try:
                if now - os.stat(path).st_mtime < retention or not epoch.isdigit():
                    continue
            except OSError:
                continue
            if is_closed(ti_id, int(epoch)):
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
        try:
            os.rmdir(ti_dir)  # only succeeds once empty
        except OSError:
            pass
    return removed

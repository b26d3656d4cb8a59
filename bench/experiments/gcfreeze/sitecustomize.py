"""EXPERIMENT (bench only): make the leoflow zygote call ``gc.freeze()`` after its preload.

Put this directory first on ``PYTHONPATH`` (``python -m bench.compare --executors local leoflow
leoflow-gcfreeze``). In every process other than ``python -m leoflow_agent serve`` it does nothing. In the
zygote it wraps ``Zygote._preload`` so that, once the Task SDK is imported, every object then alive is moved to
the permanent generation (as Airflow's LocalExecutor does before forking its workers): a garbage collection
in a forked agent or task process then no longer walks, and so copies page by page, the zygote's heap.
"""

from __future__ import annotations


def _install() -> None:
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return
    if b"leoflow_agent" not in argv or b"serve" not in argv:
        return
    import gc

    from leoflow_agent import zygote

    original = zygote.Zygote._preload

    def _preload_then_freeze(self):  # type: ignore[no-untyped-def]
        original(self)
        gc.collect()
        gc.freeze()

    zygote.Zygote._preload = _preload_then_freeze


_install()

"""The attempt lifecycle, written once over the :class:`~leoflow_airflow.lifecycle.runtime.Runtime` seam.

dispatch -> events -> evidence -> reconcile -> settle -> adopt -> reap. Nothing here names a zygote, a pid or a
pod; the executor performs the :mod:`~leoflow_airflow.lifecycle.actions` it returns (DESIGN §1 "Runtimes").
Kept import-free so the pure modules below can be imported alone.
"""

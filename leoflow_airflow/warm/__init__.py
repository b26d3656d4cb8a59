"""Warm pools (issue 11, DESIGN §3 "Warm pools"): pre-started workers per DAG version that take attempts in-band.

This package holds what both runtimes share, as pure decisions apart from the I/O that acts on them:

* :mod:`leoflow_airflow.warm.targets`: which DAG versions keep a pool and how large (``[leoflow]`` defaults and
  the per-DAG overrides, resolved into :class:`~leoflow_airflow.warm.pool.Target` rows);
* :mod:`leoflow_airflow.warm.expectations`: create expectations, so a lagging cache of the workers never pushes a
  pool past its caps (seed 002's ``WarmPodCache``);
* :mod:`leoflow_airflow.warm.pool`: ``decide(snapshot, now)``: which workers to create, delete and reap, and
  which versions' pools are gone (seed 002's ``WarmPoolReconciler``).

A runtime (a warm pod per worker on Kubernetes, a forked per-DAG-file parent on Lite) reads its workers, asks
:func:`~leoflow_airflow.warm.pool.decide`, and acts.
"""

"""Which DAG versions keep a warm pool, and how large (issue 11 item 1): pure.

Sizes come from two places, neither of them the DAG's code:

* the ``[leoflow]`` defaults, :class:`PoolDefaults` (``min_idle`` 0 turns warm pools off for every DAG no
  override names);
* per-DAG overrides (:func:`parse_overrides`), one JSON object in the config whose keys are ``dag_id`` globs
  (``fnmatch``, case-sensitive) and whose values set any of ``min_idle``, ``max_pool_size`` and ``prewarm``::

      {"etl_*": {"min_idle": 2, "max_pool_size": 4}, "reports_daily": {"prewarm": true}, "huge_*": {"min_idle": 0}}

  The first key that matches a ``dag_id``, in the order written, wins; what it leaves out comes from the
  defaults. This needs no change to a DAG file and no DAG re-parse, and an operator can read the whole policy in
  one place (a DAG tag or param would put pool sizes in DAG code, which the issue rules out).

A version gets a :class:`~leoflow_airflow.warm.pool.Target` while a dag run of it is queued or running ("prewarm
when a dag run is created, drain when a version is no longer active"), or, with ``prewarm`` on, while it is its
unpaused DAG's current version (then the target is marked ``prewarm``: it yields to active runs under the tenant
cap). The tenant is the DAG's team when Airflow's multi-team mode gives it one, else its bundle's name.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from typing import Any, Iterable

from leoflow_airflow.errors import ConfigError
from leoflow_airflow.warm.pool import Target

__all__ = ["Override", "PoolDefaults", "VersionInfo", "parse_overrides", "resolve", "tenant_of"]

_FIELDS = {"min_idle": int, "max_pool_size": int, "prewarm": bool}


@dataclass(frozen=True)
class PoolDefaults:
    """The ``[leoflow]`` pool sizes for every DAG no override names: ``min_idle`` (0: no pool) and
    ``max_pool_size`` (a version's ceiling of workers in all); ``prewarm``: keep a pool for a DAG's current
    version before any run of it exists.

    :raises ValueError: a negative size.
    """

    min_idle: int = 0
    max_pool_size: int = 0
    prewarm: bool = False

    def __post_init__(self) -> None:
        for name in ("min_idle", "max_pool_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more, got {getattr(self, name)}")


@dataclass(frozen=True)
class Override:
    """One per-DAG override: ``pattern`` (a ``dag_id`` glob) and the sizes it sets (None: the default's)."""

    pattern: str
    min_idle: int | None = None
    max_pool_size: int | None = None
    prewarm: bool | None = None

    def matches(self, dag_id: str) -> bool:
        """Whether ``dag_id`` matches :attr:`pattern` (``fnmatch.fnmatchcase``)."""
        return fnmatch.fnmatchcase(dag_id, self.pattern)


def parse_overrides(text: str, *, key: str = "warm_pools") -> tuple[Override, ...]:
    """Parse the per-DAG overrides (module docstring) from the config value ``text``; empty or blank: none.

    :param key: the config key, named in errors.
    :raises ConfigError: not a JSON object, a value that is not an object, an unknown field, a size that is not
        a whole number of 0 or more, a ``prewarm`` that is not true/false; the message names the key, the
        pattern and the field.
    """
    if not text.strip():
        return ()

    def bad(reason: str) -> ConfigError:
        return ConfigError(f"leoflow.{key}", text, reason)

    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise bad(f"not valid JSON ({exc}); expected an object such as "
                  f'{{"etl_*": {{"min_idle": 2, "max_pool_size": 4}}}}') from None
    if not isinstance(raw, dict):
        raise bad(f"expected a JSON object of dag_id patterns, got {type(raw).__name__}")
    out = []
    for pattern, body in raw.items():
        if not pattern:
            raise bad("an empty dag_id pattern")
        if not isinstance(body, dict):
            raise bad(f"{pattern!r}: expected an object, got {type(body).__name__}")
        fields: dict[str, Any] = {}
        for name, value in body.items():
            kind = _FIELDS.get(name)
            if kind is None:
                raise bad(f"{pattern!r}: unknown field {name!r} (known: "
                                  f"{', '.join(sorted(_FIELDS))})")
            if kind is bool and not isinstance(value, bool):
                raise bad(f"{pattern!r}: {name} must be true or false, got {value!r}")
            if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise bad(f"{pattern!r}: {name} must be a whole number of 0 or more, "
                                  f"got {value!r}")
            fields[name] = value
        out.append(Override(pattern, **fields))
    return tuple(out)


@dataclass(frozen=True)
class VersionInfo:
    """What the scheduler's database says of one DAG version: ``version`` (``dag_version_id``), ``dag_id``,
    ``bundle`` (its bundle's name), ``team`` (its team under multi-team mode, else None), ``active_run``
    (a dag run of this version is queued or running), ``current`` (it is its DAG's latest version and the DAG
    is unpaused)."""

    version: str
    dag_id: str
    bundle: str
    team: str | None = None
    active_run: bool = False
    current: bool = False


def tenant_of(bundle: str, team: str | None) -> str:
    """The tenant a DAG's workers count toward: its ``team`` when it has one, else its ``bundle``."""
    return f"team:{team}" if team else f"bundle:{bundle}"


def sizes(dag_id: str, defaults: PoolDefaults, overrides: Iterable[Override]) -> tuple[int, int, bool]:
    """``(min_idle, max_pool_size, prewarm)`` for ``dag_id``: the first matching override's fields over the
    defaults."""
    for o in overrides:
        if o.matches(dag_id):
            return (defaults.min_idle if o.min_idle is None else o.min_idle,
                    defaults.max_pool_size if o.max_pool_size is None else o.max_pool_size,
                    defaults.prewarm if o.prewarm is None else o.prewarm)
    return defaults.min_idle, defaults.max_pool_size, defaults.prewarm


def resolve(versions: Iterable[VersionInfo], defaults: PoolDefaults,
            overrides: tuple[Override, ...] = ()) -> tuple[Target, ...]:
    """The warm targets of ``versions`` (module docstring), ordered by ``dag_id`` and version: a version with a
    queued or running dag run, or with ``prewarm`` on its unpaused DAG's current one; never one whose
    ``min_idle`` is 0. Duplicate versions are merged (an active run wins over prewarm)."""
    found: dict[str, Target] = {}
    for v in versions:
        min_idle, max_pool_size, prewarm = sizes(v.dag_id, defaults, overrides)
        if min_idle <= 0 or not (v.active_run or (prewarm and v.current)):
            continue
        target = Target(v.version, v.dag_id, tenant_of(v.bundle, v.team), min_idle, max_pool_size,
                        prewarm=not v.active_run)
        seen = found.get(v.version)
        if seen is None or (seen.prewarm and not target.prewarm):
            found[v.version] = target
    return tuple(sorted(found.values(), key=lambda t: (t.dag_id, t.version)))

"""The two Kubernetes reads of the token exchange: a TokenReview and a pod GET (DESIGN §3 "Start").

:class:`KubeReader` is the narrow seam the exchange's check order (``leoflow_airflow.api.exchange``) is written
against, so the order is unit-tested with a fake; :class:`KubeClient` is the real one, on the official
``kubernetes`` client (the ``leoflow[kubernetes]`` extra, imported only when a client is built). Both calls are
bounded by a timeout and never retried inside the call (the agent retries the exchange).

What crosses the seam is plain data (:class:`TokenReviewResult`, :class:`PodFacts`); an answer Kubernetes could
not give is :class:`KubeUnavailable` (the exchange cannot decide: try again), a request Kubernetes refused as
malformed is :class:`KubeRejected` (the token is bad: refuse).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

__all__ = [
    "EXTRA_CREDENTIAL_ID",
    "EXTRA_POD_NAME",
    "EXTRA_POD_UID",
    "KubeClient",
    "KubeReader",
    "KubeRejected",
    "KubeUnavailable",
    "OwnerRef",
    "PodFacts",
    "api_client_from_config",
    "TokenReviewResult",
]

log = logging.getLogger(__name__)

EXTRA_POD_NAME = "authentication.kubernetes.io/pod-name"
"""TokenReview ``user.extra`` key: the name of the pod a projected token is bound to."""
EXTRA_POD_UID = "authentication.kubernetes.io/pod-uid"
"""TokenReview ``user.extra`` key: the UID of that pod."""
EXTRA_CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"
"""TokenReview ``user.extra`` key: the token's credential id, ``JTI=<jti>`` for a ServiceAccount token."""


class KubeUnavailable(Exception):
    """Kubernetes gave no usable answer: a timeout, a transport error, 5xx, 429, or 401/403 to the api-server's
    own credentials (missing RBAC). Says nothing about the token; the exchange answers "try again"."""


class KubeRejected(Exception):
    """Kubernetes refused the TokenReview request itself as invalid (a 4xx other than 401/403/408/429): the
    token cannot be reviewed, so it is refused."""


@dataclass(frozen=True)
class TokenReviewResult:
    """The status of one TokenReview.

    ``authenticated``: the token is valid for one of the requested audiences; ``audiences``: the audiences
    the apiserver echoed (the ones the token is valid for among those asked); ``username``: the
    authenticated user (``system:serviceaccount:<ns>:<name>`` for a ServiceAccount token), "" when none;
    ``extra``: ``user.extra``, each value a tuple of strings (see the ``EXTRA_*`` keys); ``error``: the
    apiserver's reason for an unauthenticated token, for the server-side log only.
    """

    authenticated: bool
    audiences: tuple[str, ...] = ()
    username: str = ""
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    error: str = ""


@dataclass(frozen=True)
class OwnerRef:
    """One ``metadata.ownerReferences`` entry of a pod: ``api_version``, ``kind``, ``name``, ``uid`` and
    ``controller`` (False when unset)."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool = False


@dataclass(frozen=True)
class PodFacts:
    """What the exchange reads of a pod: ``name``, ``namespace``, ``uid``, ``deletion_timestamp`` (aware,
    None when the pod is not being deleted), ``annotations`` and ``labels`` (empty when the pod has none), and
    ``owner_references`` (a warm pod's anchor, which the warm registration checks: k8s review §1)."""

    name: str
    namespace: str
    uid: str
    deletion_timestamp: datetime | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    owner_references: tuple[OwnerRef, ...] = ()


class KubeReader(Protocol):
    """The exchange's two Kubernetes reads."""

    def review(self, token: str, audiences: Sequence[str]) -> TokenReviewResult:
        """TokenReview ``token`` for ``audiences``.

        :raises KubeUnavailable: no answer in time, or no usable one.
        :raises KubeRejected: the apiserver refused the review request as invalid.
        """
        ...

    def read_pod(self, namespace: str, name: str) -> PodFacts | None:
        """The pod ``namespace/name``, or None when it does not exist (404).

        :raises KubeUnavailable: no answer in time, or no usable one (a 403 included).
        """
        ...


def api_client_from_config(*, in_cluster: bool, kube_config: str) -> Any:
    """A ``kubernetes.client.ApiClient`` as ``[leoflow] in_cluster`` and ``kube_config`` say, read the way the
    cncf KubernetesExecutor reads its ``in_cluster`` and ``config_file``: the in-cluster configuration (the
    pod's own ServiceAccount, its rotating token re-read) when ``in_cluster``; else the kubeconfig file
    ``kube_config``, or the client's default ($KUBECONFIG, then ``~/.kube/config``) when it is "". urllib3
    retries are off (each caller bounds its own calls).

    :raises kubernetes.config.ConfigException: the configuration cannot be loaded (no in-cluster environment, a
        malformed or missing kubeconfig).
    :raises OSError: the kubeconfig file cannot be read.
    """
    from kubernetes import client, config

    configuration = client.Configuration()
    if in_cluster:
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(config_file=kube_config or None, client_configuration=configuration,
                                persist_config=False)
    configuration.retries = 0
    return client.ApiClient(configuration)


class KubeClient:
    """:class:`KubeReader` on the official ``kubernetes`` client.

    :param api_client: a ``kubernetes.client.ApiClient``; its configuration should not retry
        (:meth:`from_config` builds one so), since each call must end within ``timeout``.
    :param timeout: seconds each call may take in all (urllib3's total timeout), > 0.

    Thread-safe as the ``kubernetes`` client is (one urllib3 pool); :meth:`close` releases the pool.
    """

    def __init__(self, api_client: Any, *, timeout: float) -> None:
        """Wrap ``api_client``; raise ``ValueError`` for a timeout that is not > 0."""
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        from kubernetes import client

        self._api_client = api_client
        self._auth = client.AuthenticationV1Api(api_client)
        self._core = client.CoreV1Api(api_client)
        self._timeout = timeout

    @classmethod
    def from_config(cls, *, in_cluster: bool, kube_config: str, timeout: float) -> KubeClient:
        """A client on :func:`api_client_from_config` (``[leoflow] in_cluster`` / ``kube_config``).

        :raises kubernetes.config.ConfigException: the configuration cannot be loaded.
        :raises OSError: the kubeconfig file cannot be read.
        """
        return cls(api_client_from_config(in_cluster=in_cluster, kube_config=kube_config), timeout=timeout)

    @property
    def api_client(self) -> Any:
        """The wrapped ``kubernetes.client.ApiClient`` (the Kubernetes runtime builds its own APIs on it)."""
        return self._api_client

    def close(self) -> None:
        """Release the client's connection pool (and its thread pool, if one was made). Idempotent."""
        self._api_client.close()

    def review(self, token: str, audiences: Sequence[str]) -> TokenReviewResult:
        """See :meth:`KubeReader.review`. One ``create tokenreviews`` call, at most ``timeout`` seconds."""
        from kubernetes import client

        body = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=list(audiences)))
        try:
            answer = self._auth.create_token_review(body, _request_timeout=self._timeout)
        except Exception as exc:  # noqa: BLE001 - sorted below; a token is never part of what is logged
            raise _sorted(exc, "TokenReview", rejectable=True) from None
        status = answer.status
        if status is None:
            return TokenReviewResult(authenticated=False, error="TokenReview answered without a status")
        user = status.user
        extra = {}
        if user is not None and user.extra:
            extra = {str(k): tuple(str(x) for x in (v or ())) for k, v in user.extra.items()}
        return TokenReviewResult(
            authenticated=bool(status.authenticated),
            audiences=tuple(str(a) for a in (status.audiences or ())),
            username=str(user.username or "") if user is not None else "",
            extra=extra,
            error=str(status.error or ""),
        )

    def read_pod(self, namespace: str, name: str) -> PodFacts | None:
        """See :meth:`KubeReader.read_pod`. One ``get pods`` call, at most ``timeout`` seconds."""
        try:
            pod = self._core.read_namespaced_pod(name, namespace, _request_timeout=self._timeout)
        except Exception as exc:  # noqa: BLE001 - sorted below
            if getattr(exc, "status", None) == 404:
                return None
            raise _sorted(exc, "pod GET", rejectable=False) from None
        meta = pod.metadata
        return PodFacts(
            name=meta.name or "",
            namespace=meta.namespace or "",
            uid=meta.uid or "",
            deletion_timestamp=meta.deletion_timestamp,
            annotations=dict(meta.annotations or {}),
            labels=dict(meta.labels or {}),
            owner_references=tuple(OwnerRef(o.api_version or "", o.kind or "", o.name or "", o.uid or "",
                                            bool(o.controller)) for o in meta.owner_references or ()),
        )


def _sorted(exc: Exception, what: str, *, rejectable: bool) -> Exception:
    """Map an error of the ``kubernetes`` client to :class:`KubeRejected` or :class:`KubeUnavailable`.

    An ``ApiException`` with a 4xx other than 401/403/408/429 is "rejected" when ``rejectable`` (the request
    carried something the apiserver refused), else unavailable; everything else (no status: transport or
    timeout; 5xx; 401/403: the api-server's own credentials or RBAC; 408; 429) is unavailable. The message
    names the call and the status or error type, never the request body.
    """
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status:
        if rejectable and 400 <= status < 500 and status not in (401, 403, 408, 429):
            return KubeRejected(f"{what}: HTTP {status} {getattr(exc, 'reason', '')}".strip())
        hint = ""
        if status in (401, 403):
            hint = " (the api-server's Kubernetes identity lacks a grant: create tokenreviews, get pods)"
        return KubeUnavailable(f"{what}: HTTP {status} {getattr(exc, 'reason', '')}{hint}".strip())
    return KubeUnavailable(f"{what}: {type(exc).__name__}: {str(exc)[:200]}")

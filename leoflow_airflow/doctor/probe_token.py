"""The doctor's mint-key probe: a short-lived token minted with the scheduler's signing config, verified (and
only verified) by an api-server's ``POST /leoflow/v1/doctor/verify`` (issue 12 item 3).

Why a probe and not a comparison of keys: the scheduler and every api-server worker and replica must share
``[api_auth] jwt_secret`` (or ``jwt_private_key_path``) and accept the audience the scheduler mints for (research
``k8s-runtime-facts.md`` §1.1-1.3); comparing them directly would move a secret (or a hash an attacker could test
guesses against) over the wire. Instead the doctor mints a token exactly as the scheduler mints workload tokens
(:func:`leoflow_airflow.api.exchange.build_generator`) and the api-server validates it exactly as its Execution
API validates one (``execution_api/app.py`` ``_jwt_validator``, rebuilt by :func:`airflow_validator`). The answer
is a reason from the closed set :data:`VERIFY_REASONS`; nothing secret is in the request or the answer.

The probe token opens nothing: its ``scope`` is :data:`PROBE_SCOPE`, which Airflow's ``TIClaims`` refuses
(only ``execution`` and ``workload`` exist: 403 on every Execution API route), its ``sub`` is not a task
instance id, and it lives :data:`PROBE_VALID_SECONDS`. The verify route answers ``not_a_probe`` for every token whose
(unverified) claims are not a probe's, before and without verifying it, so it is no validity oracle for real
task tokens and an anonymous call costs no signature check (k8s review §16a). It writes nothing (read-only).
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = [
    "PROBE_SCOPE",
    "PROBE_SUBJECT",
    "PROBE_VALID_SECONDS",
    "VERIFY_PATH",
    "VERIFY_REASONS",
    "airflow_validator",
    "cached_validator",
    "claims_a_probe",
    "classify_error",
    "mint_probe",
    "verify_probe",
]

PROBE_SCOPE = "leoflow:doctor-probe"
"""The ``scope`` claim of a probe token (refused by every Execution API route)."""
PROBE_SUBJECT = "leoflow-doctor"
"""The ``sub`` claim of a probe token (not a task instance id)."""
PROBE_VALID_SECONDS = 60
"""Lifetime of a probe token, in seconds."""
VERIFY_PATH = "/v1/doctor/verify"
"""The verify route under the plugin app's prefix (``/leoflow``)."""

VERIFY_REASONS: frozenset[str] = frozenset({
    "verified",      # signature, audience, issuer, times all accepted
    "signature",     # signed with another key (or a kid the api-server's key set does not hold)
    "audience",      # signature good, ``aud`` not in the api-server's [execution_api] jwt_audience
    "issuer",        # signature good, ``iss`` not the api-server's [api_auth] jwt_issuer
    "clock",         # expired or not yet valid: the two clocks disagree by more than [api_auth] jwt_leeway
    "malformed",     # not a JWT, or a claim missing
    "not_a_probe",   # any token whose claims are not a probe's, valid or not (never verified: k8s review §16a)
    "no_key",        # the api-server has no signing key configured (it cannot validate any task token)
})
"""The answers of the verify route (``{"reason": ...}``)."""


def classify_error(exc: BaseException) -> str:
    """Map a validation error of ``JWTValidator.validated_claims`` (pyjwt's exceptions) to a reason of
    :data:`VERIFY_REASONS`: ``InvalidSignatureError`` and an unknown ``kid`` → ``signature``;
    ``InvalidAudienceError`` → ``audience``; ``InvalidIssuerError`` → ``issuer``; ``ExpiredSignatureError`` /
    ``ImmatureSignatureError`` → ``clock``; anything else → ``malformed``. Pure."""
    import jwt

    if isinstance(exc, jwt.InvalidSignatureError):
        return "signature"
    if isinstance(exc, jwt.InvalidAudienceError):
        return "audience"
    if isinstance(exc, jwt.InvalidIssuerError):
        return "issuer"
    if isinstance(exc, (jwt.ExpiredSignatureError, jwt.ImmatureSignatureError)):
        return "clock"
    if isinstance(exc, jwt.InvalidTokenError) and "kid" in str(exc).lower():
        return "signature"  # asymmetric keys: the token's key id is not one the api-server trusts
    return "malformed"


def mint_probe(generator: Any) -> str:
    """A probe token from ``generator`` (an Airflow ``JWTGenerator`` built like the scheduler's): its own
    ``jti``/``aud``/``iss``/``exp`` as every token the scheduler mints, ``sub`` :data:`PROBE_SUBJECT`, ``scope``
    :data:`PROBE_SCOPE`, valid :data:`PROBE_VALID_SECONDS` s."""
    return generator.generate(extras={"sub": PROBE_SUBJECT, "scope": PROBE_SCOPE}, valid_for=PROBE_VALID_SECONDS)


def airflow_validator() -> Any:
    """A ``JWTValidator`` built exactly as the api-server's Execution API builds its own (Airflow 3.3.2
    ``api_fastapi/execution_api/app.py`` ``_jwt_validator``): required ``aud``/``exp``/``iat`` (+ ``iss`` when
    ``[api_auth] jwt_issuer`` is set), audience ``[execution_api] jwt_audience`` (all values),
    ``get_sig_validation_args(make_secret_key_if_needed=False)``.

    :raises ValueError: no signing key configured (Airflow's own message).
    :raises OSError: the key file cannot be read.
    """
    from airflow.api_fastapi.auth.tokens import JWTValidator, get_sig_validation_args
    from airflow.configuration import conf

    required = frozenset({"aud", "exp", "iat"})
    issuer = conf.get("api_auth", "jwt_issuer", fallback=None)
    if issuer:
        required = required | {"iss"}
    return JWTValidator(required_claims=required, issuer=issuer,
                        audience=conf.get_mandatory_list_value("execution_api", "jwt_audience"),
                        **get_sig_validation_args(make_secret_key_if_needed=False))


VALIDATOR_OPTIONS: tuple[tuple[str, str], ...] = (
    ("api_auth", "jwt_issuer"), ("execution_api", "jwt_audience"), ("api_auth", "trusted_jwks_url"),
    ("api_auth", "jwt_private_key_path"), ("api_auth", "jwt_algorithm"), ("api_auth", "jwt_secret"),
)
"""Every Airflow option :func:`airflow_validator` reads (through ``get_sig_validation_args``): the key of
:func:`cached_validator`'s cache."""

_cache_lock = threading.Lock()
_cached: tuple[tuple[Any, ...], Any] | None = None


def _validator_key() -> tuple[Any, ...]:
    """The values of :data:`VALIDATOR_OPTIONS` now, plus the private key file's ``(mtime_ns, size)`` when one is
    configured (a key rotated in place, as a mounted Secret is, gives a new key). Held in this process only."""
    from airflow.configuration import conf

    values = tuple(conf.get(section, key, fallback=None) for section, key in VALIDATOR_OPTIONS)
    path = conf.get("api_auth", "jwt_private_key_path", fallback=None)
    try:
        stat = os.stat(path) if path else None
    except OSError:
        stat = None  # airflow_validator names the unreadable file
    return values + ((stat.st_mtime_ns, stat.st_size) if stat else None,)


def cached_validator() -> Any:
    """:func:`airflow_validator`, built once per process while the options it reads stay the same
    (:func:`_validator_key`): the verify route no longer builds one per request (a ``trusted_jwks_url``
    validator fetches its key set when built). Airflow's Execution API likewise builds its validator once per
    app (``execution_api/app.py`` lifespan: "an app scoped validator"); keyed on the options, a changed config
    gives a fresh one here. A build that raises is not cached (the next request tries again).

    :raises ValueError: no signing key configured; ``OSError``: the key file cannot be read (as
        :func:`airflow_validator`).
    """
    global _cached
    key = _validator_key()
    with _cache_lock:
        if _cached is not None and _cached[0] == key:
            return _cached[1]
    validator = airflow_validator()
    with _cache_lock:
        _cached = (key, validator)
    return validator


def claims_a_probe(token: str) -> bool | None:
    """Whether ``token``'s payload, read WITHOUT verifying anything (pyjwt's ``decode`` with
    ``verify_signature`` off), names a probe: ``scope`` :data:`PROBE_SCOPE` and ``sub`` :data:`PROBE_SUBJECT`.
    None when ``token`` is no JWT at all (not three base64url parts with a JSON object payload). Pure and cheap:
    no key, no signature check (k8s review §16a: an anonymous caller must not cost a verification)."""
    import jwt

    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except Exception:  # noqa: BLE001 - pyjwt's DecodeError, or a payload that is not an object
        return None
    if not isinstance(claims, dict):
        return None
    return claims.get("scope") == PROBE_SCOPE and claims.get("sub") == PROBE_SUBJECT


def verify_probe(token: str, validator: Any) -> str:
    """The reason of :data:`VERIFY_REASONS` for ``token`` under ``validator`` (``verified`` when it validates
    and carries :data:`PROBE_SCOPE`). Never raises for a bad token.

    k8s review §16a: the verify route is anonymous, so it must be no validity oracle for task tokens and no cheap
    way to make the api-server verify signatures. A token whose unverified claims are not a probe's
    (:func:`claims_a_probe`) is answered ``not_a_probe`` at once, whatever its signature, audience or times (a
    valid task token, a forged one and an expired one answer alike) and ``validator`` is never called for it; a
    string that is no JWT is ``malformed``. Only a token that claims to be a probe is verified, and only its
    reason tells signature, audience, issuer and clock apart (what the doctor needs)."""
    probe = claims_a_probe(token)
    if probe is None:
        return "malformed"
    if not probe:
        return "not_a_probe"
    try:
        claims = validator.validated_claims(token)
    except Exception as exc:  # noqa: BLE001 - every validation failure is classified, none escapes
        return classify_error(exc)
    if claims.get("scope") != PROBE_SCOPE or claims.get("sub") != PROBE_SUBJECT:
        return "not_a_probe"
    return "verified"

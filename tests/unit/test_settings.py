"""``[leoflow]`` settings: defaults, the parse of every type, and a ConfigError naming key and value for
every malformed input (issue 2, "bad input gets a clear error").

Most tests hand :func:`leoflow_airflow.settings.load` a plain ``get`` (the narrow seam it offers); one reads
through Airflow's real config with an ``AIRFLOW__LEOFLOW__*`` environment variable.
"""

from __future__ import annotations

import pytest

from leoflow_airflow import settings
from leoflow_airflow.errors import ConfigError


def getter(**overrides: str):
    """A ``get(section, key, fallback)`` returning ``overrides[key]`` or the fallback (the option default)."""

    def get(section: str, key: str, fallback: str) -> str:
        assert section == "leoflow"
        return overrides.get(key, fallback)

    return get


def test_defaults_parse(monkeypatch, tmp_path):
    """With nothing configured every option takes its documented default; runtime_dir follows AIRFLOW_HOME."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    s = settings.load(getter())
    assert s.runtime == "lite"
    assert s.runtime_dir == str(tmp_path / "leoflow")
    assert s.agent_lost_threshold == 120.0
    assert s.maintenance_interval == 5.0
    assert s.settle_timeout == 10.0
    assert s.settle_budget == 20
    assert s.launch_queue_size == 64
    assert s.end_drain_timeout == 0.0
    assert s.agent_env_passthrough == ()
    assert s.zygote_preload == ()
    assert s.test_fault_injection is False


def test_every_option_has_a_field_and_a_default_that_parses():
    """OPTIONS and LeoflowSettings agree, and each default is valid on its own."""
    fields = set(settings.LeoflowSettings.__dataclass_fields__)
    assert {o.name for o in settings.OPTIONS} == fields
    for opt in settings.OPTIONS:
        settings._parse(opt, opt.default)


def test_values_are_parsed_and_stripped():
    """Whitespace is ignored, booleans accept the usual spellings, the passthrough list drops empties."""
    s = settings.load(getter(
        runtime=" lite ", runtime_dir="/x/y", settle_timeout=" 2.5", settle_budget="7",
        test_fault_injection="On", agent_env_passthrough=" A, B,,C ,", zygote_preload="pandas , my_pkg.sub,",
    ))
    assert (s.runtime, s.runtime_dir, s.settle_timeout, s.settle_budget) == ("lite", "/x/y", 2.5, 7)
    assert s.test_fault_injection is True
    assert s.agent_env_passthrough == ("A", "B", "C")
    assert s.zygote_preload == ("pandas", "my_pkg.sub")
    assert settings.load(getter(test_fault_injection="no")).test_fault_injection is False


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("settle_timeout", "abc", "not a valid float"),
        ("settle_timeout", "0", "greater than 0"),
        ("settle_timeout", "-1", "greater than 0"),
        ("agent_lost_threshold", "nan", "not a valid float"),
        ("agent_lost_threshold", "inf", "not a valid float"),
        ("maintenance_interval", "", "not a valid float"),
        ("settle_budget", "1.5", "not a valid integer"),
        ("settle_budget", "0", "greater than 0"),
        ("launch_queue_size", "many", "not a valid integer"),
        ("end_drain_timeout", "-0.5", "0 or more"),
        ("record_retention", "-1", "0 or more"),
        ("zygote_start_timeout", "0", "greater than 0"),
        ("test_fault_injection", "maybe", "not a valid boolean"),
        ("runtime", "docker", "`lite` or `kubernetes`"),
        ("runtime", "kubernetes", "not in this release"),
        ("zygote_preload", "pandas, dags/etl.py", "'dags/etl.py' is not a dotted module name"),
        ("zygote_preload", "os; rm -rf /", "'os; rm -rf /' is not a dotted module name"),
        ("zygote_preload", "pkg..mod", "'pkg..mod' is not a dotted module name"),
    ],
)
def test_malformed_value_names_key_and_value(key, value, why):
    """A malformed value raises ConfigError whose message names ``[leoflow] key``, the raw value and why."""
    with pytest.raises(ConfigError) as info:
        settings.load(getter(**{key: value}))
    err = info.value
    assert err.key == f"leoflow.{key}"
    assert err.value == value
    text = str(err)
    assert f"[leoflow] {key} = {value!r}" in text
    assert why in text


def test_first_malformed_value_wins_and_config_error_is_a_value_error():
    """ConfigError is a ValueError (callers catching ValueError still see it)."""
    with pytest.raises(ValueError):
        settings.load(getter(settle_budget="x"))


def test_reads_through_airflow_config(monkeypatch):
    """The default ``get`` is Airflow's conf: an ``AIRFLOW__LEOFLOW__*`` variable reaches the parse."""
    monkeypatch.setenv("AIRFLOW__LEOFLOW__SETTLE_BUDGET", "3")
    assert settings.load().settle_budget == 3
    monkeypatch.setenv("AIRFLOW__LEOFLOW__SETTLE_TIMEOUT", "abc")
    with pytest.raises(ConfigError, match=r"\[leoflow\] settle_timeout = 'abc'"):
        settings.load()


def test_provider_config_lists_every_option_with_its_default():
    """The provider's ``[leoflow]`` defaults are exactly the OPTIONS and EXCHANGE_OPTIONS tables."""
    cfg = settings.provider_config()["leoflow"]["options"]
    assert set(cfg) == {o.name for o in settings.OPTIONS + settings.EXCHANGE_OPTIONS}
    for opt in settings.OPTIONS + settings.EXCHANGE_OPTIONS:
        assert cfg[opt.name]["default"] == opt.default
        assert cfg[opt.name]["type"] == opt.type
        assert cfg[opt.name]["description"]


def test_agent_env_deny_parses_and_a_malformed_entry_names_key_and_value():
    """``[leoflow] agent_env_deny`` (issue 8 hole 15): a comma-separated list of names and ``PREFIX*``; a
    malformed entry is a ConfigError naming the option and the raw value."""
    s = settings.load(getter(agent_env_deny=" VAULT_TOKEN, AWS_* ,AIRFLOW__CELERY__BROKER_URL,"))
    assert s.agent_env_deny == ("VAULT_TOKEN", "AWS_*", "AIRFLOW__CELERY__BROKER_URL")
    assert settings.load(getter()).agent_env_deny == ()
    for raw in ("VAULT TOKEN", "A,*", "FOO=bar", "AWS_*_KEY"):
        with pytest.raises(ConfigError) as err:
            settings.load(getter(agent_env_deny=raw))
        assert err.value.key == "leoflow.agent_env_deny" and err.value.value == raw
        assert "agent_env_deny" in str(err.value) and repr(raw) in str(err.value)


def test_replay_holdoff_max_seconds():
    """Seconds, default 3600, 0 allowed (never hold off), negative refused with key and value."""
    assert settings.load(getter()).replay_holdoff_max_seconds == 3600.0
    assert settings.load(getter(replay_holdoff_max_seconds="0")).replay_holdoff_max_seconds == 0.0
    with pytest.raises(ConfigError, match="replay_holdoff_max_seconds"):
        settings.load(getter(replay_holdoff_max_seconds="-1"))


def test_malformed_agent_env_deny_through_airflow_config(monkeypatch):
    """What an operator sees for ``AIRFLOW__LEOFLOW__AGENT_ENV_DENY="AWS_*, MY VAR"``: key and value named."""
    monkeypatch.setenv("AIRFLOW__LEOFLOW__AGENT_ENV_DENY", "AWS_*, MY VAR")
    with pytest.raises(ConfigError, match=r"\[leoflow\] agent_env_deny = 'AWS_\*, MY VAR': 'MY VAR' is not an "
                                          r"environment variable name"):
        settings.load()


# --- the token exchange's group (issue 9 item 3) --------------------------------------------------------

def test_exchange_defaults_and_username():
    """The exchange's options parse on their own, with ``runtime = kubernetes`` accepted (``load`` refuses it)."""
    s = settings.load_exchange(getter(runtime="kubernetes"))
    assert (s.runtime, s.namespace, s.service_account, s.exchange_audience, s.kube_config, s.exchange_timeout) \
        == ("kubernetes", "default", "default", "leoflow", "", 5.0)
    assert s.username == "system:serviceaccount:default:default"
    assert settings.load_exchange(getter(namespace="tasks", service_account="leoflow.task")).username \
        == "system:serviceaccount:tasks:leoflow.task"


@pytest.mark.parametrize("key, value", [
    ("namespace", "Tasks"), ("namespace", "a" * 64), ("namespace", ""), ("namespace", "a.b"),
    ("service_account", "Bad_Name"), ("service_account", ""),
    ("exchange_audience", ""), ("exchange_audience", "a b"), ("exchange_audience", "a,b"),
    ("exchange_timeout", "0"), ("exchange_timeout", "soon"), ("runtime", "docker"),
])
def test_exchange_options_name_key_and_value_when_malformed(key, value):
    with pytest.raises(ConfigError) as exc:
        settings.load_exchange(getter(**{key: value}))
    assert f"[leoflow] {key}" in str(exc.value) and repr(value) in str(exc.value)


def test_exchange_defaults_parse_and_do_not_collide_with_the_executors_options():
    for opt in settings.EXCHANGE_OPTIONS:
        settings._parse(opt, opt.default)
    assert not {o.name for o in settings.EXCHANGE_OPTIONS} & {o.name for o in settings.OPTIONS}

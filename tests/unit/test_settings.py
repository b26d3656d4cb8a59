"""``[leoflow]`` settings: defaults, the parse of every type, and a ConfigError naming key and value for
every malformed input (issue 2, "bad input gets a clear error").

Most tests hand :func:`leoflow_airflow.settings.load` a plain ``get`` (the narrow seam it offers); one reads
through Airflow's real config with an ``AIRFLOW__LEOFLOW__*`` environment variable.
"""

from __future__ import annotations

import re

import pytest

from leoflow_airflow import settings
from leoflow_airflow.errors import ConfigError


def getter(**overrides: str):
    """A ``get(section, key, fallback)`` returning ``overrides[key]`` or the fallback (the option default); also
    ``[database] sql_alchemy_conn`` (key ``sql_alchemy_conn``), which ``[leoflow] instance`` is derived from."""

    def get(section: str, key: str, fallback: str) -> str:
        assert section == "leoflow" or (section, key) == ("database", "sql_alchemy_conn")
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
    assert s.sweep_interval == 1.0
    assert s.settle_timeout == 10.0
    assert s.settle_budget == 20
    assert s.launch_queue_size == 64
    assert s.end_drain_timeout == 0.0
    assert s.agent_env_passthrough == ()
    assert s.zygote_preload == ()
    assert s.test_fault_injection is False


def test_every_option_has_a_field_and_a_default_that_parses():
    """OPTIONS and LeoflowSettings (with its KubernetesSettings group) agree, and each default is valid on its
    own."""
    fields = (set(settings.LeoflowSettings.__dataclass_fields__) - {"kubernetes", "warm"}) | \
        set(settings.KUBERNETES_KEYS) | set(settings.WARM_KEYS)
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
        ("sweep_interval", "-1", "0 or more"),
        ("sweep_interval", "6", "above [leoflow] maintenance_interval (5)"),
        ("settle_budget", "1.5", "not a valid integer"),
        ("settle_budget", "0", "greater than 0"),
        ("launch_queue_size", "many", "not a valid integer"),
        ("end_drain_timeout", "-0.5", "0 or more"),
        ("record_retention", "-1", "0 or more"),
        ("zygote_start_timeout", "0", "greater than 0"),
        ("test_fault_injection", "maybe", "not a valid boolean"),
        ("runtime", "docker", "`lite` or `kubernetes`"),
        ("namespace", "Airflow", "DNS-1123 label"),
        ("namespace", "a" * 64, "DNS-1123 label"),
        ("namespace", "", "DNS-1123 label"),
        ("namespace", "a.b", "DNS-1123 label"),
        ("service_account", "task runner", "DNS-1123 subdomain"),
        ("service_account", "Bad_Name", "DNS-1123 subdomain"),
        ("service_account", "", "DNS-1123 subdomain"),
        ("image", "repo/img: 1", "whitespace"),
        ("in_cluster", "perhaps", "not a valid boolean"),
        ("exchange_url", "api:8080/leoflow", "http:// or https:// URL"),
        ("exchange_audience", "a, b", "one non-empty audience"),
        ("exchange_audience", "a b", "one non-empty audience"),
        ("exchange_audience", "", "one non-empty audience"),
        ("exchange_timeout_seconds", "0", "greater than 0"),
        ("exchange_timeout_seconds", "soon", "not a valid float"),
        ("exchange_timeout_seconds", "13", "at most 12.5: the exchange makes two Kubernetes calls"),  # k8s review §4
        ("pod_override_allow", "spec.containers[0].image", "not a pod field path"),
        ("pod_override_allow", "spec.node_selector", "not a pod field path"),
        ("credential_ceiling_seconds", "599", "at least 600 s"),
        ("credential_ceiling_seconds", "-1", "at least 600 s"),
        ("credential_ceiling_seconds", "1.5", "not a valid integer"),
        ("zygote_preload", "pandas, dags/etl.py", "'dags/etl.py' is not a dotted module name"),
        ("zygote_preload", "os; rm -rf /", "'os; rm -rf /' is not a dotted module name"),
        ("zygote_preload", "pkg..mod", "'pkg..mod' is not a dotted module name"),
        ("reap_page_size", "0", "greater than 0"),
        ("reap_page_size", "-5", "greater than 0"),
        ("reap_page_size", "2.5", "not a valid integer"),
        ("orphan_run_threshold", "0", "greater than 0"),
        ("orphan_run_threshold", "soon", "not a valid float"),
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
    """The provider's ``[leoflow]`` defaults are exactly the OPTIONS table (the Kubernetes group included)."""
    cfg = settings.provider_config()["leoflow"]["options"]
    assert set(cfg) == {o.name for o in settings.OPTIONS}
    assert len(cfg) == len(settings.OPTIONS)  # no name defined twice
    for opt in settings.OPTIONS:
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


def test_reap_page_size_and_orphan_run_threshold():
    """``reap_page_size``: LIVE attempts per sync(), default 500; ``orphan_run_threshold``: seconds, default 240
    (below Airflow's 300 s heartbeat purge, above the 120 s agent_lost_threshold)."""
    loaded = settings.load(getter())
    assert (loaded.reap_page_size, loaded.orphan_run_threshold) == (500, 240.0)
    loaded = settings.load(getter(reap_page_size="1", orphan_run_threshold="90.5"))
    assert (loaded.reap_page_size, loaded.orphan_run_threshold) == (1, 90.5)


def test_malformed_agent_env_deny_through_airflow_config(monkeypatch):
    """What an operator sees for ``AIRFLOW__LEOFLOW__AGENT_ENV_DENY="AWS_*, MY VAR"``: key and value named."""
    monkeypatch.setenv("AIRFLOW__LEOFLOW__AGENT_ENV_DENY", "AWS_*, MY VAR")
    with pytest.raises(ConfigError, match=r"\[leoflow\] agent_env_deny = 'AWS_\*, MY VAR': 'MY VAR' is not an "
                                          r"environment variable name"):
        settings.load()


K8S_OK = {"image": "registry.example/leoflow:1", "exchange_url": "https://airflow.example/leoflow"}


def test_kubernetes_options_default_and_parse():
    """The Kubernetes group parses in any runtime: documented defaults, lists split, values stripped."""
    k = settings.load(getter()).kubernetes
    assert (k.namespace, k.image, k.pod_template_file, k.service_account) == ("default", "", "", "default")
    assert (k.in_cluster, k.kube_config, k.exchange_url) == (True, "", "")
    assert (k.exchange_audience, k.exchange_timeout_seconds) == ("urn:leoflow:exchange", 5.0)
    assert k.service_account_username == "system:serviceaccount:default:default"
    assert k.credential_ceiling_seconds == 604800
    assert "spec.containers.resources" in k.pod_override_allow and "metadata.labels" in k.pod_override_allow
    k = settings.load(getter(namespace=" airflow-tasks ", in_cluster="false", credential_ceiling_seconds="0",
                             pod_override_allow=" spec.nodeSelector,, spec.containers ")).kubernetes
    assert (k.namespace, k.in_cluster, k.credential_ceiling_seconds) == ("airflow-tasks", False, 0)
    assert k.pod_override_allow == ("spec.nodeSelector", "spec.containers")


def test_runtime_kubernetes_is_checked_together_then_loaded():
    """runtime = kubernetes: its options are checked together (what to fix is named); a complete configuration
    loads, with the exchange URL derived as the runtime's pods need it."""
    with pytest.raises(ConfigError) as err:
        settings.load(getter(runtime="kubernetes"))
    assert err.value.key == "leoflow.image" and "required with runtime = kubernetes" in str(err.value)
    loaded = settings.load(getter(runtime="kubernetes", **K8S_OK))
    assert loaded.runtime == "kubernetes"
    assert loaded.kubernetes == settings.load_kubernetes(getter(**K8S_OK))
    assert loaded.kubernetes.exchange_url


def test_pod_retention_options():
    """[leoflow] pod_retention_success / _failure: seconds (float, >= 0), defaults 60 and 3600."""
    k = settings.load(getter()).kubernetes
    assert (k.pod_retention_success, k.pod_retention_failure) == (60.0, 3600.0)
    k = settings.load(getter(pod_retention_success="0", pod_retention_failure="86400.5")).kubernetes
    assert (k.pod_retention_success, k.pod_retention_failure) == (0.0, 86400.5)
    for key in ("pod_retention_success", "pod_retention_failure"):
        with pytest.raises(ConfigError) as err:
            settings.load(getter(**{key: "-1"}))
        assert err.value.key == f"leoflow.{key}" and "0 or more" in str(err.value)


def test_kube_api_workers_option():
    """[leoflow] kube_api_workers: threads of the runtime's API pool, default 4, from 1 to 64."""
    assert settings.load(getter()).kubernetes.kube_api_workers == 4
    assert settings.load(getter(kube_api_workers="16")).kubernetes.kube_api_workers == 16
    for bad in ("0", "65"):
        with pytest.raises(ConfigError) as err:
            settings.load(getter(kube_api_workers=bad))
        assert err.value.key == "leoflow.kube_api_workers" and "from 1 to 64" in str(err.value)


def test_load_kubernetes_derives_the_exchange_url_from_api_base_url():
    """exchange_url empty: ``[api] base_url`` + ``/leoflow`` (never [core] execution_api_server_url); neither
    set, or a base_url that is no URL, is a ConfigError naming the key to set."""

    def get_with(api_base: str | None, **leoflow: str):
        def get(section: str, key: str, fallback: str) -> str:
            if section == "api":
                assert key == "base_url"
                return fallback if api_base is None else api_base
            return leoflow.get(key, fallback)
        return get

    k = settings.load_kubernetes(get_with("https://airflow.example/sub/", image="i"))
    assert k.exchange_url == "https://airflow.example/sub/leoflow"
    k = settings.load_kubernetes(get_with("https://other", image="i", exchange_url="http://api:8080/leoflow/"))
    assert k.exchange_url == "http://api:8080/leoflow"
    with pytest.raises(ConfigError) as err:
        settings.load_kubernetes(get_with(None, image="i"))
    assert err.value.key == "leoflow.exchange_url" and "[api] base_url" in str(err.value)
    with pytest.raises(ConfigError) as err:
        settings.load_kubernetes(get_with("airflow.example", image="i"))
    assert err.value.key == "api.base_url"


@pytest.mark.parametrize(("entry", "why"), [
    ("spec.nodeSelectr", "has no field 'nodeSelectr'"),
    ("spec.nodeSelector.disktype", "has no fields below it"),
    ("spec.restartPolicy", "pinned by leoflow"),
    ("spec.containers.securityContext.privileged", "pinned by leoflow"),
    ("spec.containers.args", "pinned by leoflow"),
    ("metadata.name", "pinned by leoflow"),
    ("spec.automountServiceAccountToken", "pinned by leoflow"),
])
def test_pod_override_allow_entries_must_name_overridable_pod_fields(entry, why):
    """With runtime = kubernetes every allowlist entry must name a V1Pod field that leoflow does not pin."""
    with pytest.raises(ConfigError) as err:
        settings.load_kubernetes(getter(pod_override_allow=f"metadata.labels, {entry}", **K8S_OK))
    assert err.value.key == "leoflow.pod_override_allow" and why in str(err.value), str(err.value)
    ok = settings.load_kubernetes(getter(pod_override_allow="spec, spec.containers.securityContext.runAsUser",
                                         **K8S_OK))
    assert ok.pod_override_allow == ("spec", "spec.containers.securityContext.runAsUser")


def test_provider_config_groups_kubernetes_keys_under_leoflow():
    """The new keys register with the provider's ``[leoflow]`` defaults like the others."""
    cfg = settings.provider_config()["leoflow"]["options"]
    for key in settings.KUBERNETES_KEYS:
        assert key in cfg and cfg[key]["description"]
    assert cfg["credential_ceiling_seconds"]["type"] == "integer"
    assert cfg["in_cluster"]["type"] == "boolean"
    assert cfg["exchange_timeout_seconds"]["type"] == "float"
    for gone in ("token_audience", "exchange_timeout"):  # one name per concept: the merged halves' old names
        assert gone not in cfg


# --- the token exchange reads the same group --------------------------------------------------------------

def test_load_exchange_reads_the_same_group_the_pod_builder_reads():
    """The api-server's exchange reads the one Kubernetes group: off (None) unless runtime = kubernetes; then
    the same values ``load(...).kubernetes`` gives, without what only the scheduler needs (an image, the
    exchange URL), and the username the exchange accepts derives from namespace and ServiceAccount."""
    assert settings.load_exchange(getter()) is None
    values = dict(namespace="tasks", service_account="leoflow.task", exchange_audience="urn:x",
                  exchange_timeout_seconds="2.5", in_cluster="false", kube_config="/etc/kube/api.yaml")
    k = settings.load_exchange(getter(runtime="kubernetes", **values))
    assert k == settings.load(getter(**values)).kubernetes
    assert (k.exchange_audience, k.exchange_timeout_seconds, k.in_cluster, k.kube_config) == \
        ("urn:x", 2.5, False, "/etc/kube/api.yaml")
    assert k.service_account_username == "system:serviceaccount:tasks:leoflow.task"
    assert settings.load_exchange(getter(runtime="kubernetes")).image == ""  # not required here


@pytest.mark.parametrize("load", [
    lambda get: settings.load_exchange(get),
    lambda get: settings.load_kubernetes(get),
], ids=["exchange", "scheduler"])
def test_kube_config_with_in_cluster_is_refused_by_both_halves(load):
    """``kube_config`` is read only when ``in_cluster`` is False; setting it with in_cluster True (the
    default) would be silently ignored, so the exchange and the scheduler both refuse it naming the key."""
    with pytest.raises(ConfigError) as err:
        load(getter(runtime="kubernetes", kube_config="/etc/kube/config", **K8S_OK))
    assert err.value.key == "leoflow.kube_config" and "in_cluster = False" in str(err.value)
    assert load(getter(runtime="kubernetes", kube_config="/etc/kube/config", in_cluster="False",
                       **K8S_OK)).kube_config == "/etc/kube/config"


def test_a_malformed_value_turns_the_exchange_off_naming_it():
    """One validation: the exchange parses ``[leoflow]`` as the scheduler does, so the same malformed value
    is named the same way."""
    for key, value in (("namespace", "Tasks"), ("exchange_timeout_seconds", "soon"), ("runtime", "docker")):
        with pytest.raises(ConfigError) as err:
            settings.load_exchange(getter(**{"runtime": "kubernetes", key: value}))
        assert f"[leoflow] {key} = {value!r}" in str(err.value)


# --- the installation identity (k8s review §5) -------------------------------------------------------------


def test_instance_defaults_to_a_hash_of_the_metadata_database_never_of_its_credentials():
    """Two Airflows on different metadata databases get different ``[leoflow] instance`` values with no
    configuration; one Airflow's processes (one URL, whatever driver or credentials a process uses) the same one;
    the value is a DNS-label-safe 12 hex digits and carries nothing of the user or password."""
    url = "postgresql+psycopg2://airflow:s3cret@db.prod.example:5432/airflow"

    def instance(conn: str, **more: str) -> str:
        return settings.load(getter(sql_alchemy_conn=conn, **more)).kubernetes.instance

    prod = instance(url)
    assert re.fullmatch(r"[0-9a-f]{12}", prod) and prod == settings.instance_id(url)
    assert instance("postgresql://other:pw2@DB.prod.example:5432/airflow") == prod  # driver, user, password, case
    assert instance("postgresql://airflow:s3cret@db.staging.example:5432/airflow") != prod  # another database host
    assert instance("postgresql://airflow:s3cret@db.prod.example:5432/airflow_b") != prod  # another database
    assert instance("mysql://airflow:s3cret@db.prod.example:5432/airflow") != prod  # another backend
    assert instance("sqlite:////opt/airflow/airflow.db") != instance("sqlite:////opt/other/airflow.db")
    assert instance(url, instance="team-a") == "team-a"  # an explicit value wins
    assert settings.load_exchange(getter(runtime="kubernetes", sql_alchemy_conn=url)).instance == prod  # api-server


@pytest.mark.parametrize("value", ["Team-A", "team_a", "-a", "a-", "a" * 41, "a.b"])
def test_an_instance_that_is_no_short_dns_label_is_refused_naming_the_option(value):
    with pytest.raises(ConfigError) as err:
        settings.load(getter(instance=value))
    assert err.value.key == "leoflow.instance" and "DNS-1123 label of at most 40" in str(err.value), str(err.value)
    assert settings.load(getter(instance="a" * 40)).kubernetes.instance == "a" * 40


def test_an_instance_that_cannot_be_derived_is_refused_without_echoing_the_database_url():
    with pytest.raises(ConfigError) as err:
        settings.load(getter(sql_alchemy_conn="not a url:s3cret"))
    assert err.value.key == "leoflow.instance" and "set [leoflow] instance" in str(err.value)
    assert "s3cret" not in str(err.value)
    assert settings.load(getter(sql_alchemy_conn="not a url", instance="prod")).kubernetes.instance == "prod"

"""Pure parts of running on a secured cluster: connection settings (TLS, secrets), the
compaction role's grants, the Airflow settings' TLS overrides, the local cluster's layout."""

from __future__ import annotations

import ipaddress
import json
import ssl
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from counters.cli import cli
from counters.config import Family
from counters.connection import ConnectionConfigError, ConnectionSettings
from counters.schema import compactor_grants, compactor_tables
from cryptography import x509

from tests.airflow_connections import airflow_conn as shared_airflow_conn
from tests.cluster.pki import write_client_cert, write_test_pki

pytestmark = pytest.mark.unit

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def family(**overrides: object) -> Family:
    fields: dict[str, object] = {
        "name": "trades",
        "keyspace": "ks",
        "raw_table": "raw",
        "compact_table": "compact",
        "lag": "1m",
    }
    fields.update(overrides)
    return Family.model_validate(fields)


def test_password_never_shows_in_the_settings_repr_or_description():
    settings = ConnectionSettings(username="compactor", password="hunter2-secret", tls=True)
    assert "hunter2-secret" not in repr(settings)
    assert settings.describe() == "compactor@127.0.0.1:9042 (TLS)"


def test_tls_from_the_environment(tmp_path):
    ca = write_test_pki(tmp_path, ["127.0.0.1"]) / "ca.pem"
    plain = ConnectionSettings.from_env({"CASSANDRA_HOSTS": "a,b"})
    assert (plain.tls, plain.ssl_context()) == (False, None)
    settings = ConnectionSettings.from_env({"CASSANDRA_TLS_CA_FILE": str(ca)})
    assert settings.tls and settings.tls_ca_file == str(ca) and settings.tls_check_hostname
    context = settings.ssl_context()
    assert context.check_hostname and context.verify_mode is ssl.CERT_REQUIRED
    assert [c["subject"] for c in context.get_ca_certs()]  # the test CA is what it trusts
    relaxed = ConnectionSettings.from_env(
        {"CASSANDRA_TLS_CA_FILE": str(ca), "CASSANDRA_TLS_CHECK_HOSTNAME": "false"}
    )
    assert not relaxed.ssl_context().check_hostname
    assert relaxed.ssl_context().verify_mode is ssl.CERT_REQUIRED  # the chain still counts
    assert ConnectionSettings.from_env({"CASSANDRA_TLS": "yes"}).tls


def test_bad_tls_settings_name_what_is_wrong(tmp_path):
    with pytest.raises(ConnectionConfigError, match="CASSANDRA_TLS_CA_FILE: no such file"):
        ConnectionSettings.from_env({"CASSANDRA_TLS_CA_FILE": str(tmp_path / "missing.pem")})
    with pytest.raises(ConnectionConfigError, match="CASSANDRA_TLS_CHECK_HOSTNAME must be"):
        ConnectionSettings.from_env({"CASSANDRA_TLS": "1", "CASSANDRA_TLS_CHECK_HOSTNAME": "maybe"})


def airflow_conn(extra: dict) -> SimpleNamespace:
    return shared_airflow_conn(
        extra, host="10.0.0.1, 10.0.0.2", port=9142, login="compactor", password="s3cret"
    )


def test_tls_from_the_airflow_connection_ssl_options(tmp_path):
    ca = write_test_pki(tmp_path, ["127.0.0.1"]) / "ca.pem"
    settings = ConnectionSettings.from_airflow_connection(
        airflow_conn({"ssl_options": {"ca_certs": str(ca), "check_hostname": "false"}})
    )
    assert settings.hosts == ("10.0.0.1", "10.0.0.2") and settings.port == 9142
    assert (settings.username, settings.password) == ("compactor", "s3cret")
    assert (settings.tls, settings.tls_ca_file, settings.tls_check_hostname) == (
        True,
        str(ca),
        False,
    )
    assert not ConnectionSettings.from_airflow_connection(airflow_conn({})).tls
    with pytest.raises(ConnectionConfigError, match=r"'cassandra_default': extra\.ssl_options"):
        ConnectionSettings.from_airflow_connection(airflow_conn({"ssl_options": {"cafile": "x"}}))
    with pytest.raises(ConnectionConfigError, match="ca_certs: no such file"):
        ConnectionSettings.from_airflow_connection(
            airflow_conn({"ssl_options": {"ca_certs": str(tmp_path / "nope.pem")}})
        )


def test_ssl_options_take_what_the_cassandra_hook_takes_client_certificates_included(tmp_path):
    """The keys CassandraHook passes to the driver; certfile/keyfile: mutual TLS."""
    folder = write_test_pki(tmp_path, ["127.0.0.1"])
    cert, key = write_client_cert(folder, "compactor")
    options = {
        "ca_certs": str(folder / "ca.pem"),
        "certfile": str(cert),
        "keyfile": str(key),
        "cert_reqs": "CERT_REQUIRED",
        "check_hostname": True,
        "ssl_version": "PROTOCOL_TLSv1_2",
        "ciphers": "ECDHE+AESGCM",
        "server_hostname": "node1.cassandra.internal",
        "suppress_ragged_eofs": "true",
    }
    settings = ConnectionSettings.from_airflow_connection(airflow_conn({"ssl_options": options}))
    assert (settings.tls_cert_file, settings.tls_key_file) == (str(cert), str(key))
    context = settings.ssl_context()
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version == context.maximum_version == ssl.TLSVersion.TLSv1_2
    assert settings.ssl_socket_options() == {
        "server_hostname": "node1.cassandra.internal",
        "suppress_ragged_eofs": True,
    }
    assert settings.describe() == "compactor@10.0.0.1,10.0.0.2:9142 (mutual TLS)"
    # the driver's numbers work too; CERT_NONE turns the host name check off
    relaxed = ConnectionSettings.from_airflow_connection(
        airflow_conn({"ssl_options": {"cert_reqs": 0, "ssl_version": 16}})
    )
    assert relaxed.ssl_context().verify_mode is ssl.CERT_NONE
    assert not relaxed.ssl_context().check_hostname
    env = ConnectionSettings.from_env(
        {"CASSANDRA_TLS_CERT_FILE": str(cert), "CASSANDRA_TLS_KEY_FILE": str(key)}
    )
    assert env.tls and env.ssl_context() is not None and env.tls_key_file == str(key)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"keyfile": "KEY"}, r"ssl_options\.keyfile is set without .*ssl_options\.certfile"),
        ({"certfile": "/no/such.crt"}, r"ssl_options\.certfile: no such file '/no/such\.crt'"),
        ({"cert_reqs": "SOMETIMES"}, r"ssl_options\.cert_reqs must be CERT_REQUIRED"),
        ({"ssl_version": "SSLv3"}, r"ssl_options\.ssl_version must be one of PROTOCOL_TLS_CLIENT"),
        ({"server_side": True}, r"unknown keys \['server_side'\] \(supported: ca_certs"),
        ({"cert_reqs": "CERT_NONE", "check_hostname": True}, "check_hostname true needs"),
        ({"do_handshake_on_connect": "perhaps"}, r"do_handshake_on_connect must be true or"),
    ],
)
def test_bad_ssl_options_name_the_key_and_the_value(tmp_path, options, message):
    key = tmp_path / "client.key"
    key.write_text("not a key")
    options = {k: (str(key) if v == "KEY" else v) for k, v in options.items()}
    with pytest.raises(ConnectionConfigError, match=message):
        ConnectionSettings.from_airflow_connection(airflow_conn({"ssl_options": options}))


def test_a_client_certificate_that_does_not_load_names_the_file(tmp_path):
    bad = tmp_path / "client.crt"
    bad.write_text("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    settings = ConnectionSettings.from_airflow_connection(
        airflow_conn({"ssl_options": {"certfile": str(bad)}})
    )
    with pytest.raises(ConnectionConfigError, match=f"TLS client certificate '{bad}'"):
        settings.ssl_context()


def test_compactor_tables_follow_the_kind():
    increments = dict(compactor_tables(family()))
    assert increments["raw"] == ("SELECT", "MODIFY")  # it deletes what it folded
    assert set(increments) == {
        "raw",
        "compact",
        "raw_touched",
        "compact_ledger",
        "compact_runs",
        "compact_quarantine",
        "counters_audit_by_month",
        "counters_audit_months",
        "counters_lease",
        "counters_family_state",
        "counters_tables",
    }
    rows = dict(compactor_tables(family(kind="rows")))
    assert rows["raw"] == ("SELECT",)  # business data: read only
    unique = dict(compactor_tables(family(kind="unique", columns={"member": "user"})))
    assert unique["raw_firsts"] == ("SELECT", "MODIFY") and unique["raw"] == ("SELECT", "MODIFY")


def test_grants_are_per_table_without_repeats_and_never_keyspace_wide():
    grants = compactor_grants([family(), family(name="likes", raw_table="r2", compact_table="c2")])
    assert len(grants) == len(set(grants))
    assert grants.count('GRANT MODIFY ON TABLE "ks"."counters_audit_by_month" TO "compactor"') == 1
    assert not [g for g in grants if '"counters_audit"' in g]  # the legacy table: init moves it
    assert all(g.startswith(("GRANT SELECT ON TABLE ", "GRANT MODIFY ON TABLE ")) for g in grants)
    assert 'GRANT SELECT ON TABLE "ks"."r2" TO "compactor"' in grants
    assert all(g.endswith(' TO "ops"') for g in compactor_grants([family()], role="ops"))


def test_counterctl_init_print_grants_needs_no_cluster(tmp_path):
    config = tmp_path / "families.yaml"
    config.write_text(
        "families:\n  - {name: trades, keyspace: ks, raw_table: raw, compact_table: compact, "
        "lag: 1m}\n"
    )
    result = CliRunner().invoke(
        cli, ["--config", str(config), "init", "--print-grants", "--role", "ops"]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("-- Least-privilege grants for the compaction role 'ops'")
    assert [line.rstrip(";") for line in lines if not line.startswith("--")] == compactor_grants(
        [family()], role="ops"
    )


def test_airflow_settings_put_tls_into_ssl_options(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import airflow_settings

    conns = {"cassandra_default": {"conn_type": "cassandra", "host": "h"}}
    changed = airflow_settings.apply_cassandra_env(
        conns,
        {
            "CASSANDRA_USERNAME": "compactor",
            "CASSANDRA_PASSWORD": "s3cret",
            "CASSANDRA_TLS_CA_FILE": "/etc/ca.pem",
            "CASSANDRA_TLS_CHECK_HOSTNAME": "true",
        },
    )
    conn = conns["cassandra_default"]
    assert json.loads(conn["extra"])["ssl_options"] == {
        "ca_certs": "/etc/ca.pem",
        "check_hostname": True,
    }
    assert conn["password"] == "s3cret" and not any("s3cret" in c for c in changed)
    assert "s3cret" not in json.dumps(airflow_settings.redact(conns))
    sys.modules.pop("airflow_settings", None)


def test_test_pki_names_each_node_by_its_address(tmp_path):
    folder = write_test_pki(tmp_path, ["127.0.0.1", "127.0.0.2"])
    ca = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
    node = x509.load_pem_x509_certificate((folder / "127.0.0.2.pem").read_bytes())
    assert node.issuer == ca.subject
    names = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.2")]
    assert b"PRIVATE KEY" in (folder / "127.0.0.2.pem").read_bytes()
    assert (folder / "127.0.0.2.pem").stat().st_mode & 0o077 == 0


def test_local_cluster_layout(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import cassandra_node

    spec = cassandra_node.ClusterSpec(name="c", auth=True, client_tls="/tls")
    nodes = spec.instances()
    assert [(n.name, n.address, n.native_port, n.storage_port, n.jmx_port) for n in nodes] == [
        ("c-1", "127.0.0.1", 9342, 7400, 7401),
        ("c-2", "127.0.0.2", 9342, 7400, 7402),
        ("c-3", "127.0.0.3", 9342, 7400, 7403),
    ]
    tokens = [spec.initial_token(n) for n in (1, 2, 3)]
    assert tokens[0] == -(2**63) and tokens == sorted(tokens) and tokens[2] < 2**63
    config = cassandra_node.cassandra_yaml(nodes[1])
    assert "listen_address: 127.0.0.2\n" in config and "rpc_address: 127.0.0.2\n" in config
    assert 'seeds: "127.0.0.1:7400,127.0.0.2:7400,127.0.0.3:7400"' in config
    assert "authenticator: PasswordAuthenticator" in config
    assert "authorizer: CassandraAuthorizer" in config
    assert "keystore: /tls/127.0.0.2.pem" in config and "optional: false" in config
    single = cassandra_node.cassandra_yaml(cassandra_node.Instance("dev", 9042, 7000, 7199, "1G"))
    assert "authenticator: AllowAllAuthenticator" in single and "client_encryption" not in single
    assert "initial_token: 0\n" in single
    # only the single `test` node skips flushing its system tables; cluster nodes are killed
    test_node = cassandra_node.Instance("test", 9142, 7100, 7299, "1G")
    assert cassandra_node.unsafe_system(test_node)
    assert not cassandra_node.unsafe_system(cassandra_node.Instance("dev", 9042, 7000, 7199, "1G"))
    assert not any(cassandra_node.unsafe_system(n) for n in nodes)
    with pytest.raises(cassandra_node.NodeError, match="no node 4"):
        spec.instances(4)
    sys.modules.pop("cassandra_node", None)

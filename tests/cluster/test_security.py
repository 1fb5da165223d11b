"""Authentication, client TLS and the least-privilege ``compactor`` role, on the cluster."""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import ssl
import subprocess
import sys
from dataclasses import replace
from datetime import timedelta

import pytest
from cassandra import Unauthorized
from counters.connection import CassandraUnavailable, Connection
from counters.schema import compactor_tables, ensure_schema

from .conftest import COMPACTOR, REPLICATION, assert_exact, grant_printed
from .pki import write_client_cert, write_test_pki
from .test_faults import load

pytestmark = pytest.mark.cluster


def test_connections_need_tls_a_trusted_certificate_and_a_login(local_cluster, tmp_path):
    admin = local_cluster.settings(*local_cluster.admin)
    with Connection(admin) as conn:  # the baseline: TLS, the cluster's CA, a login
        assert conn.session.execute("SELECT release_version FROM system.local").one()
    with pytest.raises(CassandraUnavailable, match=rf"127\.0\.0\.1:{local_cluster.port}"):
        Connection(replace(admin, tls=False, tls_ca_file=None))  # plain text: refused
    stranger = write_test_pki(tmp_path / "other-ca", ["127.0.0.1"]) / "ca.pem"
    with pytest.raises(CassandraUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        Connection(replace(admin, tls_ca_file=str(stranger)))
    # the host name check: a node's certificate names its own address, nothing else
    with (
        socket.create_connection(("127.0.0.1", local_cluster.port), timeout=10) as raw,
        pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"),
    ):
        admin.ssl_context().wrap_socket(raw, server_hostname="127.0.0.2")
    relaxed = replace(admin, tls_check_hostname=False).ssl_context()
    with socket.create_connection(("127.0.0.1", local_cluster.port), timeout=10) as raw:
        relaxed.wrap_socket(raw, server_hostname="127.0.0.2").close()  # the chain still counts
    # the launcher disabled the default superuser; a wrong password is refused, not echoed
    with pytest.raises(CassandraUnavailable, match="cassandra is not permitted to log in"):
        Connection(local_cluster.settings("cassandra", "cassandra"))
    wrong = f"wrong-{secrets.token_hex(6)}"
    with pytest.raises(CassandraUnavailable, match="Bad credentials") as refused:
        Connection(local_cluster.settings(COMPACTOR, wrong))
    assert wrong not in str(refused.value)


def test_mutual_tls_the_airflow_connections_client_certificate_gets_in_others_do_not(
    local_cluster, cluster_family, compactor_password, t0, tmp_path
):
    """The nodes require a client certificate signed by the cluster tests' CA. A client with
    none, or with one of another CA, is refused; a certificate issued now by that CA, given as
    the Airflow connection's ``ssl_options`` ``certfile``/``keyfile`` (what CassandraHook
    takes), gets in: ``counterctl --conn-id`` compacts and reads through it, as the DAGs do."""
    admin = local_cluster.settings(*local_cluster.admin)
    with pytest.raises(CassandraUnavailable, match=r"cannot reach Cassandra at .*\(TLS\)"):
        Connection(replace(admin, tls_cert_file=None))  # no client certificate
    stranger = write_test_pki(tmp_path / "other-ca", ["127.0.0.1"]) / "client.pem"
    with pytest.raises(CassandraUnavailable, match=r"\(mutual TLS\)"):
        Connection(replace(admin, tls_cert_file=str(stranger)))  # signed by another CA

    cert, key = write_client_cert(local_cluster.ca_file.parent, f"airflow-{secrets.token_hex(3)}")
    cf = cluster_family()
    expected = load(cf, t0, ["m0", "m1"])
    epoch = t0 + timedelta(minutes=10)
    airflow_conn = {
        "conn_type": "cassandra",
        "host": ",".join(local_cluster.addresses),
        "port": local_cluster.port,
        "login": COMPACTOR,
        "password": compactor_password,
        "extra": {
            "load_balancing_policy": "DCAwareRoundRobinPolicy",
            "load_balancing_policy_args": {"local_dc": "datacenter1"},
            "ssl_options": {
                "ca_certs": str(local_cluster.ca_file),
                "certfile": str(cert),
                "keyfile": str(key),
                "cert_reqs": "CERT_REQUIRED",
                "check_hostname": True,
            },
        },
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASSANDRA_")}
    env.update(
        {"AIRFLOW_CONN_CASSANDRA_MTLS": json.dumps(airflow_conn), "PYTHONWARNINGS": "ignore"}
    )
    counterctl = [sys.executable, "-m", "counters", "--config", str(cf.config)]
    counterctl += ["--conn-id", "cassandra_mtls"]
    compact = subprocess.run(
        [*counterctl, "compact", "--family", cf.family.name, "--epoch", epoch.isoformat(),
         "--json"],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert compact.returncode == 0, compact.stdout + compact.stderr
    assert json.loads(compact.stdout)["outcome"] == "success"
    read = subprocess.run(
        [*counterctl, "read", "--family", cf.family.name, "--json", "m0", "m1"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert [c["value"] for c in json.loads(read.stdout)] == [expected["m0"], expected["m1"]]
    assert compactor_password not in compact.stdout + compact.stderr + read.stdout + read.stderr
    assert_exact(cf, expected, epoch)


def test_compactor_runs_with_the_printed_grants_and_can_touch_nothing_else(
    local_cluster, cluster_family, admin_conn, compactor_conn, compactor_password, t0
):
    """Over 30 s, and why: three ``counterctl`` processes (compact, read, and init alongside
    them) log in over TLS at RF=3, and the refusals need schema of their own (a keyspace, a
    table, an ungranted family's tables), each change agreed by the three nodes."""
    cf = cluster_family()
    family = cf.family
    counters = [f"s{i}" for i in range(20)]
    expected = load(cf, t0, counters)
    epoch = t0 + timedelta(minutes=10)
    env = local_cluster.env(COMPACTOR, compactor_password)
    counterctl = [sys.executable, "-m", "counters.cli", "--config", str(cf.config)]
    # counterctl init as the compactor, checked at the end: refused, it changes nothing the
    # rest reads, so it runs alongside
    init = subprocess.Popen(
        [*counterctl, "init", "--family", family.name],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    compact = subprocess.run(
        [*counterctl, "compact", "--family", family.name, "--epoch", epoch.isoformat(), "--json"],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert compact.returncode == 0, compact.stdout + compact.stderr
    assert json.loads(compact.stdout)["outcome"] == "success"
    read = subprocess.run(
        [*counterctl, "read", "--family", family.name, "--json", "s0", "s1"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert [c["value"] for c in json.loads(read.stdout)] == [expected["s0"], expected["s1"]]
    assert_exact(cf, expected, epoch)

    # what the role holds is exactly what --print-grants printed for its families' tables
    printed = grant_printed(cf.config, family.name, admin_conn)  # idempotent: granted again
    pattern = re.compile(r'GRANT (SELECT|MODIFY) ON TABLE "(\w+)"\."(\w+)" TO "compactor"')
    parsed = [pattern.fullmatch(g) for g in printed]
    assert all(parsed), printed
    assert {(m[1], m[3]) for m in parsed} == {
        (p, t) for t, permissions in compactor_tables(family) for p in permissions
    }
    assert {m[2] for m in parsed} == {family.keyspace}
    held = admin_conn.session.execute(f"LIST ALL PERMISSIONS OF {COMPACTOR}")
    assert {r.permission for r in held} == {"SELECT", "MODIFY"}
    held = admin_conn.session.execute(f"LIST ALL PERMISSIONS OF {COMPACTOR}")
    assert all(r.resource.startswith(f"<table {family.keyspace}.") for r in held)

    # and nothing else: another keyspace, another family's tables, DDL, roles, grants
    other = f"t_other_{secrets.token_hex(3)}"
    admin_conn.session.execute(f"CREATE KEYSPACE {other} WITH replication = {REPLICATION}")
    admin_conn.session.execute(f"CREATE TABLE {other}.secrets (k text PRIMARY KEY, v text)")
    admin_conn.session.execute(f"INSERT INTO {other}.secrets (k, v) VALUES ('a', 'b')")
    ungranted = family.model_copy(update={"name": "ungranted", "raw_table": "raw_ungranted",
                                          "compact_table": "compact_ungranted"})  # fmt: skip
    ensure_schema(admin_conn.session, ungranted, REPLICATION)
    ks = family.keyspace
    refused = [
        f"SELECT * FROM {other}.secrets",
        f"INSERT INTO {other}.secrets (k, v) VALUES ('x', 'y')",
        f"DELETE FROM {other}.secrets WHERE k = 'a'",
        f"DROP KEYSPACE {other}",
        f"SELECT * FROM {ks}.raw_ungranted",
        f"INSERT INTO {ks}.compact_ungranted (type, value) VALUES ('x', 1)",
        f"CREATE TABLE {ks}.sneaky (k text PRIMARY KEY)",
        f"ALTER TABLE {ks}.{family.raw_table} WITH gc_grace_seconds = 0",
        f"DROP TABLE {ks}.{family.compact_table}",
        f"CREATE KEYSPACE sneaky WITH replication = {REPLICATION}",
        f"GRANT SELECT ON ALL KEYSPACES TO {COMPACTOR}",
        f"GRANT SELECT ON KEYSPACE {other} TO {COMPACTOR}",
        "CREATE ROLE sneaky WITH LOGIN = true AND PASSWORD = 'x'",
        f"ALTER ROLE {COMPACTOR} WITH SUPERUSER = true",
        "SELECT * FROM system_auth.roles",
    ]
    for statement in refused:
        with pytest.raises(Unauthorized):
            compactor_conn.session.execute(statement)
    assert admin_conn.session.execute(f"SELECT v FROM {other}.secrets WHERE k = 'a'").one().v == "b"

    # counterctl init as the compactor: one line, the permission it lacks, exit 2
    init_out, init_err = init.communicate(timeout=120)
    assert init.returncode == 2, init_out + init_err
    assert init_err.startswith("Error: permission denied: ") and init_err.count("\n") == 1
    assert "counterctl init --print-grants" in init_err
    admin_conn.session.execute(f"DROP KEYSPACE {other}", timeout=120)

#!/usr/bin/env python3
"""Apply airflow_settings.yaml (astro-cli schema) to the local Airflow metadata DB.

    .venv/bin/python scripts/airflow_settings.py [--file airflow_settings.yaml] [--dry-run]

Airflow cannot import the astro format directly, so this converts it:
  connections -> JSON file -> `airflow connections import --overwrite`
  variables   -> JSON file -> `airflow variables import -a overwrite`
  pools       -> one `airflow pools set NAME SLOTS DESCRIPTION` each
using the airflow executable next to this Python (the project venv), with PYTHONWARNINGS=ignore.
AIRFLOW_HOME and friends come from the environment (scripts/env.sh sets them).

The `cassandra_default` connection follows the environment, like the rest of the project:
CASSANDRA_HOSTS (comma separated), CASSANDRA_PORT, CASSANDRA_USERNAME, CASSANDRA_PASSWORD,
CASSANDRA_LOCAL_DC and CASSANDRA_TLS_CA_FILE / CASSANDRA_TLS / CASSANDRA_TLS_CHECK_HOSTNAME /
CASSANDRA_TLS_CERT_FILE / CASSANDRA_TLS_KEY_FILE (extra.ssl_options) replace the matching fields
when set (disable with --no-env-overrides).
The password only reaches `airflow connections import` through a 0600 temporary file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

PROJECT = Path(__file__).resolve().parent.parent
DEFAULT_FILE = PROJECT / "airflow_settings.yaml"
CASSANDRA_CONN_ID = "cassandra_default"

CONN_FIELDS = {
    "conn_type": "conn_type",
    "conn_host": "host",
    "conn_port": "port",
    "conn_schema": "schema",
    "conn_login": "login",
    "conn_password": "password",
    "conn_extra": "extra",
    "conn_description": "description",
}


class SettingsError(Exception):
    pass


def load_settings(path: Path) -> dict[str, list[dict[str, Any]]]:
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SettingsError(f"cannot read {path}: {exc}") from exc
    section = doc.get("airflow") or {}
    if not isinstance(section, dict):
        raise SettingsError(f"{path}: top-level `airflow:` must be a mapping")
    unknown = set(section) - {"connections", "pools", "variables"}
    if unknown:
        raise SettingsError(f"{path}: unknown keys under `airflow:`: {sorted(unknown)}")
    return {key: list(section.get(key) or []) for key in ("connections", "pools", "variables")}


def convert_connections(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """astro entries -> the mapping `airflow connections import` reads (conn_id -> fields)."""
    result: dict[str, dict[str, Any]] = {}
    for entry in entries:
        conn_id = entry.get("conn_id")
        if not conn_id:
            raise SettingsError(f"connection without conn_id: {entry}")
        unknown = set(entry) - set(CONN_FIELDS) - {"conn_id"}
        if unknown:
            raise SettingsError(f"connection {conn_id}: unknown keys {sorted(unknown)}")
        if not entry.get("conn_type"):
            raise SettingsError(f"connection {conn_id}: conn_type is required")
        conn: dict[str, Any] = {}
        for astro_key, airflow_key in CONN_FIELDS.items():
            value = entry.get(astro_key)
            if value is None or value == "":
                continue
            if astro_key == "conn_port":
                value = int(value)
            if astro_key == "conn_extra":
                if isinstance(value, str):
                    value = json.loads(value)  # validate; normalised below
                if not value:
                    continue
                value = json.dumps(value, sort_keys=True)
            conn[airflow_key] = value
        result[conn_id] = conn
    return result


def apply_cassandra_env(conns: dict[str, dict[str, Any]], env: dict[str, str]) -> list[str]:
    """Point cassandra_default at CASSANDRA_* from the environment. Returns what changed."""
    conn = conns.get(CASSANDRA_CONN_ID)
    if conn is None:
        return []
    changed = []
    if env.get("CASSANDRA_HOSTS"):
        conn["host"] = ",".join(h.strip() for h in env["CASSANDRA_HOSTS"].split(",") if h.strip())
        changed.append(f"host={conn['host']}")
    if env.get("CASSANDRA_PORT"):
        conn["port"] = int(env["CASSANDRA_PORT"])
        changed.append(f"port={conn['port']}")
    if env.get("CASSANDRA_USERNAME"):
        conn["login"] = env["CASSANDRA_USERNAME"]
        conn["password"] = env.get("CASSANDRA_PASSWORD", "")
        changed.append(f"login={conn['login']} (password from CASSANDRA_PASSWORD)")
    tls_on = (env.get("CASSANDRA_TLS") or "").strip().lower() in ("1", "true", "yes", "on")
    if env.get("CASSANDRA_TLS_CA_FILE") or env.get("CASSANDRA_TLS_CERT_FILE") or tls_on:
        extra = json.loads(conn.get("extra") or "{}")
        ssl_options = extra.setdefault("ssl_options", {})
        for variable, key in (
            ("CASSANDRA_TLS_CA_FILE", "ca_certs"),
            ("CASSANDRA_TLS_CERT_FILE", "certfile"),
            ("CASSANDRA_TLS_KEY_FILE", "keyfile"),
        ):
            if env.get(variable):
                ssl_options[key] = env[variable]
        if env.get("CASSANDRA_TLS_CHECK_HOSTNAME"):
            check = env["CASSANDRA_TLS_CHECK_HOSTNAME"].strip().lower()
            ssl_options["check_hostname"] = check not in ("0", "false", "no", "off")
        conn["extra"] = json.dumps(extra, sort_keys=True)
        changed.append(f"ssl_options={json.dumps(ssl_options, sort_keys=True)}")
    if env.get("CASSANDRA_LOCAL_DC"):
        extra = json.loads(conn.get("extra") or "{}")
        args = extra.setdefault("load_balancing_policy_args", {})
        if extra.get("load_balancing_policy") == "TokenAwarePolicy":
            args.setdefault("child_load_balancing_policy", "DCAwareRoundRobinPolicy")
            args = args.setdefault("child_load_balancing_policy_args", {})
        elif not extra.get("load_balancing_policy"):
            extra["load_balancing_policy"] = "DCAwareRoundRobinPolicy"
        args["local_dc"] = env["CASSANDRA_LOCAL_DC"]
        conn["extra"] = json.dumps(extra, sort_keys=True)
        changed.append(f"local_dc={env['CASSANDRA_LOCAL_DC']}")
    if env.get("CASSANDRA_PROTOCOL_VERSION"):  # unset: the connection's (none: negotiated)
        extra = json.loads(conn.get("extra") or "{}")
        extra["protocol_version"] = int(env["CASSANDRA_PROTOCOL_VERSION"])
        conn["extra"] = json.dumps(extra, sort_keys=True)
        changed.append(f"protocol_version={extra['protocol_version']}")
    return changed


def convert_variables(entries: list[dict[str, Any]]) -> dict[str, str]:
    result = {}
    for entry in entries:
        name = entry.get("variable_name")
        if not name:
            raise SettingsError(f"variable without variable_name: {entry}")
        value = entry.get("variable_value")
        if value is None:
            value = ""
        elif not isinstance(value, str):
            value = json.dumps(value)
        result[name] = value
    return result


def convert_pools(entries: list[dict[str, Any]]) -> list[tuple[str, int, str]]:
    result = []
    for entry in entries:
        name = entry.get("pool_name")
        if not name or entry.get("pool_slot") is None:
            raise SettingsError(f"pool needs pool_name and pool_slot: {entry}")
        result.append((name, int(entry["pool_slot"]), entry.get("pool_description") or ""))
    return result


def airflow_executable() -> str:
    candidate = Path(sys.executable).parent / "airflow"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("airflow")
    if not found:
        raise SettingsError("no `airflow` executable next to this Python or on PATH")
    return found


def run_airflow(args: list[str]) -> None:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    result = subprocess.run([airflow_executable(), *args], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        raise SettingsError(
            f"`airflow {' '.join(args)}` failed (exit {result.returncode}):\n{output}"
        )


def redact(conns: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        k: {f: ("***" if f == "password" else v) for f, v in c.items()} for k, c in conns.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, default=DEFAULT_FILE, help="astro-style settings YAML")
    parser.add_argument("--dry-run", action="store_true", help="print what would be imported")
    parser.add_argument(
        "--no-env-overrides",
        action="store_true",
        help="do not apply CASSANDRA_* environment variables to cassandra_default",
    )
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.file)
        conns = convert_connections(settings["connections"])
        changed = [] if args.no_env_overrides else apply_cassandra_env(conns, dict(os.environ))
        variables = convert_variables(settings["variables"])
        pools = convert_pools(settings["pools"])
        if changed:
            print(f"[airflow-settings] {CASSANDRA_CONN_ID} from env: {', '.join(changed)}")
        if args.dry_run:
            plan = {"connections": redact(conns), "variables": variables, "pools": pools}
            print(json.dumps(plan, indent=2))
            return 0
        with tempfile.TemporaryDirectory(prefix="airflow-settings-") as tmp:
            if conns:
                path = Path(tmp) / "connections.json"
                path.write_text(json.dumps(conns, indent=2))
                path.chmod(0o600)
                run_airflow(["connections", "import", "--overwrite", str(path)])
            if variables:
                path = Path(tmp) / "variables.json"
                path.write_text(json.dumps(variables, indent=2))
                run_airflow(["variables", "import", "-a", "overwrite", str(path)])
        for name, slots, description in pools:
            run_airflow(["pools", "set", name, str(slots), description])
    except SettingsError as exc:
        print(f"[airflow-settings] ERROR: {exc}", file=sys.stderr)
        return 1
    print(
        f"[airflow-settings] applied {args.file.name}: connections {sorted(conns) or '-'}, "
        f"variables {sorted(variables) or '-'}, pools {[p[0] for p in pools] or '-'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

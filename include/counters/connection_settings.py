"""Connection settings: from the environment or an Airflow connection, validated once into
``ConnectionSettings``; a wrong setting is a ``ConnectionConfigError`` naming where it came from."""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class ConnectionConfigError(ValueError):
    """A connection setting is wrong (names the variable or the Airflow connection field)."""


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def _flag(value: object, where: str) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ConnectionConfigError(f"{where} must be true or false, got {value!r}")


SSL_VERSIONS: dict[str, tuple[ssl.TLSVersion | None, ssl.TLSVersion | None]] = {
    "PROTOCOL_TLS_CLIENT": (None, None),
    "PROTOCOL_TLS": (None, None),
    "PROTOCOL_SSLv23": (None, None),
    "PROTOCOL_TLSv1": (ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1),
    "PROTOCOL_TLSv1_1": (ssl.TLSVersion.TLSv1_1, ssl.TLSVersion.TLSv1_1),
    "PROTOCOL_TLSv1_2": (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_2),
}
"""``ssl_options.ssl_version`` (the ``ssl.PROTOCOL_*`` name or number, as the driver takes it)
-> the TLS versions allowed (None: the default range)."""

CERT_REQS = {
    "CERT_NONE": ssl.CERT_NONE,
    "CERT_OPTIONAL": ssl.CERT_OPTIONAL,
    "CERT_REQUIRED": ssl.CERT_REQUIRED,
}

SSL_OPTION_KEYS = (
    "ca_certs",
    "certfile",
    "keyfile",
    "cert_reqs",
    "check_hostname",
    "ssl_version",
    "ciphers",
    "server_hostname",
    "do_handshake_on_connect",
    "suppress_ragged_eofs",
)
"""The ``ssl_options`` the Airflow CassandraHook passes to the driver (which builds its SSL
context from the first seven and wraps sockets with the last three)."""


PROTOCOL_VERSIONS = {4: "v4", 5: "v5", 65: "DSE_V1", 66: "DSE_V2"}
"""The native protocol versions a connection may pin. Unset, the driver negotiates (the
highest both sides speak: v5 on Cassandra 4.0+, v4 on 3.x, DSE's own on DSE); v3 and older
lack the unset values the engine binds."""


def parse_protocol_version(value: object, where: str) -> int | None:
    """A pinned protocol version, or None (negotiate) for an empty or absent value; ``where``
    names the setting for the error."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        version = int(str(value).strip()) if not isinstance(value, bool) else -1
    except ValueError:
        version = -1
    if version == 0:
        return None  # as the provider's hook reads it: falsy, negotiate
    if version not in PROTOCOL_VERSIONS:
        known = ", ".join(f"{v} ({name})" for v, name in PROTOCOL_VERSIONS.items())
        raise ConnectionConfigError(
            f"{where} must be one of {known}, or unset to negotiate; got {value!r}"
        )
    return version


LB_CHILD_POLICIES = ("DCAwareRoundRobinPolicy", "WhiteListRoundRobinPolicy", "RoundRobinPolicy")
"""The policies the provider's CassandraHook builds by name (and ``TokenAwarePolicy`` over one
of them). The engine always routes token aware: a single-partition request goes to a replica;
which nodes it may use is the named policy's."""

LB_ARGS = {
    "DCAwareRoundRobinPolicy": ("local_dc", "used_hosts_per_remote_dc"),
    "WhiteListRoundRobinPolicy": ("hosts",),
    "RoundRobinPolicy": (),
    "TokenAwarePolicy": ("child_load_balancing_policy", "child_load_balancing_policy_args"),
}


@dataclass(frozen=True)
class Balancing:
    """Which nodes the driver may send requests to (under token awareness)."""

    policy: str = "DCAwareRoundRobinPolicy"
    local_dc: str | None = None
    used_hosts_per_remote_dc: int = 0
    hosts: tuple[str, ...] = ()


def parse_load_balancing(name: object, args: object, where: str) -> Balancing:
    """The extra's ``load_balancing_policy`` and ``load_balancing_policy_args``, read as the
    provider's CassandraHook reads them, except that what it would ignore or silently replace
    (an unknown policy or argument, an unknown child of ``TokenAwarePolicy``) is refused here.
    Without a name: DC-aware round robin (the hook's default is plain round robin; the engine's
    is DC-aware), with the args' ``local_dc`` if given."""
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ConnectionConfigError(f"{where}_args must be a mapping, got {args!r}")
    if name is None:
        local = args.get("local_dc") or (args.get("child_load_balancing_policy_args") or {}).get(
            "local_dc"
        )
        return Balancing(local_dc=local or None)
    if name not in LB_ARGS:
        raise ConnectionConfigError(f"{where} must be one of {', '.join(LB_ARGS)}, got {name!r}")
    unknown = sorted(set(args) - set(LB_ARGS[str(name)]))
    if unknown:
        allowed = ", ".join(LB_ARGS[str(name)]) or "none"
        raise ConnectionConfigError(
            f"{where}_args: unknown keys {unknown} for {name} (supported: {allowed})"
        )
    if name == "TokenAwarePolicy":
        child = args.get("child_load_balancing_policy", "RoundRobinPolicy")
        if child not in LB_CHILD_POLICIES:
            raise ConnectionConfigError(
                f"{where}_args.child_load_balancing_policy must be one of "
                f"{', '.join(LB_CHILD_POLICIES)}, got {child!r}"
            )
        return parse_load_balancing(
            child,
            args.get("child_load_balancing_policy_args") or {},
            f"{where}_args.child_load_balancing_policy",
        )
    if name == "WhiteListRoundRobinPolicy":
        hosts = args.get("hosts")
        if isinstance(hosts, str):
            hosts = [h.strip() for h in hosts.split(",") if h.strip()]
        if not hosts or not isinstance(hosts, list | tuple):
            raise ConnectionConfigError(
                f"{where}_args.hosts: WhiteListRoundRobinPolicy needs a list of hosts, got "
                f"{args.get('hosts')!r}"
            )
        return Balancing(policy=str(name), hosts=tuple(str(h) for h in hosts))
    if name == "DCAwareRoundRobinPolicy":
        remote = args.get("used_hosts_per_remote_dc", 0)
        try:
            remote_hosts = int(remote)
        except (TypeError, ValueError):
            remote_hosts = -1
        if remote_hosts < 0:
            raise ConnectionConfigError(
                f"{where}_args.used_hosts_per_remote_dc must be a whole number >= 0, got {remote!r}"
            )
        return Balancing(
            policy=str(name),
            local_dc=args.get("local_dc") or None,
            used_hosts_per_remote_dc=remote_hosts,
        )
    return Balancing(policy=str(name))


CQL_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")


def parse_cql_version(value: object, where: str) -> str | None:
    """The extra's ``cql_version`` (sent in the connection's STARTUP; the node refuses one it
    does not speak), or None."""
    if value is None or value == "":
        return None
    if not CQL_VERSION.match(str(value).strip()):
        raise ConnectionConfigError(f"{where} must look like 3.4.7, got {value!r}")
    return str(value).strip()


def _ssl_version(value: object, where: str) -> str:
    by_number = {int(getattr(ssl, name)): name for name in SSL_VERSIONS if hasattr(ssl, name)}
    name = by_number.get(value) if isinstance(value, int) else str(value).strip()
    if name not in SSL_VERSIONS:
        raise ConnectionConfigError(
            f"{where} must be one of {', '.join(SSL_VERSIONS)} (or its number), got {value!r}"
        )
    return name


def _cert_reqs(value: object, where: str) -> str:
    by_number = {int(v): k for k, v in CERT_REQS.items()}
    name = by_number.get(value) if isinstance(value, int) else str(value).strip().upper()
    if name not in CERT_REQS:
        raise ConnectionConfigError(
            f"{where} must be CERT_REQUIRED, CERT_OPTIONAL or CERT_NONE (or 2, 1, 0), got {value!r}"
        )
    return name


@dataclass(frozen=True)
class ConnectionSettings:
    """Where and how to connect. ``password`` never shows in a repr (nor in logs that print
    the settings); TLS checks the nodes' certificates against ``tls_ca_file`` (the system's
    trusted CAs without one) and, by default, that a certificate names the address dialled.
    With ``tls_cert_file`` (and its ``tls_key_file``) the client shows its own certificate:
    mutual TLS, for nodes that require client authentication."""

    hosts: tuple[str, ...] = ("127.0.0.1",)
    port: int = 9042
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    local_dc: str | None = None
    protocol_version: int | None = None
    """None: negotiated with the nodes (the driver never lowers a pinned version)."""
    cql_version: str | None = None
    balancing: str = "DCAwareRoundRobinPolicy"
    """Which nodes requests may go to: ``DCAwareRoundRobinPolicy`` (``local_dc``,
    ``used_hosts_per_remote_dc``), ``WhiteListRoundRobinPolicy`` (``allowed_hosts``) or
    ``RoundRobinPolicy``; always token aware."""
    used_hosts_per_remote_dc: int = 0
    allowed_hosts: tuple[str, ...] = ()
    request_timeout: float = 30.0
    tls: bool = False
    tls_ca_file: str | None = None
    tls_check_hostname: bool = True
    tls_cert_file: str | None = None
    """The client's certificate chain (PEM; with its key unless ``tls_key_file`` holds it)."""
    tls_key_file: str | None = None
    tls_cert_reqs: str = "CERT_REQUIRED"
    """Whether the nodes' certificates are checked: ``CERT_REQUIRED`` (default),
    ``CERT_OPTIONAL`` or ``CERT_NONE`` (nothing checked: not for production)."""
    tls_version: str = "PROTOCOL_TLS_CLIENT"
    tls_ciphers: str | None = None
    tls_server_hostname: str | None = None
    """The name the nodes' certificates must carry, when it is not the address dialled."""
    tls_wrap_options: tuple[tuple[str, bool], ...] = ()
    """``do_handshake_on_connect`` / ``suppress_ragged_eofs`` passed through to the driver."""
    schema_metadata: bool = False
    """Whether the driver keeps the full schema model (every keyspace and table, read on
    connect and on every schema event). Off: a short-lived task process reads only what the
    code asks for (its family's keyspace and tables, ``schema.keyspace_metadata``), which is
    also what token-aware routing and the replication checks need."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ConnectionSettings:
        """``CASSANDRA_HOSTS`` (comma separated), ``CASSANDRA_PORT``, ``CASSANDRA_USERNAME``,
        ``CASSANDRA_PASSWORD``, ``CASSANDRA_LOCAL_DC``, ``CASSANDRA_PROTOCOL_VERSION`` (unset:
        negotiated); TLS with
        ``CASSANDRA_TLS=true`` or a ``CASSANDRA_TLS_CA_FILE`` (PEM), host names checked unless
        ``CASSANDRA_TLS_CHECK_HOSTNAME=false``; a client certificate (mutual TLS) with
        ``CASSANDRA_TLS_CERT_FILE`` and ``CASSANDRA_TLS_KEY_FILE``;
        ``CASSANDRA_SCHEMA_METADATA=true`` for the driver's full schema model."""
        env = os.environ if env is None else env
        hosts = tuple(h.strip() for h in env.get("CASSANDRA_HOSTS", "127.0.0.1").split(",") if h)
        try:
            port = int(env.get("CASSANDRA_PORT", "9042"))
        except ValueError as exc:
            raise ConnectionConfigError(f"CASSANDRA_PORT must be an integer: {exc}") from None
        protocol = parse_protocol_version(
            env.get("CASSANDRA_PROTOCOL_VERSION"), "CASSANDRA_PROTOCOL_VERSION"
        )
        ca_file = env.get("CASSANDRA_TLS_CA_FILE") or None
        cert_file = env.get("CASSANDRA_TLS_CERT_FILE") or None
        settings = cls(
            hosts=hosts or ("127.0.0.1",),
            port=port,
            username=env.get("CASSANDRA_USERNAME") or None,
            password=env.get("CASSANDRA_PASSWORD") or None,
            local_dc=env.get("CASSANDRA_LOCAL_DC") or None,
            protocol_version=protocol,
            tls=bool(ca_file or cert_file)
            or _flag(env.get("CASSANDRA_TLS") or "false", "CASSANDRA_TLS"),
            tls_ca_file=ca_file,
            tls_check_hostname=_flag(
                env.get("CASSANDRA_TLS_CHECK_HOSTNAME") or "true", "CASSANDRA_TLS_CHECK_HOSTNAME"
            ),
            tls_cert_file=cert_file,
            tls_key_file=env.get("CASSANDRA_TLS_KEY_FILE") or None,
            schema_metadata=_flag(
                env.get("CASSANDRA_SCHEMA_METADATA") or "false", "CASSANDRA_SCHEMA_METADATA"
            ),
        )
        settings.check_tls_files(
            {
                "ca": "CASSANDRA_TLS_CA_FILE",
                "cert": "CASSANDRA_TLS_CERT_FILE",
                "key": "CASSANDRA_TLS_KEY_FILE",
            }
        )
        return settings

    @classmethod
    def from_airflow_connection(cls, conn: Any) -> ConnectionSettings:
        """Build settings from an Airflow ``Connection`` (type cassandra). TLS from the extra's
        ``ssl_options``, the keys the provider's CassandraHook passes to the driver: ``ca_certs``
        (PEM), ``certfile`` and ``keyfile`` (the client's certificate: mutual TLS),
        ``cert_reqs``, ``check_hostname``, ``ssl_version``, ``ciphers``, ``server_hostname``,
        ``do_handshake_on_connect``, ``suppress_ragged_eofs``. One difference: host names are
        checked unless ``check_hostname`` is false (the driver leaves them unchecked).
        ``load_balancing_policy`` (+ ``_args``), ``cql_version`` and ``protocol_version`` as
        the hook reads them (``parse_load_balancing``); unset, the protocol is negotiated.
        ``schema_metadata`` (this project's key; default false): the driver's full schema
        model."""
        extra = conn.extra_dejson or {}
        here = f"Airflow connection {conn.conn_id!r}: extra"
        balancing = parse_load_balancing(
            extra.get("load_balancing_policy"),
            extra.get("load_balancing_policy_args"),
            f"{here}.load_balancing_policy",
        )
        hosts = tuple(h.strip() for h in (conn.host or "127.0.0.1").split(",") if h.strip())
        where = f"Airflow connection {conn.conn_id!r}: extra.ssl_options"
        ssl_options = extra.get("ssl_options")
        if ssl_options is not None and not isinstance(ssl_options, dict):
            raise ConnectionConfigError(f"{where} must be a mapping, got {ssl_options!r}")
        ssl_options = ssl_options or {}
        unknown = set(ssl_options) - set(SSL_OPTION_KEYS)
        if unknown:
            raise ConnectionConfigError(
                f"{where}: unknown keys {sorted(unknown)} (supported: {', '.join(SSL_OPTION_KEYS)})"
            )
        cert_reqs = _cert_reqs(ssl_options.get("cert_reqs", "CERT_REQUIRED"), f"{where}.cert_reqs")
        check_hostname = _flag(ssl_options.get("check_hostname", True), f"{where}.check_hostname")
        if cert_reqs == "CERT_NONE" and "check_hostname" in ssl_options and check_hostname:
            raise ConnectionConfigError(
                f"{where}: check_hostname true needs the certificates checked; cert_reqs is "
                "CERT_NONE"
            )
        settings = cls(
            hosts=hosts,
            port=int(conn.port or 9042),
            username=conn.login or None,
            password=conn.password or None,
            local_dc=balancing.local_dc,
            protocol_version=parse_protocol_version(
                extra.get("protocol_version"), f"{here}.protocol_version"
            ),
            cql_version=parse_cql_version(extra.get("cql_version"), f"{here}.cql_version"),
            balancing=balancing.policy,
            used_hosts_per_remote_dc=balancing.used_hosts_per_remote_dc,
            allowed_hosts=balancing.hosts,
            tls="ssl_options" in extra,
            tls_ca_file=ssl_options.get("ca_certs") or None,
            tls_check_hostname=check_hostname and cert_reqs != "CERT_NONE",
            tls_cert_file=ssl_options.get("certfile") or None,
            tls_key_file=ssl_options.get("keyfile") or None,
            tls_cert_reqs=cert_reqs,
            tls_version=_ssl_version(
                ssl_options.get("ssl_version", "PROTOCOL_TLS_CLIENT"), f"{where}.ssl_version"
            ),
            tls_ciphers=ssl_options.get("ciphers") or None,
            tls_server_hostname=ssl_options.get("server_hostname") or None,
            tls_wrap_options=tuple(
                (key, _flag(ssl_options[key], f"{where}.{key}"))
                for key in ("do_handshake_on_connect", "suppress_ragged_eofs")
                if key in ssl_options
            ),
            schema_metadata=_flag(extra.get("schema_metadata", False), f"{here}.schema_metadata"),
        )
        settings.check_tls_files(
            {"ca": f"{where}.ca_certs", "cert": f"{where}.certfile", "key": f"{where}.keyfile"}
        )
        return settings

    def check_tls_files(self, where: dict[str, str]) -> None:
        """Every TLS file named exists, and a key comes with its certificate; ``where`` names
        the setting of each (``ca``, ``cert``, ``key``) for the message."""
        files = {"ca": self.tls_ca_file, "cert": self.tls_cert_file, "key": self.tls_key_file}
        for what, path in files.items():
            if path and not os.path.isfile(path):
                raise ConnectionConfigError(f"{where[what]}: no such file {path!r}")
        if self.tls_key_file and not self.tls_cert_file:
            raise ConnectionConfigError(
                f"{where['key']} is set without {where['cert']}: the key belongs to a client "
                "certificate"
            )

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client side of TLS: the nodes' certificates must chain to the CA (and name the
        host dialled, unless the check is off); the client's own certificate when given."""
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=self.tls_ca_file)
        if self.tls_cert_reqs == "CERT_NONE":
            context.check_hostname = False
        else:
            context.check_hostname = self.tls_check_hostname
        context.verify_mode = CERT_REQS[self.tls_cert_reqs]
        low, high = SSL_VERSIONS[self.tls_version]
        if low is not None:
            context.minimum_version = low
        if high is not None:
            context.maximum_version = high
        if self.tls_ciphers:
            try:
                context.set_ciphers(self.tls_ciphers)
            except ssl.SSLError as exc:
                raise ConnectionConfigError(f"TLS ciphers {self.tls_ciphers!r}: {exc}") from None
        if self.tls_cert_file:
            try:
                context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
            except (ssl.SSLError, OSError) as exc:
                raise ConnectionConfigError(
                    f"TLS client certificate {self.tls_cert_file!r} (key "
                    f"{self.tls_key_file or 'in the same file'}): {exc}"
                ) from None
        return context

    def ssl_socket_options(self) -> dict[str, Any]:
        """What the driver passes to ``SSLContext.wrap_socket`` besides the context."""
        options: dict[str, Any] = dict(self.tls_wrap_options)
        if self.tls and self.tls_server_hostname:
            options["server_hostname"] = self.tls_server_hostname
        return options

    def describe(self) -> str:
        """Where the connection goes, for messages (no password)."""
        who = f"{self.username}@" if self.username else ""
        tls = (" (mutual TLS)" if self.tls_cert_file else " (TLS)") if self.tls else ""
        return f"{who}{','.join(self.hosts)}:{self.port}{tls}"

"""``counterctl families`` and ``init``: what is declared, and its tables."""

from __future__ import annotations

import click

from .. import engine
from ..audit import config_fingerprint
from ..config import Family
from ..schema import (
    AUDIT_TABLE,
    COMPACTOR_ROLE,
    LEGACY_AUDIT_TABLE,
    compactor_grants,
    ensure_schema,
)
from ..store import Store
from ..store.auditlog import AuditUpgradeError
from .common import (
    Context,
    Failure,
    audited_store,
    echo_json,
    pass_context,
    replication_for,
    reported,
)


@click.command("families")
@click.option(
    "--hashes",
    is_flag=True,
    help="Also print each family's configuration hash (the audit rows' config_hash).",
)
@click.option("--json", "as_json", is_flag=True, help="Print every family's fields as JSON.")
@pass_context
def families_command(obj: Context, hashes: bool, as_json: bool) -> None:
    """List the families of the config file."""
    if as_json:
        echo_json(
            [
                {**f.model_dump(mode="json"), "config_hash": config_fingerprint(f)}
                for f in obj.catalog.families
            ]
        )
        return
    for family in obj.catalog.families:
        line = (
            f"{family.name}\t{family.kind.value}\t{family.keyspace}.{family.raw_table} -> "
            f"{family.keyspace}.{family.compact_table}\tlag={family.lag}\tschedule='{family.schedule}'"
        )
        click.echo(f"{line}\t{config_fingerprint(family)}" if hashes else line)


@click.command("init")
@click.option("--family", "names", multiple=True, help="Only these families (default: all).")
@click.option(
    "--replication",
    envvar="COUNTERS_REPLICATION",
    help="Replication map for keyspaces that do not exist yet, e.g. \"{'class': "
    "'NetworkTopologyStrategy', 'datacenter1': 3}\". Required unless every contact point is "
    "local (localhost/127.0.0.1: then SimpleStrategy with replication factor 1). Also "
    "$COUNTERS_REPLICATION.",
)
@click.option(
    "--with-demo-tables",
    is_flag=True,
    help="Also create the demo business tables (rows families' raw tables) if missing.",
)
@click.option(
    "--print-grants",
    is_flag=True,
    help="Only print the CQL GRANTs of the least-privilege compaction role (no connection).",
)
@click.option(
    "--role",
    default=COMPACTOR_ROLE,
    show_default=True,
    help="The role --print-grants grants to.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print what was done (or the grants) as JSON."
)
@pass_context
def init_command(
    obj: Context,
    names: tuple[str, ...],
    replication: str | None,
    with_demo_tables: bool,
    print_grants: bool,
    role: str,
    as_json: bool,
) -> None:
    """Create keyspaces and tables (IF NOT EXISTS); check existing tables against the YAML.

    \b
    A rows family's raw table is business data: init checks it but does not create it
    (except the demo's, with --with-demo-tables). Run init as a role that may create
    tables; run compactions as a role with only the grants of --print-grants: SELECT and
    MODIFY on each family's own tables (SELECT only on kept raw rows), nothing else.
    """
    families = [obj.family(n) for n in names] if names else list(obj.catalog.families)
    if print_grants:
        if as_json:
            echo_json({"role": role, "statements": compactor_grants(families, role)})
        else:
            _print_grants(families, role)
        return
    replication = replication_for(replication, obj.settings.hosts)
    if with_demo_tables:
        from ..demo import create_demo_tables

        with reported():
            create_demo_tables(obj.conn.session, families, replication)
    done = []
    for family in families:
        with reported():
            layout = ensure_schema(obj.conn.session, family, replication)
            store = Store(obj.conn, family, layout)
            engine.recover_reset_points(store)  # from the audit rows the upgrade then moves
            try:
                moved = store.audit.upgrade()
            except AuditUpgradeError as exc:
                raise Failure(str(exc), 1) from exc
        if as_json:
            done.append(
                {
                    "family": family.name,
                    "keyspace": family.keyspace,
                    "raw_table": family.raw_table,
                    "compact_table": family.compact_table,
                    "key": [c.name for c in layout.key],
                    "clustering": [c.name for c in layout.clustering],
                    "audit_rows_moved": moved,
                }
            )
            continue
        click.echo(
            f"{family.name}: ready ({family.keyspace}.{family.raw_table}: key "
            f"{[c.name for c in layout.key]}, clustering {[c.name for c in layout.clustering]})"
        )
        if moved:
            click.echo(
                f"{family.name}: {moved} audit row(s) moved from {family.keyspace}."
                f"{LEGACY_AUDIT_TABLE} into month partitions ({family.keyspace}.{AUDIT_TABLE})"
            )
    if as_json:
        echo_json(done)


def _print_grants(families: list[Family], role: str) -> None:
    names = ", ".join(f.name for f in families)
    click.echo(
        f"-- Least-privilege grants for the compaction role {role!r} (families: {names}).\n"
        "-- Create the role first, as a superuser, with a password from your secrets store:\n"
        f"--   CREATE ROLE IF NOT EXISTS {role} WITH LOGIN = true AND PASSWORD = '<secret>';"
    )
    for statement in compactor_grants(families, role):
        click.echo(f"{statement};")


@click.command("retire")
@click.option("--family", "name", required=True)
@click.option("--undo", is_flag=True, help="Watch the family again (its retirement is undone).")
@click.option("--json", "as_json", is_flag=True, help="Print what was recorded as JSON.")
@pass_context
def retire_command(obj: Context, name: str, undo: bool, as_json: bool) -> None:
    """Retire a family removed on purpose, so that nothing alerts on it once it is gone.

    \b
    The freshness check (and `health`) watch every family the cluster knows in the YAML's
    keyspaces: one missing from the YAML, or whose entry does not load, has no DAG and
    alerts until its entry loads again. To remove a family for good: retire it while its
    entry is in the YAML (recorded in its state row and audited, with its configuration
    hash), then remove the entry; the checks then list it as retired. Its tables, archive
    and audit trail are kept: drop them yourself once nothing needs them. An entry that is
    there but does not load still alerts, retired or not. --undo watches it again.
    """
    from ..audit import Action, machine, operator_record
    from ..compaction.common import new_run_id

    family = obj.family(name)
    store = audited_store(obj.conn, family, undo=undo)
    user, host = machine()
    who = None if undo else f"{user}@{host}"
    with reported():
        store.state.retire(who)
        row = store.audit.write(
            operator_record(
                family,
                action=Action.RETIRE,
                outcome="unretired" if undo else "retired",
                run_id=new_run_id("retire"),
                message=(
                    f"family {family.name!r} is watched again by the freshness check"
                    if undo
                    else f"family {family.name!r} retired by {who}: once its entry is removed "
                    "from the families YAML, the freshness check lists it as retired and does "
                    "not alert"
                ),
                parameters={"undo": undo},
            )
        )
    if as_json:
        echo_json(
            {"family": family.name, "retired": not undo, "by": who, "audit_run_id": row["run_id"]}
        )
        return
    click.echo(f"{family.name}: {'watched again' if undo else 'retired'}")

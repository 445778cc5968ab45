"""``fleetstore rekey`` (the work is in fleetstore.admin.rekey)."""

from __future__ import annotations

import sys

import click

from fleetstore import errors
from fleetstore.cli.util import (
    emit_json,
    env,
    existing_store,
    json_option,
    settings_keyring,
    store_params,
)


@click.command(
    name="rekey",
    epilog="""\b
Exit codes:
  0  every file of the store is under the keyring's current key (or plain: --decrypt)
  1  the store is in use by another process (stop the fleet, run it again), or failed:
     each database file is whole under its old key or its new one; run it again
  2  bad usage: no keyring given, no store at --store, a PostgreSQL store""",
)
@click.option(
    "--new-key",
    metavar="ID",
    default=None,
    **env("rekey", "new-key"),
    help="First add a new random key of this id at the top of the keyring file (it "
    "becomes the current key; the old keys stay, to read what they encrypted).",
)
@click.option(
    "--decrypt",
    is_flag=True,
    default=False,
    **env("rekey", "decrypt"),
    help="Write the store unencrypted (then open it without a key).",
)
@json_option(
    "rekey",
    what="each database file and what was done, the sealed files "
    "re-sealed, and what each key id still encrypts",
)
@store_params()
def rekey_command(new_key: str | None, decrypt: bool, as_json: bool, store: str | None) -> None:
    """Put an encrypted SQLite store under its keyring's current key, or encrypt a
    store that is not (the keyring: fleetstore --key-file FILE, or
    FLEETSTORE_ENCRYPTION_KEY_FILE).

    To rotate a key: add a new line at the top of the keyring (or give --new-key ID),
    then run rekey with the fleet stopped. Each database file is written anew under the
    current key (VACUUM INTO a copy beside it, checked, fsynced, renamed over it: SQLite
    cannot change the key of a WAL database in place while it is open) with the store
    held to itself (its writer gate taken; refused while another process has it open);
    then blob files, spool journals and rejected.jsonl are sealed anew. Killed at any
    point, every file opens with the old key or the new one; run it again to finish.
    Keep the old key in the keyring until rekey reports nothing left under it (and as
    long as backups or exports made under it are kept). It needs free space for one
    copy of the largest database file.
    """
    from fleetstore.admin.rekey import StoreInUse, rekey

    path = existing_store("rekey", store, server=False, plain_ok=True)
    keyring = settings_keyring()
    if keyring is None:
        raise click.UsageError(
            "rekey needs the keyring: fleetstore --key-file FILE rekey, or "
            "FLEETSTORE_ENCRYPTION_KEY_FILE (docs/secrets.md: how to make one)"
        )
    try:
        report = rekey(path, keyring, decrypt=decrypt, new_key=new_key)
    except errors.ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    except (StoreInUse, errors.FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore rekey: {exc}", err=True)
        sys.exit(1)
    if as_json:
        emit_json(report.to_json())
        return
    for name, done in report.databases.items():
        click.echo(f"{done:9}  {name}")
    resealed = ", ".join(f"{n} {what}" for what, n in sorted(report.resealed.items()))
    click.echo(f"re-sealed: {resealed or 'nothing'}")
    target = report.key or "plain"
    left = {k: n for k, n in report.still_under.items() if k != target}
    click.echo(
        f"everything is under {target}"
        if not left
        else "still under other keys: " + ", ".join(f"{k}: {n}" for k, n in sorted(left.items()))
    )
    if not left and report.key is not None:
        click.echo(
            "keys other than the current one may be removed from the keyring, unless backups "
            "or exports made under them are kept"
        )


__all__ = ["rekey_command"]

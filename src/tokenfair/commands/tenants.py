"""`tokenfair tenants`: make API key hashes and check tenants files."""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tokenfair.commands.common import require_extra

tenants_app = typer.Typer(
    help="API keys and tenants files for `tokenfair serve`.", no_args_is_help=True
)
console = Console(stderr=True)


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}")
    return typer.Exit(code=2)


@tenants_app.command("hash-key")
def hash_key_command(
    key: Annotated[
        str | None,
        typer.Argument(help="The key to hash; '-' reads it from stdin; omitted: make a new one."),
    ] = None,
) -> None:
    """Print the sha256 hash of an API key, for key_sha256 / admin_key_sha256.

    Without KEY a new random key is made and printed with its hash: give the key to the
    tenant, put the hash in the tenants file.

    Example: tokenfair tenants hash-key   or   echo -n "$KEY" | tokenfair tenants hash-key -
    """
    require_extra("tokenfair tenants hash-key", "server")
    from tokenfair.edge.tenants import hash_key

    made = key is None
    if key is None:
        key = "tf-" + secrets.token_urlsafe(32)
    elif key == "-":
        key = sys.stdin.read().strip()
    if not key:
        raise _fail("the key is empty")
    digest = hash_key(key)
    if made:
        print(json.dumps({"key": key, "key_sha256": digest}))
    else:
        print(digest)


@tenants_app.command("check")
def check_command(path: Annotated[Path, typer.Argument(help="The tenants file (YAML).")]) -> None:
    """Validate a tenants file and print a summary (tenants, admin API, trusted header,
    trusted proxies).

    Example: tokenfair tenants check tenants.yaml
    """
    require_extra("tokenfair tenants check", "server")
    from tokenfair.edge.tenants import TenantsFileError, load_tenants

    try:
        loaded = load_tenants(path)
    except TenantsFileError as error:
        raise _fail(str(error)) from None
    print(
        json.dumps(
            {
                "tenants": [t.name for t in loaded.tenants],
                "admin_api": loaded.admin_key_sha256 is not None,
                "trusted_tenant_header": loaded.trusted_tenant_header,
                "share_prefix_cache": loaded.share_prefix_cache,
                "acts_for_tenants": [t.name for t in loaded.tenants if t.acts_for_tenants],
            }
        )
    )

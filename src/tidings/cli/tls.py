"""``tidings tls``: a private CA and the certificates it signs, for trying and running a
deployment over TLS without a PKI of one's own (:mod:`tidings.config.certificates`).

``init`` makes a whole set in one go (the CA, a server certificate, client certificates);
``new-ca`` and ``new-cert`` make one at a time, so a certificate can be added or renewed
later with the same CA. Nothing is replaced without ``--force``, and every file a command
would write is checked before the first is written: a refused command leaves nothing behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tidings.cli.common import app, console

if TYPE_CHECKING:
    from tidings.config.certificates import Issued

tls_app = typer.Typer(
    no_args_is_help=True,
    help="TLS: make a private CA and the certificates it signs (servers' and clients').",
)
app.add_typer(tls_app, name="tls")

DirArgument = Annotated[
    Path,
    typer.Argument(
        help="The directory of the CA (ca.pem, ca.key) and its certificates; made if missing."
    ),
]
DaysOption = Annotated[
    float, typer.Option("--days", help="How many days the certificates are valid.")
]
ForceOption = Annotated[
    bool,
    typer.Option(
        "--force", help="Replace files that are there (a replaced CA invalidates what it signed)."
    ),
]
HostsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--host",
        help="A host name or IP address clients reach the server by (repeat for several); "
        "makes a server certificate.",
    ),
]


def _said(issued: Issued, what: str) -> None:
    console.print(
        f"{what}: {issued.cert} (certificate), {issued.key} (key, 0600), {issued.pem} (both, "
        "0600: hat-event's pem_file)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


@tls_app.command("new-ca")
def new_ca(
    directory: DirArgument,
    name: Annotated[
        str, typer.Option("--name", help="The CA's name (its certificate's common name).")
    ] = "tidings CA",
    days: DaysOption = 3650,
    force: ForceOption = False,
) -> None:
    """Make a CA: DIR/ca.pem (give it to every side that verifies) and DIR/ca.key (0600;
    keep it where certificates are made, not on the servers)."""
    from tidings.config.certificates import make_ca, write_ca

    cert, key = write_ca(directory, make_ca(name, days=days), force=force)
    console.print(
        f"CA: {cert} (certificate), {key} (key, 0600)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


@tls_app.command("new-cert")
def new_cert(
    directory: DirArgument,
    name: Annotated[
        str,
        typer.Argument(
            help="The certificate's common name (a client's identity at the servers) and its "
            "files' name: DIR/NAME.crt, NAME.key, NAME.pem."
        ),
    ],
    hosts: HostsOption = None,
    client: Annotated[
        bool,
        typer.Option(
            "--client", help="A client certificate (mutual TLS); with --host, for both sides."
        ),
    ] = False,
    days: DaysOption = 365,
    force: ForceOption = False,
) -> None:
    """Make a certificate signed by the CA of DIR (tidings tls new-ca DIR makes one): for a
    server with --host, for a client with --client."""
    from tidings.config.certificates import load_ca, make_certificate, write_issued

    pair = make_certificate(load_ca(directory), name, hosts=hosts or [], client=client, days=days)
    kind = "server and client" if hosts and client else "server" if hosts else "client"
    _said(write_issued(directory, name, pair, force=force), f"{kind} certificate {name!r}")


@tls_app.command("init")
def init(
    directory: DirArgument,
    hosts: HostsOption = None,
    clients: Annotated[
        list[str] | None,
        typer.Option(
            "--client",
            help="A client certificate to make, by its identity (repeat for several).",
        ),
    ] = None,
    server: Annotated[
        str, typer.Option("--server", help="The server certificate's name (and files' name).")
    ] = "server",
    days: DaysOption = 365,
    force: ForceOption = False,
) -> None:
    """Make a CA, a server certificate for every --host, and a client certificate for every
    --client: what a deployment on these hosts needs to run every edge over mutual TLS."""
    from tidings.config.certificates import (
        CA_CERT,
        CA_KEY,
        make_ca,
        make_certificate,
        refuse_existing,
        write_ca,
        write_issued,
    )
    from tidings.errors import UsageError

    if not hosts:
        raise UsageError("--host: give the hosts clients reach the servers by (at least one)")
    names = [server, *(clients or [])]
    if len(set(names)) != len(names):
        raise UsageError(f"--server and --client: two certificates named alike in {names}")
    stems = [directory / f"{n}.{suffix}" for n in names for suffix in ("crt", "key", "pem")]
    refuse_existing([directory / CA_CERT, directory / CA_KEY, *stems], force)
    # every certificate is made before the first file is written: a bad name or host
    # refuses the command with nothing written
    ca = make_ca("tidings CA", days=max(days, 3650))
    pairs = {server: make_certificate(ca, server, hosts=hosts, client=True, days=days)}
    for name in clients or []:
        pairs[name] = make_certificate(ca, name, client=True, days=days)
    cert, key = write_ca(directory, ca, force=force)
    console.print(
        f"CA: {cert} (certificate), {key} (key, 0600)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    for name, pair in pairs.items():
        kind = "server (and peer) certificate" if name == server else "client certificate"
        _said(write_issued(directory, name, pair, force=force), f"{kind} {name!r}")


__all__ = ["init", "new_ca", "new_cert", "tls_app"]

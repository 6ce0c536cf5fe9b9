"""Who opened a connection that transparent capture redirected to the proxy (Linux).

In transparent mode on a workstation (``scripts/transparent``), the client is a process
on this machine: no proxy credentials name its user, but the kernel knows who owns the
client's socket. ``/proc/net/tcp`` and ``/proc/net/tcp6`` list every TCP socket of the
proxy's network namespace with its local address and owner's uid; the client's socket is
the one from the connection's peer address to the address the kernel redirected. Its user's name becomes
the exchange's ``user_id`` when the request's own metadata names none.
"""

from __future__ import annotations

import ipaddress
import pwd
import sys
from pathlib import Path

TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
ESTABLISHED = "01"


def local_user(peer: tuple[str, int] | None, destination: tuple[str, int] | None) -> str | None:
    """The name of the local user whose socket connects ``peer`` to ``destination`` (the
    address the kernel redirected), or ``None`` when no socket of this machine (and
    network namespace) is that connection."""
    if peer is None or destination is None or not sys.platform.startswith("linux"):
        return None
    uid = socket_owner(peer, destination)
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without a name (a container's, a deleted user's)
        return str(uid)


def socket_owner(local: tuple[str, int], remote: tuple[str, int], tables: tuple[Path, ...] = TABLES) -> int | None:
    """The uid owning the established TCP socket from ``local`` to ``remote``."""
    wanted = {pair for pair in zip(_proc_addresses(*local[:2]), _proc_addresses(*remote[:2]))}
    if not wanted:
        return None
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 7 and (fields[1], fields[2]) in wanted and fields[3] == ESTABLISHED:
                return int(fields[7])
    return None


def _proc_addresses(host: str, port: int) -> list[str]:
    """How ``host:port`` may appear in ``/proc/net/tcp*``: an IPv4 address also as IPv6
    sockets carry it (mapped), in the same order for both ends of a connection."""
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return []
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if isinstance(address, ipaddress.IPv4Address):
        return [_proc_address(address, port), _proc_address(ipaddress.IPv6Address(f"::ffff:{address}"), port)]
    return [_proc_address(address, port)]


def _proc_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    """``address:port`` as ``/proc/net/tcp*`` writes it: the address as 32-bit words in
    the host's byte order, in hexadecimal, and the port in hexadecimal."""
    packed = address.packed
    words = b"".join(
        int.from_bytes(packed[i : i + 4], "big").to_bytes(4, sys.byteorder) for i in range(0, len(packed), 4)
    )
    return f"{words.hex().upper()}:{port:04X}"


def is_transparent(mode: object) -> bool:
    """Whether a connection came in by transparent mode (the kernel redirected it here)."""
    return getattr(mode, "type_name", None) == "transparent"

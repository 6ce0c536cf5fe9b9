"""Who opened a redirected connection: the owner of the client's socket, read from /proc/net/tcp*.

Real sockets of this process (a connection to a listener of its own): the owner found
must be this process's user, by the exact pair of addresses, for IPv4, IPv6 and IPv4
carried by an IPv6 socket.
"""

from __future__ import annotations

import os
import pwd
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from addon.local_user import local_user, socket_owner

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/net/tcp is Linux's")


@contextmanager
def connection(family: int, listen_host: str, connect_host: str) -> Iterator[tuple[tuple, tuple]]:
    """(the client's local address, the address it connected to), as the proxy sees them
    (the peer address of the accepted socket) and as the client dialled them."""
    with socket.socket(family) as server:
        server.bind((listen_host, 0))
        server.listen()
        target = (connect_host, server.getsockname()[1])
        with socket.create_connection(target) as _client:
            accepted, peer = server.accept()
            with accepted:
                yield peer[:2], target


@pytest.mark.parametrize(
    ("family", "listen_host", "connect_host"),
    [
        (socket.AF_INET, "127.0.0.1", "127.0.0.1"),
        (socket.AF_INET6, "::1", "::1"),
        (socket.AF_INET6, "::", "127.0.0.1"),  # a dual-stack listener: the peer is ::ffff:127.0.0.1
    ],
)
def test_the_owner_of_the_client_socket_is_found_by_both_addresses(family, listen_host, connect_host):
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6")
    with connection(family, listen_host, connect_host) as (peer, target):
        assert socket_owner(peer, target) == os.getuid()
        assert local_user(peer, target) == pwd.getpwuid(os.getuid()).pw_name
        assert socket_owner(peer, (connect_host, 1)) is None  # another destination: not this socket


def test_no_socket_no_user():
    assert local_user(None, ("127.0.0.1", 443)) is None
    assert local_user(("127.0.0.1", 1), ("127.0.0.1", 2)) is None
    assert socket_owner(("not-an-address", 1), ("127.0.0.1", 2)) is None

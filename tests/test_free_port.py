"""``free_port``: the ports the CLI and the tests hand to servers that bind them only later."""

from __future__ import annotations

import socket

from ascend_kernel.cli.serving import _ephemeral_range_start, free_port


def test_ports_are_below_the_ephemeral_range_and_bindable():
    """A port from the ephemeral range could be handed to another socket before the server binds it."""
    low = _ephemeral_range_start()
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= port < low for port in ports), ports
    assert len(ports) > 1  # random picks: two callers at once rarely agree
    for port in list(ports)[:3]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


"""Gloo across machines: each Ray Train worker binds gloo to the interface of its node's address.

Gloo binds to the address this machine's hostname resolves to and tells the other ranks to
connect there. Many machines resolve their hostname to a loopback address (127.0.1.1 on Debian
and Ubuntu, 127.0.0.1 in many VMs and containers): one machine trains, but across machines each
rank dials the other's loopback and the process group fails ("Gloo connectFullMesh failed ...
remote=[127.0.0.1]"). The address Ray knows a node by (`ray start --node-ip-address`, or Ray's
own guess) is the one the nodes reach each other at, so before Ray Train creates the process group
every worker sets GLOO_SOCKET_IFNAME to the interface holding that address. A GLOO_SOCKET_IFNAME
already set (e.g. in `ray start`'s environment, which the workers inherit) is kept.

Imported only with Ray (pipeline/train/launch.py). tests/test_multinode.py trains across network
namespaces whose hostname resolves to 127.0.0.1, which fails without this.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct

import ray
from ray.train.torch import TorchConfig
from ray.train.torch.config import _TorchBackend

SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def interface_with(ip: str) -> str | None:
    """The network interface whose IPv4 address is `ip`, or None (Linux)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                info = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()))
            except OSError:  # no IPv4 address
                continue
            if socket.inet_ntoa(info[20:24]) == ip:
                return name
    return None


def bind_gloo_to_node_address() -> None:
    """On a worker: GLOO_SOCKET_IFNAME = the interface of this node's Ray address, unless set
    (or no interface holds that address: then gloo's own choice stands)."""
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        name = interface_with(ray.util.get_node_ip_address())
        if name is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = name


class _GlooBackend(_TorchBackend):
    """Ray Train's torch backend (a private class of the pinned Ray), which makes the process
    group in on_start: the workers are bound first."""

    def on_start(self, worker_group, backend_config):
        worker_group.execute(bind_gloo_to_node_address)
        super().on_start(worker_group, backend_config)


class GlooConfig(TorchConfig):
    """Ray Train's TorchConfig (use backend="gloo"), with each worker bound to its node's
    address before the process group is made."""

    @property
    def backend_cls(self):
        return _GlooBackend

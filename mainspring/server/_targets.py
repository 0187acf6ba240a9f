"""Where webhooks may be delivered: public addresses, plus the networks an operator
allows.

A webhook makes the server send requests to a URL an ``admin`` key chose. Left open,
that reaches the server's own network (loopback, private ranges, link-local cloud
metadata at 169.254.169.254). So by default only public addresses are accepted, and
the check is made at delivery too, on the addresses the host name resolves to then.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from urllib.parse import urlsplit

from .. import ConfigError

__all__ = ["TargetPolicy", "safe_url"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class TargetPolicy:
    """Which webhook targets are allowed.

    Args:
        allow: networks allowed beside public addresses (``"10.0.0.0/8"``,
            ``"127.0.0.1/32"``), or ``"*"`` for any address at all.
    """

    def __init__(self, allow: Sequence[str] = ()) -> None:
        self.any = "*" in allow
        nets: list[Network] = []
        for spec in allow:
            if spec == "*":
                continue
            try:
                nets.append(ipaddress.ip_network(spec, strict=False))
            except ValueError:
                raise ConfigError(
                    f"webhook target network {spec!r} is not a CIDR network (10.0.0.0/8)"
                ) from None
        self.allowed = tuple(nets)

    def refusal(self, address: Address) -> str | None:
        """Why ``address`` is refused, or ``None`` when it may be reached."""
        if self.any or any(address in net for net in self.allowed):
            return None
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            return self.refusal(address.ipv4_mapped)
        for what, bad in (
            ("loopback", address.is_loopback),
            ("link-local", address.is_link_local),
            ("private", address.is_private),
            ("multicast", address.is_multicast),
            ("reserved", address.is_reserved),
            ("unspecified", address.is_unspecified),
        ):
            if bad:
                return (
                    f"{address} is a {what} address: webhooks go to public addresses unless "
                    f"the network is allowed (mainspring serve --webhook-allow {address}/32)"
                )
        return None

    def check_url(self, url: str) -> None:
        """At registration: refuse a URL whose host is a refused address or
        ``localhost`` (names are resolved and checked again at each delivery).

        Raises:
            ConfigError: the target is refused, with why.
        """
        host = urlsplit(url).hostname or ""
        if self.any:
            return
        if host.lower() in ("localhost", "localhost.localdomain") or host.lower().endswith(
            ".localhost"
        ):
            address: Address = ipaddress.ip_address("127.0.0.1")
        else:
            try:
                address = ipaddress.ip_address(host)
            except ValueError:
                return  # a name: checked on the resolved addresses when delivering
        problem = self.refusal(address)
        if problem is not None:
            raise ConfigError(f"webhook URL refused: {problem}")

    async def check_delivery(self, url: str) -> str | None:
        """At delivery: why the URL's host resolves to a refused address, if it does."""
        if self.any:
            return None
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            return f"cannot resolve {host!r}: {exc}"
        for info in infos:
            problem = self.refusal(ipaddress.ip_address(info[4][0]))
            if problem is not None:
                return problem
        return None


def safe_url(url: str) -> str:
    """The URL as logs may show it: no user, password or query (tokens live there)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a port that is not a number: leave it out
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}"

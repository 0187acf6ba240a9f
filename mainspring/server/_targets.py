"""Where webhooks may be delivered: globally routable addresses, plus the networks
an operator allows.

A webhook makes the server send requests to a URL an ``admin`` key chose. Left open,
that reaches the server's own network: loopback, private ranges, link-local cloud
metadata at 169.254.169.254, the shared (carrier-grade NAT) space where some clouds
keep theirs (100.100.100.200). So only addresses that are globally routable are
accepted, by a table of its own (the IANA special-purpose registries) rather than by
``ipaddress.is_global`` alone, which changes between Python releases and calls
multicast, ``192.0.0.9``, ``64:ff9b:1::/48``, ``fec0::/10`` and the IPv6 forms that
carry an IPv4 address "global". An IPv6 address that carries an IPv4 one (mapped,
compatible, SIIT-translated, NAT64, 6to4, Teredo) is judged by that IPv4 address too.

The check is made at registration (IP literals, in every form the resolver reads)
and at each delivery, on every address the host name resolves to then; the delivery
connects to an address it checked (:meth:`TargetPolicy.resolve`), never to a second
answer of the resolver.
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


def _nets(*pairs: tuple[str, str]) -> tuple[tuple[Network, str], ...]:
    return tuple((ipaddress.ip_network(net), what) for net, what in pairs)


# Not globally routable, whatever ``is_global`` says on this Python: the IANA IPv4 and
# IPv6 special-purpose registries (the parts that are not reachable, or are nonsense
# as a webhook's target), multicast and broadcast.
NOT_GLOBAL = _nets(
    ("0.0.0.0/8", "a 'this network' address"),
    ("10.0.0.0/8", "a private address"),
    ("100.64.0.0/10", "a shared (carrier-grade NAT) address, where some clouds keep metadata"),
    ("127.0.0.0/8", "a loopback address"),
    ("169.254.0.0/16", "a link-local address (cloud metadata lives there)"),
    ("172.16.0.0/12", "a private address"),
    ("192.0.0.0/24", "an IETF protocol assignment address"),
    ("192.0.2.0/24", "a documentation address"),
    ("192.88.99.0/24", "a 6to4 relay anycast address"),
    ("192.168.0.0/16", "a private address"),
    ("198.18.0.0/15", "a benchmarking address"),
    ("198.51.100.0/24", "a documentation address"),
    ("203.0.113.0/24", "a documentation address"),
    ("224.0.0.0/4", "a multicast address"),
    ("240.0.0.0/4", "a reserved address"),
    ("::/128", "an unspecified address"),
    ("::1/128", "a loopback address"),
    ("64:ff9b:1::/48", "a local-use NAT64 address"),
    ("100::/64", "a discard-only address"),
    ("2001::/23", "an IETF protocol assignment address"),
    ("2001:db8::/32", "a documentation address"),
    ("3fff::/20", "a documentation address"),
    ("5f00::/16", "a segment routing address"),
    ("fc00::/7", "a unique-local (private) address"),
    ("fe80::/10", "a link-local address"),
    ("fec0::/10", "a site-local address"),
    ("ff00::/8", "a multicast address"),
)
_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")  # where IANA allocates IPv6 unicast
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_COMPATIBLE = ipaddress.ip_network("::/96")
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")


def _is_v4(address: Address) -> tuple[ipaddress.IPv4Address, str] | None:
    """The IPv4 address an IPv6 address *is* (a packet to it reaches that host), and
    the form's name."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    low = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped, "IPv4-mapped"
    if address in _TRANSLATED:
        return low, "IPv4-translated"
    if address in _NAT64:
        return low, "NAT64"
    if address in _COMPATIBLE and int(address) > 1:
        return low, "IPv4-compatible"
    return None


def _carried(address: Address) -> list[tuple[ipaddress.IPv4Address, str]]:
    """IPv4 addresses a tunnelled IPv6 address leads to (6to4's router, Teredo's
    server and client)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    if address.sixtofour is not None:
        return [(address.sixtofour, "6to4")]
    if address.teredo is not None:
        server, client = address.teredo
        return [(server, "Teredo (server)"), (client, "Teredo (client)")]
    return []


class TargetPolicy:
    """Which webhook targets are allowed.

    Args:
        allow: networks allowed beside globally routable addresses (``"10.0.0.0/8"``,
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
        found = self._culprit(address)
        if found is None:
            return None
        culprit, what, how = found
        lead = f"{address} is {what}" if how is None else f"{address} {how} {culprit}, {what}"
        return (
            f"{lead}: webhooks go to globally routable addresses unless the network is "
            f"allowed (mainspring serve --webhook-allow {culprit}/{culprit.max_prefixlen})"
        )

    def _culprit(self, address: Address) -> tuple[Address, str, str | None] | None:
        """The refused address (``address`` or the IPv4 one it carries), what it is,
        and how ``address`` leads to it."""
        if self.any or any(address in net for net in self.allowed):
            return None
        inner = _is_v4(address)
        if inner is not None:
            found = self._culprit(inner[0])
            return None if found is None else (found[0], found[1], f"is the {inner[1]} form of")
        for v4, how in _carried(address):
            found = self._culprit(v4)
            if found is not None:
                return found[0], found[1], f"leads through {how} to"
        what = next((what for net, what in NOT_GLOBAL if address in net), None)
        v6 = isinstance(address, ipaddress.IPv6Address)
        if what is None and v6 and address not in _GLOBAL_UNICAST:
            what = "an address outside the global unicast space (2000::/3)"
        if what is None and not address.is_global:
            what = "an address that is not globally routable"
        return None if what is None else (address, what, None)

    def check_url(self, url: str) -> None:
        """At registration: refuse a URL whose host is a refused address (in any form
        the resolver reads as one: ``127.1``, ``2130706433``, ``0x7f.0.0.1``) or
        ``localhost`` (names are resolved and checked at each delivery).

        Raises:
            ConfigError: the target is refused, with why.
        """
        if self.any:
            return
        try:
            host = (urlsplit(url).hostname or "").lower().rstrip(".")
        except ValueError as exc:  # "http://[::1": the store names what is wrong
            raise ConfigError(f"a webhook URL that cannot be read: {url!r} ({exc})") from None
        if host in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
            addresses: list[Address] = [ipaddress.ip_address("127.0.0.1")]
        else:
            addresses = _literal(host)  # a name: checked on the resolved addresses later
        for address in addresses:
            problem = self.refusal(address)
            if problem is not None:
                raise ConfigError(f"webhook URL refused: {problem}")

    async def resolve(self, url: str) -> list[Address]:
        """At delivery: the addresses of the URL's host, every one of them checked.
        The delivery connects to these addresses, so a resolver cannot answer one
        thing to the check and another to the connection.

        Raises:
            ConfigError: an address is refused (the message says why).
            OSError: the name cannot be resolved now (worth trying again later).
        """
        parts = urlsplit(url)
        host = parts.hostname or ""
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ConfigError(f"the port in {safe_url(url)!r} is not a number") from None
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses: list[Address] = []
        for info in infos:
            address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
            problem = self.refusal(address)
            if problem is not None:
                raise ConfigError(problem)
            if address not in addresses:
                addresses.append(address)
        if not addresses:
            raise OSError(f"{host!r} resolves to no address")
        return addresses

    async def check_delivery(self, url: str) -> str | None:
        """At delivery: why the URL's host is refused or cannot be resolved, if so."""
        if self.any:
            return None
        try:
            await self.resolve(url)
        except ConfigError as exc:
            return exc.message
        except OSError as exc:
            return f"cannot resolve {urlsplit(url).hostname!r}: {exc}"
        return None


def _literal(host: str) -> list[Address]:
    """``host`` as the addresses the resolver reads it as without asking DNS (every
    numeric form: ``127.1``, ``0x7f.1``, ``2130706433``), or ``[]`` for a name."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, flags=socket.AI_NUMERICHOST)
    except (OSError, UnicodeError):
        return []
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


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

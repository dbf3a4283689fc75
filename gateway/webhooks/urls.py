"""Where a webhook may point: the outbound rules, checked at creation and again at delivery.

``https`` only, no credentials in the URL, and only public addresses, unless the host is in
``GATEWAY_WEBHOOK_ALLOWED_HOSTS`` (development: a receiver on loopback over ``http``). At
delivery the host's addresses are resolved and checked, and the request goes to the checked
address (the name still in ``Host`` and in TLS), so a name that resolves elsewhere the
second time (DNS rebinding) cannot send a delivery to a private address.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import httpx

MAX_URL_LENGTH = 2000
_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Zs"})
"""Unicode categories refused anywhere in a URL: controls (C1 ones too), format characters
(bidi overrides), separators and spaces. A URL is shown to people and printed on terminals."""


class UrlRefused(Exception):
    """The URL breaks a rule; ``reason`` says which, in words safe to show its owner."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Target:
    """A checked URL: its host as sent (an internationalised name in punycode), and whether the
    allow-list covers it."""

    url: httpx.URL
    host: str
    allow_listed: bool


def _normalised_hosts(allowed_hosts: tuple[str, ...]) -> frozenset[str]:
    return frozenset(host.strip().lower().strip("[]") for host in allowed_hosts if host.strip())


_LAST_32_BITS_ARE_IPV4 = tuple(
    ipaddress.IPv6Network(prefix)
    for prefix in ("64:ff9b::/96", "::/96", "::ffff:0:0:0/96")  # NAT64, IPv4-compatible, IPv4-translated
)
_NOT_PUBLIC_V6 = tuple(
    ipaddress.IPv6Network(prefix) for prefix in ("64:ff9b:1::/48", "fec0::/10")  # local-use NAT64, site-local
)


def public_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """An address on the public internet: not loopback, private, link-local, multicast, reserved
    or unspecified. An IPv6 address that carries an IPv4 address (IPv4-mapped, NAT64, 6to4,
    IPv4-compatible or -translated) is judged as that IPv4 address: a NAT64 gateway, for one,
    takes ``64:ff9b::a00:5`` to 10.0.0.5."""
    if isinstance(address, ipaddress.IPv6Address):
        if any(address in network for network in _NOT_PUBLIC_V6):
            return False
        if address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        elif address.sixtofour is not None:
            address = address.sixtofour
        elif any(address in network for network in _LAST_32_BITS_ARE_IPV4):
            address = ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return address.is_global and not address.is_multicast


def check_url(url: str, allowed_hosts: tuple[str, ...]) -> Target:
    """The URL as a ``Target``, or ``UrlRefused``. A name is resolved only at delivery."""
    if len(url) > MAX_URL_LENGTH:
        raise UrlRefused(f"The URL is longer than {MAX_URL_LENGTH} characters.")
    if any(ord(ch) < 0x21 or ord(ch) == 0x7F or unicodedata.category(ch) in _INVISIBLE for ch in url):
        raise UrlRefused("The URL contains spaces or control characters.")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError):
        raise UrlRefused("The URL cannot be parsed.") from None
    if parsed.scheme not in ("https", "http"):
        raise UrlRefused("The URL must use https.")
    try:
        name = parsed.host.lower()  # decodes its punycode (xn--) labels
    except ValueError:  # idna.IDNAError: a malformed label
        raise UrlRefused("The URL's host is not a valid name.") from None
    # The name as it goes on the wire (punycode): what is resolved, sent in TLS and in Host.
    host = parsed.raw_host.decode("ascii").lower()
    if not host:
        raise UrlRefused("The URL has no host.")
    if not _valid_name(host):
        raise UrlRefused("The URL's host is not a valid name.")
    if parsed.userinfo:
        raise UrlRefused("The URL must not carry credentials.")
    if parsed.fragment:
        raise UrlRefused("The URL must not have a fragment.")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise UrlRefused("The URL's port must be between 1 and 65535.")
    allowed = _normalised_hosts(allowed_hosts)
    allow_listed = host in allowed or name in allowed
    if parsed.scheme != "https" and not allow_listed:
        raise UrlRefused("The URL must use https (plain http only for hosts in GATEWAY_WEBHOOK_ALLOWED_HOSTS).")
    if not allow_listed:
        try:
            literal = ipaddress.ip_address(host.removesuffix("."))
        except ValueError:
            literal = None
        if literal is not None and not public_address(literal):
            raise UrlRefused("The URL names a loopback, private or reserved address.")
        bare = host.removesuffix(".")
        if literal is None and _numeric(bare):
            # 2130706433, 0x7f000001, 127.1: what a resolver may take for an address (the
            # delivery's check of the resolved address would refuse it; refused here, as said).
            raise UrlRefused("The URL's host is a number: give a name or a dotted address.")
        if literal is None and (bare == "localhost" or bare.endswith((".localhost", ".local", ".internal"))):
            raise UrlRefused("The URL names a local host.")
    return Target(url=parsed, host=host, allow_listed=allow_listed)


def _numeric(host: str) -> bool:
    """An address in one of the forms ``inet_aton`` takes beside dotted decimal, or a name
    whose last label is a number (no top-level domain is)."""
    try:
        socket.inet_aton(host)
    except OSError:
        return host.rsplit(".", 1)[-1].isdigit()
    return True


def _valid_name(host: str) -> bool:
    """DNS's limits: labels of 1 to 63 characters, 253 in all (a trailing dot aside)."""
    labels = host.removesuffix(".").split(".")
    return len(host.removesuffix(".")) <= 253 and all(1 <= len(label) <= 63 for label in labels)


class Resolver:
    """Webhook hosts' lookups, on threads of their own, a few per tenant.

    A lookup that hangs (a receiver behind a name server that never answers) is abandoned at
    its deadline but keeps its thread until the system's resolver gives up. On the event
    loop's shared pool enough of them would stall every other lookup of the process, an HTTP
    tool's or a model's included; on one small pool, one tenant's would stall every other
    tenant's webhooks. So a tenant holds at most ``per_tenant`` threads, counted until each
    lookup really ends, and waits (within its deadline) for one of its own to free: it takes
    ``threads / per_tenant`` tenants whose lookups all hang to hold every thread."""

    def __init__(
        self, *, threads: int = 64, per_tenant: int = 2, lookup: Callable[..., list[Any]] = socket.getaddrinfo
    ) -> None:
        """``lookup``: the system's resolver (a test gives one that hangs for some names)."""
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="webhook-dns")
        self._lookup = lookup
        self._per_tenant = per_tenant
        self._busy: dict[str, int] = {}
        self._freed = asyncio.Condition()
        self._releasing: set[asyncio.Task[None]] = set()

    async def getaddrinfo(self, tenant_id: str, host: str, port: int) -> list[Any]:
        """``socket.getaddrinfo`` for a TCP connection; the caller bounds the wait."""
        async with self._freed:
            await self._freed.wait_for(lambda: self._busy.get(tenant_id, 0) < self._per_tenant)
            self._busy[tenant_id] = self._busy.get(tenant_id, 0) + 1
        try:
            lookup = asyncio.get_running_loop().run_in_executor(
                self._executor,
                functools.partial(self._lookup, host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP),
            )
        except RuntimeError:  # closed: the worker stopped
            await self._release(tenant_id)
            raise OSError("the resolver is closed") from None
        lookup.add_done_callback(lambda done: self._ended(tenant_id, done))
        return await asyncio.shield(lookup)

    def _ended(self, tenant_id: str, lookup: asyncio.Future[Any]) -> None:
        # Read, so that a lookup abandoned at its deadline that fails later is not logged as
        # an exception nobody retrieved (its caller has long been told the host did not resolve).
        if not lookup.cancelled():
            lookup.exception()
        release = asyncio.ensure_future(self._release(tenant_id))
        self._releasing.add(release)
        release.add_done_callback(self._releasing.discard)

    async def _release(self, tenant_id: str) -> None:
        async with self._freed:
            left = self._busy.get(tenant_id, 1) - 1
            if left:
                self._busy[tenant_id] = left
            else:
                self._busy.pop(tenant_id, None)
            self._freed.notify_all()

    def close(self) -> None:
        """No new lookups; a thread still in one ends with it."""
        self._executor.shutdown(wait=False, cancel_futures=True)


async def resolve_checked(target: Target, *, timeout_s: float, resolver: Resolver, tenant_id: str) -> str:
    """The address to send to: the host's first resolved address, once every address it
    resolves to is public (or the host is allow-listed). ``UrlRefused`` otherwise."""
    port = target.url.port or (443 if target.url.scheme == "https" else 80)
    try:
        async with asyncio.timeout(timeout_s):
            infos = await resolver.getaddrinfo(tenant_id, target.host, port)
    except (OSError, TimeoutError, UnicodeError):
        raise UrlRefused("The host could not be resolved.") from None
    addresses = [ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos]
    if not addresses:
        raise UrlRefused("The host could not be resolved.")
    if not target.allow_listed and not all(public_address(a) for a in addresses):
        raise UrlRefused("The host resolves to a loopback, private or reserved address.")
    return str(addresses[0])


def pinned(target: Target, address: str) -> httpx.URL:
    """The target's URL with its host replaced by the checked address."""
    return target.url.copy_with(host=address)

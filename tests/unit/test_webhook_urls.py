"""The outbound rules of webhook URLs: at creation (the URL itself) and at delivery (what its
host resolves to, DNS rebinding included)."""

from __future__ import annotations

import pytest

from gateway.webhooks.urls import Resolver, Target, UrlRefused, check_url, pinned, resolve_checked


@pytest.mark.parametrize(
    "url",
    [
        "http://hooks.example.com/x",
        "https://127.0.0.1/x",
        "https://127.1.2.3/x",
        "https://0.0.0.0/x",
        "https://[::1]/x",
        "https://[::ffff:10.0.0.1]/x",
        "https://192.168.1.10/x",
        "https://172.16.0.1/x",
        "https://100.64.0.1/x",  # shared address space (carrier NAT)
        "https://169.254.169.254/x",
        "https://[fe80::1]/x",
        "https://[fd00::1]/x",
        "https://224.0.0.1/x",
        "https://localhost/x",
        "https://printer.local/x",
        "https://a:b@hooks.example.com/x",
        "https://hooks.example.com/x#frag",
        "file:///etc/passwd",
        "https://hooks.example.com/\t",
        "https://hooks.example.com/x\u2028y",  # a line separator
        "https://hooks.example.com/\x9b2J",  # a C1 control (CSI): printed by `gateway webhooks list`
        "https://hooks.example.com/\u202egpj.x",  # a bidi override
        "https://hooks.example.com/\u00a0",  # a no-break space
        "https://hooks.example.com:99999/x",  # no such port: every attempt would fail unexpectedly
        "https://hooks.example.com:0/x",
        "https://" + "a" * 2000 + ".com/",
        # Forms a resolver may take for a loopback or private address, and names with a trailing dot.
        "https://2130706433/x",
        "https://0x7f000001/x",
        "https://127.1/x",
        "https://0/x",
        "https://167772161/x",
        "https://hooks.10/x",
        "https://localhost./x",
        "https://foo.localhost./x",
        "https://metadata.google.internal./x",
    ],
)
def test_refused_urls(url):
    with pytest.raises(UrlRefused):
        check_url(url, ())


@pytest.mark.parametrize(
    "url",
    [
        "https://[64:ff9b::a00:5]/x",  # NAT64 (RFC 6052) to 10.0.0.5: an IPv6-only network reaches it
        "https://[64:ff9b::a9fe:a9fe]/latest",  # NAT64 to the cloud metadata address
        "https://[64:ff9b:1::a00:5]/x",  # local-use NAT64 prefix (RFC 8215)
        "https://[2002:a00:5::1]/x",  # 6to4 of 10.0.0.5
        "https://[::10.0.0.5]/x",  # IPv4-compatible (deprecated)
        "https://[::ffff:0:7f00:1]/x",  # IPv4-translated (SIIT) 127.0.0.1
        "https://[fec0::1]/x",  # site-local (deprecated, still private)
    ],
)
def test_ipv6_addresses_that_carry_a_private_ipv4_address_or_are_site_local_are_refused(url):
    with pytest.raises(UrlRefused):
        check_url(url, ())


@pytest.mark.parametrize("url", ["https://[64:ff9b::808:808]/x", "https://[2002:808:808::1]/x"])
def test_ipv6_addresses_that_carry_a_public_ipv4_address_pass(url):
    check_url(url, ())


@pytest.mark.parametrize("url", ["https://hooks.example.com/x", "https://8.8.8.8:8443/hook?x=1", "https://[2001:4860:4860::8888]/",
                                 "https://8.8.8.8./x", "https://hooks.example.com./x", "https://1password.com/x"])
def test_public_https_urls_pass(url):
    check_url(url, ())


@pytest.mark.parametrize(
    "url",
    [
        "https://xn--zz/x",  # not valid punycode
        "https://XN--ZZ.example.com/x",
        "https://xn--/x",  # an empty A-label
        "https://xn--a-ecp.ru/x",  # decodes to a code point IDNA does not allow
        "https://xn--n3h.com/x",  # a snowman: decodes, but not allowed in a name
        "https://" + "a" * 64 + ".example.com/x",  # a label over 63 characters
        "https://xn--" + ("\u00fc" * 40 + "a" * 30).encode("punycode").decode() + ".com/x",  # decodes; 77 characters
        "https://" + ".".join(["a" * 60] * 5) + "/x",  # over 253 in all
        "https://hooks..example.com/x",  # an empty label
    ],
)
def test_hosts_that_are_not_valid_names_are_refused(url):
    with pytest.raises(UrlRefused, match="not a valid name"):
        check_url(url, ())


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://m\u00fcnchen.de/x", "xn--mnchen-3ya.de"),
        ("https://xn--mnchen-3ya.de/x", "xn--mnchen-3ya.de"),
        ("https://fa\u00df.de/x", "xn--fa-hia.de"),  # IDNA 2008, as in Host: not the fass.de of IDNA 2003
        ("https://Hooks.Example.com./x", "hooks.example.com."),
    ],
)
def test_an_internationalised_name_is_resolved_and_sent_in_its_punycode_form(url, host):
    target = check_url(url, ())
    assert target.host == host == target.url.netloc.decode("ascii")


def test_an_allow_listed_host_may_use_http_and_a_loopback_address():
    target = check_url("http://127.0.0.1:8080/hook", ("127.0.0.1",))
    assert target.allow_listed and target.host == "127.0.0.1"
    assert check_url("http://LOCALHOST:1/x", (" localhost ",)).allow_listed
    with pytest.raises(UrlRefused):
        check_url("http://127.0.0.2:8080/hook", ("127.0.0.1",))


@pytest.fixture
def resolver():
    made = Resolver()
    yield made
    made.close()


async def test_a_name_resolving_to_loopback_is_refused_at_delivery(resolver):
    """A name passes at creation; at delivery it resolves to a loopback address: refused."""
    target = Target(url=check_url("https://hooks.example.com/x", ()).url.copy_with(host="localhost"),
                    host="localhost", allow_listed=False)
    with pytest.raises(UrlRefused):
        await resolve_checked(target, timeout_s=5, resolver=resolver, tenant_id="acme")


async def test_the_request_goes_to_the_checked_address_with_the_name_kept_for_host_and_tls(resolver):
    target = check_url("http://localhost:8080/hook?a=1", ("localhost",))
    address = await resolve_checked(target, timeout_s=5, resolver=resolver, tenant_id="acme")
    assert address in ("127.0.0.1", "::1")
    url = pinned(target, address)
    assert url.host == address and url.port == 8080 and url.raw_path == b"/hook?a=1"
    assert target.url.netloc == b"localhost:8080"


async def test_one_tenants_lookups_that_hang_hold_a_few_threads_never_another_tenants():
    # A tenant's hosts behind a name server that never answers: its lookups give up at their
    # deadline but keep their threads; another tenant's lookups, and the loop's own, answer.
    import asyncio
    import socket
    import threading

    release = threading.Event()

    def system_resolver(host, *args, **kwargs):  # the part of the system this test stands in for
        if host.startswith("hang"):
            release.wait(30)
        return socket.getaddrinfo(host, *args, **kwargs)

    resolver = Resolver(threads=4, per_tenant=2, lookup=system_resolver)
    try:
        for n in range(3):
            hanging = check_url(f"http://hang{n}.localhost/hook", ("hang0.localhost", "hang1.localhost",
                                                                    "hang2.localhost"))
            with pytest.raises(UrlRefused, match="could not be resolved"):
                await resolve_checked(hanging, timeout_s=0.2, resolver=resolver, tenant_id="acme")
        other = check_url("http://localhost:8080/hook", ("localhost",))
        assert await resolve_checked(other, timeout_s=5, resolver=resolver, tenant_id="globex") in (
            "127.0.0.1", "::1")
        assert await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo("localhost", 80), timeout=5)
    finally:
        release.set()
        resolver.close()

"""Where a request came from (core.addresses.request_origin), behind the proxies an operator
trusts and in front of anyone else's."""

from __future__ import annotations

import pytest

from core.addresses import request_origin, trusted_networks

PROXIES = trusted_networks(["192.0.2.10", "10.8.0.0/16", "2001:db8::/32"])


@pytest.mark.parametrize(
    ("remote", "forwarded", "origin"),
    [
        ("203.0.113.7", "", "203.0.113.7"),  # no proxy in between
        ("203.0.113.7", "198.51.100.1", "203.0.113.7"),  # not a proxy: its header is ignored
        ("192.0.2.10", "198.51.100.1", "198.51.100.1"),  # the proxy says who it heard
        ("192.0.2.10", "6.6.6.6, 198.51.100.1", "198.51.100.1"),  # the client's own, not
        ("192.0.2.10", "198.51.100.1, 10.8.3.4", "198.51.100.1"),  # two proxies in a row
        ("2001:db8::1", "2001:db8::2, 2a00::5", "2a00::5"),
        ("192.0.2.10", "", "192.0.2.10"),  # a proxy that forwards nothing: itself
        ("192.0.2.10", "10.8.0.1", "10.8.0.1"),  # proxies all the way: the farthest
        ("192.0.2.10", "198.51.100.1, not-an-address", "192.0.2.10"),  # garbage: the proxy
        ("", "198.51.100.1", "unknown"),
    ],
)
def test_the_origin_is_the_nearest_hop_no_trusted_proxy_vouches_for(remote, forwarded, origin):
    assert request_origin(remote, forwarded, PROXIES) == origin


def test_no_trusted_proxies_means_remote_addr_whatever_the_header_says():
    assert request_origin("192.0.2.10", "198.51.100.1", []) == "192.0.2.10"


def test_an_entry_that_is_no_address_is_named_with_the_fix():
    refusal = r"LLMGW_TRUSTED_PROXIES: 'proxy\.lan' is neither an address nor a network; write"
    with pytest.raises(ValueError, match=refusal):
        trusted_networks(["10.0.0.1", "proxy.lan"])

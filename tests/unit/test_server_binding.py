"""Which addresses ``dagq server`` may serve without tokens: loopback only."""

from __future__ import annotations

import pytest

from dagq.errors import UsageError
from dagq.server.runner import auth_required, is_loopback

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost"])
def test_loopback_serves_without_tokens_unless_asked(host: str) -> None:
    assert is_loopback(host)
    assert not auth_required(host, auth=False)
    assert auth_required(host, auth=True)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "192.168.0.7", "[fe80::1]"])
def test_any_other_address_requires_tokens(host: str) -> None:
    assert not is_loopback(host)
    assert auth_required(host, auth=False)


@pytest.mark.parametrize("host", ["example.com", "", "127.0.0.1:80"])
def test_a_name_that_is_not_an_address_is_refused(host: str) -> None:
    with pytest.raises(UsageError, match="is not an IP address"):
        is_loopback(host)

"""Sentinel URLs: parsing, redaction and the errors a bad one gives (no server)."""

from __future__ import annotations

import pytest

from batchq.store.connection import RedisSettings, check_url, redact
from batchq.store.sentinel import parse_sentinel_url

pytestmark = pytest.mark.unit


def test_parses_hosts_service_db_credentials_and_options() -> None:
    s = parse_sentinel_url("rediss+sentinel://me:p%40ss@a:1,[::1]:2,c/mysvc/3"
                           "?sentinel_password=sp&ssl_ca_certs=/ca.pem")
    assert s.sentinels == (("a", 1), ("::1", 2), ("c", 26379))
    assert (s.service, s.db, s.tls) == ("mysvc", 3, True)
    assert (s.username, s.password, s.sentinel_password) == ("me", "p@ss", "sp")
    assert s.options == (("ssl_ca_certs", "/ca.pem"),)
    assert "p@ss" not in repr(s) and "sp" not in repr(s).replace("sentinels", "")


def test_redact_hides_both_passwords() -> None:
    url = "redis+sentinel://u:secret1@h1:26379,h2:26380/svc?sentinel_password=secret2"
    shown = redact(url)
    assert "secret" not in shown and "h1:26379,h2:26380/svc" in shown
    assert "secret" not in repr(RedisSettings(url))


@pytest.mark.parametrize(("url", "why"), [
    ("redis+sentinel://u:secret@h1:1,h2:2", "no service name"),
    ("redis+sentinel://u:secret@h1:1,h2:2/", "no service name"),
    ("redis+sentinel://u:secret@/svc", "no Sentinel host"),
    ("redis+sentinel://u:secret@h1:99999/svc", "bad port"),
    ("redis+sentinel://u:secret@h1:1/svc/x", "/SERVICE or /SERVICE/DB"),
    ("redis+sentinel://u:secret@h1:1/svc?db=x", "db must be a number"),
])
def test_bad_sentinel_urls_are_clear_errors_without_the_password(url: str, why: str) -> None:
    with pytest.raises(ValueError) as err:
        check_url(url)
    assert why in str(err.value)
    assert "secret" not in str(err.value)
    assert "redis+sentinel://u:***@" in str(err.value)


def test_unknown_option_is_refused_when_the_client_is_built() -> None:
    with pytest.raises(ValueError, match="unknown option 'bogus'"):
        RedisSettings("redis+sentinel://h:1/svc?bogus=1").sync_client()

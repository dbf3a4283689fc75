"""Taking a call's sensitive values out of what a server says back, however it wrote them."""

from __future__ import annotations

import json

import msgspec
import pytest

from gateway.tools.scrub import Sensitive

SECRETS = {"password": "Pässwörd-123", "token": "ab/cd+ef/gh==", "note": "s3cr&t<pass>",
           "card": {"number": "4111111111111111"}, "pin": 1234, "short": "ss", "flag": True}
SENSITIVE = Sensitive(SECRETS, SECRETS.keys())


@pytest.mark.parametrize("quoted", [
    json.dumps({"detail": "bad Pässwörd-123"}).encode(),  # ensure_ascii: \u00e4
    json.dumps({"detail": "bad Pässwörd-123"}, ensure_ascii=False).encode(),
    b'{"detail": "bad ab\\/cd+ef\\/gh=="}',  # PHP escapes slashes
    b"<p>bad s3cr&amp;t&lt;pass&gt;</p>",  # an HTML error page
    b"bad ab%2Fcd%2Bef%2Fgh%3D%3D in the URL",
    b'{"errors": [{"loc": ["body", "card", "number"], "input": "4111111111111111"}]}',  # a leaf of an object
    b'{"input": {"pin": 1234}}',
    # A review's reproductions: the value as an object key, percent- or form-encoded in a JSON string.
    json.dumps({"errors": {"Pässwörd-123": "invalid"}}).encode(),
    b'{"detail": "No route for /look?token=ab%2Fcd%2Bef%2Fgh%3D%3D"}',
    b'{"detail": "No route for /look/ab/cd%2Bef/gh%3D%3D"}',
    "bad Pässwörd-123".replace(" ", "+").encode(),
    json.dumps({"detail": "bad card P%C3%A4ssw%C3%B6rd-123"}).encode(),
    b'bad note s3cr%26t%3Cpass%3E and s3cr%26t%3Cpass%3E',
])
def test_a_value_is_taken_out_however_the_server_wrote_it(quoted):
    scrubbed = SENSITIVE.body(quoted)
    for secret in ("Pässwörd", "P\\u00e4ssw", "ab/cd", "ab\\/cd", "s3cr", "4111111111111111", ": 1234"):
        assert secret.encode() not in scrubbed, scrubbed
    assert b"[REDACTED]" in scrubbed


def test_json_stays_json_and_nothing_else_is_touched():
    body = json.dumps({"message": "the account 5512345 is closed", "code": 12345, "pin": 1234,
                       "x": "ss", "messages": "ss is fine inside", "ok": True}).encode()
    scrubbed = msgspec.json.decode(SENSITIVE.body(body))
    assert scrubbed == {"message": "the account 55[REDACTED]5 is closed", "code": 12345, "pin": "[REDACTED]",
                        "x": "[REDACTED]", "messages": "ss is fine inside", "ok": True}


def test_nothing_sensitive_leaves_the_body_as_it_came():
    body = b'{"detail":  "no"}'
    assert Sensitive({"a": "x"}, ["b"]).body(body) is body
    assert Sensitive({"flag": True, "none": None}, ["flag", "none"]).body(body) is body


def test_a_body_nested_too_deep_is_scrubbed_as_text():
    deep = b"[" * 5000 + b'"4111111111111111"' + b"]" * 5000
    assert b"4111111111111111" not in SENSITIVE.body(deep)


def test_a_form_encoded_value_with_spaces_is_taken_out_of_text_and_json():
    sensitive = Sensitive({"card": "tok live 4111-1111"}, ["card"])
    for body in (b"bad card tok+live+4111-1111", b'{"detail": "No route for /look?card=tok%20live%204111-1111"}',
                 b'{"detail": "bad tok+live+4111-1111"}'):
        scrubbed = sensitive.body(body)
        assert b"4111-1111" not in scrubbed and b"[REDACTED]" in scrubbed, scrubbed


def test_a_document_as_deep_as_an_answer_may_nest_is_walked_without_recursing():
    """Reviews' reproductions: 500 levels, within the 512 a tool's answer may have, raised
    RecursionError in every view of the approval that showed it; scrubbed as text instead,
    a value shorter than the inner floor (a CVV) came through past 64 levels."""
    sensitive = Sensitive({"card": "4111111111111111", "cvv": "123", "pin": 4321}, ["card", "cvv", "pin"])
    for depth in (1, 65, 500, 511):
        leaf = '{"card": "4111111111111111", "cvv": "123", "pin": 4321, "qty": 7}'
        body = ("[" * depth + leaf + "]" * depth).encode()
        scrubbed = sensitive.body(body)
        assert b"4111" not in scrubbed and b'"123"' not in scrubbed and b"4321" not in scrubbed, scrubbed[-120:]
        assert scrubbed.count(b"[REDACTED]") == 3 and b'"qty":7' in scrubbed


def test_a_document_past_what_is_walked_is_scrubbed_as_text():
    depth = 600
    body = ("[" * depth + '"4111111111111111"' + "]" * depth).encode()
    scrubbed = SENSITIVE.body(body)
    assert b"4111111111111111" not in scrubbed and b"[REDACTED]" in scrubbed

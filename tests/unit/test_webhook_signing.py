"""Webhook bodies and signatures: the Standard Webhooks test vector, secrets, Slack bodies."""

from __future__ import annotations

import base64

import msgspec

from gateway.webhooks.events import new_secret, sign, slack_body, standard_body


def test_the_signature_matches_the_standard_webhooks_test_vector():
    # The example of the Standard Webhooks specification's reference libraries.
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    assert sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == (
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )


def test_a_new_secret_is_whsec_and_base64_of_32_random_bytes():
    first, second = new_secret(), new_secret()
    assert first.startswith("whsec_") and first != second
    assert len(base64.b64decode(first.removeprefix("whsec_"), validate=True)) == 32


def test_the_standard_body_is_type_timestamp_and_data():
    body = msgspec.json.decode(standard_body("run.stopped", "2026-12-01T00:00:00Z", {"run_id": "r1"}))
    assert body == {"type": "run.stopped", "timestamp": "2026-12-01T00:00:00Z", "data": {"run_id": "r1"}}


def test_slack_text_cannot_be_given_links_or_mentions_by_names_in_the_event():
    text = msgspec.json.decode(slack_body("approval.created", {
        "tool": "<https://evil.example|click>", "requester_id": "<!channel>", "console_url": "https://gw/console/approvals/a1",
    }))["text"]
    assert "<https://evil" not in text and "<!channel>" not in text
    assert "&lt;!channel&gt;" in text and text.endswith("<https://gw/console/approvals/a1|Open in the console>")

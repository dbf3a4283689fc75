"""The delay before a webhook's next attempt: doubling from the base, capped, jittered."""

from __future__ import annotations

from gateway.settings import WebhookSettings
from gateway.webhooks.worker import backoff_s

SETTINGS = WebhookSettings(retry_base_s=5.0, retry_max_s=3600.0)


def test_the_delay_doubles_each_attempt_within_half_to_all_of_it():
    for attempts, full in ((1, 5.0), (2, 10.0), (3, 20.0), (6, 160.0)):
        delays = {backoff_s(SETTINGS, attempts) for _ in range(200)}
        assert all(full / 2 <= d <= full for d in delays)
        assert len(delays) > 100  # jittered: receivers that failed together are not retried together


def test_the_delay_is_capped_even_after_very_many_attempts():
    assert all(1800.0 <= backoff_s(SETTINGS, attempts) <= 3600.0 for attempts in (13, 100, 10_000))

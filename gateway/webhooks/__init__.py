"""Tenants' webhooks: subscriptions, the outbox the database fills, and the worker that sends it.

A change that announces an event (an approval created, decided or expired; an agent run
stopped) writes its delivery rows through triggers in its own transaction
(``gateway/db/sql/webhook_outbox.sql``). Each gateway process runs a ``WebhookWorker`` that
claims due rows with ``FOR UPDATE SKIP LOCKED`` under a lease, sends them signed the
Standard Webhooks way, retries with backoff and jitter, and dead-letters what still fails
after the retry window. See docs/webhooks.md.
"""

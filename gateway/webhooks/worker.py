"""The delivery worker: every gateway process sends the outbox, taking turns row by row.

A process sends up to ``GATEWAY_WEBHOOK_BATCH_SIZE`` deliveries at once and claims more as
each one ends, in one committed statement (``FOR UPDATE SKIP LOCKED``: two processes never
claim the same row) in which tenants take turns, marking each in flight with a lease. It
sends them with no transaction open and records each attempt: delivered (a 2xx answer), or
due again after an exponential backoff with jitter, or dead-lettered once the next attempt
would fall past the retry window. A process that dies mid-send leaves its rows in flight
until their lease runs out; then any process sends them again. So every event is delivered
at least once, every attempt with the same ``webhook-id``, for the receiver to de-duplicate.

Each attempt follows the outbound rules again (``gateway.webhooks.urls``): the host's
addresses are resolved and checked, the request goes to the checked address, redirects are
not followed, the whole attempt has one deadline, and at most a few KB of the answer are
read. The worker also marks the approvals that expired by time, so their trigger announces
``approval.expired`` (``store.expire_due_approvals``).
"""

from __future__ import annotations

import asyncio
import random
import ssl
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import structlog

from gateway.db.engine import Database
from gateway.execution.approvals import _EXPIRY_CONTENTS as EXPIRY_CONTENTS
from gateway.settings import WebhookSettings
from gateway.webhooks import store
from gateway.tools.registry import ToolRegistry
from gateway.webhooks.events import event_data, sign, slack_body, standard_body
from gateway.webhooks.urls import Resolver, UrlRefused, check_url, pinned, resolve_checked

log = structlog.get_logger("gateway.webhooks")

USER_AGENT = "gateway-webhooks/1"
EXPIRY_BATCH = 500


def backoff_s(settings: WebhookSettings, attempts: int) -> float:
    """The delay before the next attempt after ``attempts`` tries: doubling from the base up to
    the cap, then a random share of it between half and all (so receivers that failed together
    are not retried together)."""
    delay = min(settings.retry_max_s, settings.retry_base_s * 2 ** min(max(attempts - 1, 0), 40))
    return random.uniform(delay / 2, delay)


class WebhookWorker:
    def __init__(
        self,
        db: Database,
        settings: WebhookSettings,
        *,
        public_base_url: str | None = None,
        verify: ssl.SSLContext | bool = True,
        registry: ToolRegistry | None = None,
    ) -> None:
        """``verify``: how receivers' certificates are checked (the system's CAs by default);
        ``registry``: the tools, which say whose arguments' hash an approval event may carry."""
        self._db = db
        self._registry = registry
        self._settings = settings
        self._base_url = public_base_url or settings.public_base_url
        self._task: asyncio.Task[None] | None = None
        self._resolver = Resolver()
        self._next_sweep = 0.0
        # Its own client: no connection is kept for reuse (a receiver's late bytes can never
        # become the next delivery's answer), redirects are not followed, no proxy from the
        # environment.
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.timeout_s),
            limits=httpx.Limits(max_connections=max(settings.batch_size, 1), max_keepalive_connections=0),
            follow_redirects=False,
            trust_env=False,
            verify=verify,
        )

    # -- one round --------------------------------------------------------------------------

    async def run_once(self) -> int:
        """One round, waited for: mark expired approvals, then claim a batch and send it; the
        number claimed."""
        claimed = await self._claim(self._settings.batch_size)
        if claimed:
            await asyncio.gather(*(self._deliver(row) for row in claimed))
        return len(claimed)

    async def _claim(self, limit: int) -> list[Any]:
        """Up to ``limit`` due deliveries, claimed (``store.claim_due``: tenants take turns),
        after the expiry sweep (at most once an interval)."""
        now = datetime.now(UTC)
        async with self._db.connect() as conn:
            due, watches_expiry = await store.work_to_do(conn, now=now)
        if watches_expiry and time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + self._settings.interval_s
            await self._expire_approvals()
            due = True  # what the sweep expired may be due now
        if not due:
            return []
        async with self._db.begin() as conn:
            return await store.claim_due(
                conn, now=now, lease=timedelta(seconds=self._settings.lease_s), limit=limit
            )

    async def _expire_approvals(self) -> None:
        try:
            async with self._db.begin() as conn:
                expired = await store.expire_due_approvals(
                    conn, now=datetime.now(UTC), contents=EXPIRY_CONTENTS, limit=EXPIRY_BATCH
                )
        except Exception:  # the next round tries again; deliveries go on meanwhile
            log.exception("webhook_expiry_sweep_failed")
            return
        if expired:
            log.info("approvals_expired_by_sweep", count=expired)

    async def _deliver(self, row: Any) -> None:
        try:
            status, error = await self.send(row)
        except Exception:  # a failed attempt like any other: recorded, retried
            log.exception("webhook_attempt_failed_unexpectedly", delivery=row.id, tenant=row.tenant_id)
            status, error = None, "internal_error"
        now = datetime.now(UTC)
        fields = {"delivery": row.id, "tenant": row.tenant_id, "webhook": row.subscription_id,
                  "event_type": row.event_type, "attempt": row.attempts, "status": status}
        dead = False
        try:
            async with self._db.begin() as conn:
                if error is None:
                    recorded = await store.record_delivered(
                        conn, claim=row, status=status or 0, now=now
                    )
                else:
                    retry_at = now + timedelta(seconds=backoff_s(self._settings, row.attempts))
                    window_end = row.window_started_at + timedelta(seconds=self._settings.retry_window_s)
                    dead = retry_at >= window_end
                    recorded = await store.record_failed(
                        conn, claim=row, status=status, error=error, now=now, retry_at=None if dead else retry_at,
                    )
        except Exception:  # the lease runs out and the delivery is sent again
            log.exception("webhook_attempt_not_recorded", **fields)
            return
        if not recorded:
            log.warning("webhook_lease_lost", **fields)
        elif error is None:
            log.info("webhook_delivered", **fields)
        elif dead:
            log.warning("webhook_dead_lettered", error=error, **fields)
        else:
            log.info("webhook_delivery_failed", error=error, **fields)

    # -- one attempt ------------------------------------------------------------------------

    def body(self, row: Any) -> bytes:
        data = event_data(row.event_type, dict(row.data), base_url=self._base_url)
        if data.get("arguments_sha256") is not None and not self._hash_may_go_out(data.get("tool")):
            data["arguments_sha256"] = None
        if row.format == "slack":
            return slack_body(row.event_type, data)
        timestamp = row.created_at.astimezone(UTC).isoformat().replace("+00:00", "Z")
        return standard_body(row.event_type, timestamp, data)

    def _hash_may_go_out(self, tool_name: Any) -> bool:
        """An event never carries the arguments, so their hash goes out only for a tool known to
        mark no field sensitive: a receiver could otherwise test guesses of such a value."""
        tool = self._registry.get(tool_name) if self._registry is not None and isinstance(tool_name, str) else None
        return tool is not None and not tool.sensitive_fields

    async def send(self, row: Any) -> tuple[int | None, str | None]:
        """One attempt: the answer's status, and None or what went wrong (a short code)."""
        try:
            target = check_url(row.url, self._settings.allowed_hosts)
        except UrlRefused:
            return None, "url_refused"
        body = self.body(row)
        timestamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "user-agent": USER_AGENT,
            "host": target.url.netloc.decode("ascii"),
            "webhook-id": row.id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(row.secret, row.id, timestamp, body),
        }
        status: int | None = None
        try:
            async with asyncio.timeout(self._settings.timeout_s):
                address = await resolve_checked(
                    target, timeout_s=self._settings.timeout_s, resolver=self._resolver, tenant_id=row.tenant_id
                )
                extensions = {"sni_hostname": target.host} if target.url.scheme == "https" else {}
                request = self._http.build_request(
                    "POST", pinned(target, address), content=body, headers=headers, extensions=extensions
                )
                response = await self._http.send(request, stream=True)
                try:
                    status = response.status_code
                    await self._read_some(response)
                finally:
                    await response.aclose()
        except UrlRefused:
            return None, "address_refused"
        except (TimeoutError, httpx.TimeoutException):
            if status is None:
                return None, "timeout"
        except httpx.HTTPError:
            if status is None:
                return None, "connection_failed"
        assert status is not None
        if 200 <= status < 300:
            return status, None
        return status, f"http_{status}"

    async def _read_some(self, response: httpx.Response) -> None:
        """At most ``max_response_bytes`` of the answer; the rest is never waited for."""
        read = 0
        async for chunk in response.aiter_raw():
            read += len(chunk)
            if read >= self._settings.max_response_bytes:
                break

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        if self._settings.interval_s > 0 and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="webhook-worker")

    async def _loop(self) -> None:
        """Up to ``batch_size`` deliveries on their way at once, a slot claimed again as soon as
        one ends: a receiver that never answers holds its slot for one timeout, not the others."""
        sending: set[asyncio.Task[None]] = set()
        try:
            while True:
                free = self._settings.batch_size - len(sending)
                claimed: list[Any] = []
                try:
                    claimed = await self._claim(free) if free else []
                except Exception:  # the next round tries again; the rows' leases keep them safe
                    log.exception("webhook_round_failed")
                sending.update(asyncio.create_task(self._deliver(row)) for row in claimed)
                if sending and len(claimed) == free:  # every slot busy, and more may be due
                    await asyncio.wait(sending, return_when=asyncio.FIRST_COMPLETED)
                else:
                    await asyncio.sleep(self._settings.interval_s)
                sending = {task for task in sending if not task.done()}
        finally:
            for task in sending:
                task.cancel()
            await asyncio.gather(*sending, return_exceptions=True)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._resolver.close()
        await self._http.aclose()

"""One model request over the process's pooled ``httpx.AsyncClient``, with retries.

Refused connections, timeouts, 5xx and 429 are retried (``GATEWAY_LLM_RETRIES`` times,
backoff doubling from ``GATEWAY_LLM_RETRY_BACKOFF_S``; a 429's ``Retry-After`` wins) as
long as the run's deadline leaves time for it; then the caller gets ``UPSTREAM_UNAVAILABLE``
or ``UPSTREAM_TIMEOUT``. A 4xx other than 429 is not retried (``UPSTREAM_REJECTED``), and a
body that is not JSON, larger than the limit, or compressed (identity is asked for; a
compressed body is refused, never inflated) is ``UPSTREAM_BAD_RESPONSE``.

The run's own deadline is an ``asyncio`` timeout around the whole loop: reaching it cancels
the request in flight, whatever attempt it is; a retry whose backoff would end past it is
not tried (``deadline``, in event-loop time). Headers (the API key among them) and bodies
are never logged.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import httpx
import msgspec
import structlog

from gateway.errors import ErrorCode
from gateway.llm.base import UpstreamError
from gateway.tools.http_transport import IDENTITY, EncodedBody, read_capped

log = structlog.get_logger("gateway.llm")

MAX_RETRY_AFTER_S = 30.0


class _Retry(Exception):
    def __init__(self, reason: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        self.reason = reason
        self.status = status
        self.retry_after = retry_after
        super().__init__(reason)


class UpstreamTransport:
    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        retries: int,
        backoff_s: float,
        max_response_bytes: int,
    ) -> None:
        self._http = http
        self._retries = retries
        self._backoff_s = backoff_s
        self._max_response_bytes = max_response_bytes

    async def post_json(
        self,
        url: str,
        payload: Any,
        *,
        provider: str,
        api_key: str | None,
        timeout_s: float,
        deadline: float | None = None,
    ) -> bytes:
        """POST ``payload`` as JSON and return the 200 answer's body, retrying what may pass."""
        body = msgspec.json.encode(payload)
        headers = {"Content-Type": "application/json", "Accept": "application/json", **IDENTITY}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        attempt = 0
        while True:
            attempt += 1
            started = time.perf_counter()
            try:
                async with asyncio.timeout(timeout_s):
                    answer = await self._send(url, body, headers, timeout_s)
                log.debug("model_request_answered", provider=provider, attempt=attempt,
                          duration_ms=_ms(started))
                return answer
            except _Retry as failure:
                last = failure
            except TimeoutError:
                last = _Retry("timeout")
            log.warning(
                "model_request_failed",
                provider=provider,
                attempt=attempt,
                reason=last.reason,
                status=last.status,
                duration_ms=_ms(started),
            )
            code = ErrorCode.UPSTREAM_TIMEOUT if last.reason == "timeout" else ErrorCode.UPSTREAM_UNAVAILABLE
            if attempt > self._retries:
                raise UpstreamError(code)
            delay = self._delay(attempt, last.retry_after)
            if deadline is not None and asyncio.get_running_loop().time() + delay >= deadline:
                # No time left for another attempt: say what failed rather than wait for the deadline.
                raise UpstreamError(code)
            log.info("model_request_retry", provider=provider, attempt=attempt + 1, delay_s=round(delay, 3))
            await asyncio.sleep(delay)

    async def _send(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> bytes:
        timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        try:
            async with self._http.stream("POST", url, content=body, headers=headers, timeout=timeout) as response:
                status = response.status_code
                if status == 429 or status >= 500:
                    raise _Retry(f"status_{status}", status=status, retry_after=_retry_after(response))
                if status != 200:
                    log.warning("model_request_refused", status=status, url=_safe_url(url))
                    raise UpstreamError(ErrorCode.UPSTREAM_REJECTED)
                try:
                    answer, complete = await read_capped(response, self._max_response_bytes)
                except EncodedBody as exc:
                    log.warning("model_response_encoded", content_encoding=exc.encoding)
                    raise UpstreamError(
                        ErrorCode.UPSTREAM_BAD_RESPONSE, "The model provider's answer came compressed."
                    ) from None
                if not complete:
                    log.warning("model_response_too_large", limit=self._max_response_bytes)
                    raise UpstreamError(ErrorCode.UPSTREAM_BAD_RESPONSE, "The model provider's answer is too large.")
                return answer
        except httpx.TimeoutException:
            raise _Retry("timeout") from None
        except httpx.TransportError as exc:
            raise _Retry(f"transport_{type(exc).__name__}") from None

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, MAX_RETRY_AFTER_S)
        base = self._backoff_s * (2 ** (attempt - 1))
        return base * random.uniform(0.75, 1.25)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _safe_url(url: str) -> str:
    """Scheme, host and path only: a URL's query or user info may carry a credential."""
    parsed = httpx.URL(url)
    return f"{parsed.scheme}://{parsed.host}{':' + str(parsed.port) if parsed.port else ''}{parsed.path}"


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)

"""A statement that fails never puts what it carried into a log line: neither its bound
parameters (a stored message holding a tool call's arguments) nor PostgreSQL's quote of the
row it refused."""

from __future__ import annotations

import sqlalchemy as sa

from tests.support.db import execute
from tests.support.scripted_model import call, openai_turn

ARGUMENT = "vault-key-5f1c9e2a-never-logged"


async def test_a_stored_message_whose_insert_fails_is_not_in_the_log(gateway, model, logs):
    # A model's tool call is stored with its arguments; make that one insert fail.
    await execute(
        gateway.database_url,
        sa.text(
            "ALTER TABLE run_messages ADD CONSTRAINT refuse_tool_calls "
            "CHECK (message -> 'tool_calls' IS NULL) NOT VALID"
        ),
    )
    model.script(openai_turn(calls=[call("search_articles", {"query": ARGUMENT})]), openai_turn("done"))

    response = await gateway.chat("find the vault key")

    assert response.status_code == 500, response.text
    error_id = response.json()["error"]["error_id"]
    [failure] = [e for e in logs.events if e.get("error_id") == error_id]
    # The failure is logged with its stack, which names the statement and the constraint ...
    assert "refuse_tool_calls" in failure["exception"]
    assert "INSERT INTO run_messages" in failure["exception"]
    # ... and nothing of the values it carried, nor the refused row.
    assert ARGUMENT not in logs.text
    assert "Failing row contains" not in logs.text
    assert ARGUMENT not in response.text

"""The ``run_expiry`` guard: RUN_EXPIRED, decided by the admission statement against the run's
row (covered against PostgreSQL by tests/api/test_approvals_run_expiry.py and the ledger
statement tests); here, what it gives that statement."""

from __future__ import annotations

import json

from gateway.errors import ErrorCode
from gateway.execution.guards import ADMISSION_CONTENTS, Stage, admission_payload, run_expiry
from tests.unit.guards.support import plan


def test_it_is_decided_at_admission_and_answers_run_expired():
    assert run_expiry.GUARD.stage is Stage.ADMISSION and run_expiry.GUARD.code is ErrorCode.RUN_EXPIRED
    content = ADMISSION_CONTENTS["RUN_EXPIRED"]
    assert json.loads(content)["error"]["code"] == "RUN_EXPIRED"


def test_it_needs_no_input_of_its_own_per_call():
    assert run_expiry.GUARD.prepare is None and run_expiry.GUARD.contribute is None
    assert "expires_at" not in json.dumps(admission_payload(plan("add", b'{"a": 1, "b": 2}', decoded=True)))

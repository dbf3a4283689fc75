"""The PL/pgSQL and set-based SQL of the hot path, one file per function, applied by
migrations (``gateway.db.sqlfiles``)."""

"""The approver's console at ``/console/``: server-rendered pages over the same services as
the API, signed in with a cookie session instead of a bearer token.

``routes`` wires the pages; ``web`` holds what they share (headers, session, CSRF);
``links.console_url`` is the link to print for a user."""

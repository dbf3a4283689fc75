"""The agent loop: the gateway runs a conversation against a model, every tool call guarded."""

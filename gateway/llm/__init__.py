"""Model providers over httpx: one small interface, an adapter per wire format."""

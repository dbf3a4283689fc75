"""Reading a /metrics scrape in tests."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

Scrape = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Scrape:
    """Every sample of a scrape by (name, labels)."""
    found: Scrape = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(scrape: Scrape, name: str, **labels: str) -> float:
    """A sample's value, 0 when the series does not exist (yet)."""
    return scrape.get((name, frozenset(labels.items())), 0.0)


def growth(before: Scrape, after: Scrape) -> Callable[..., float]:
    """``growth(before, after)(name, **labels)``: how much a series grew between two scrapes."""

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    return delta

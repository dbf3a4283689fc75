"""Integer arithmetic with the rules a model must respect (no division by zero)."""

from __future__ import annotations

from gateway.errors import BusinessRuleViolation

# Results stay exactly representable in JSON numbers read as IEEE doubles.
MAX_SAFE_INTEGER = 2**53 - 1


def _checked(value: int) -> int:
    if abs(value) > MAX_SAFE_INTEGER:
        raise BusinessRuleViolation("The result is too large to represent exactly.")
    return value


class CalculatorService:
    def add(self, a: int, b: int) -> int:
        return _checked(a + b)

    def multiply(self, a: int, b: int) -> int:
        return _checked(a * b)

    def divide(self, a: int, b: int) -> int | float:
        if b == 0:
            raise BusinessRuleViolation("Division by zero is not defined.")
        quotient, remainder = divmod(a, b)
        return quotient if remainder == 0 else a / b

"""What a built-in policy says about itself: its name and help, its argument, and what
it needs and where it runs (`Needs`, needs.py). Every table of policies (the CLI's
list, the weighted ones, those that share by groups, those the vLLM plugin and the
gateway run) is read from these declarations (catalog.py), so a policy is added in one
place: its own module.

A built-in policy module declares each name it serves with `Declared` (one class may
serve several: `vtc`, `lcf`, `wvtc` are one `VTCPolicy` set three ways). A policy of
one's own (`package.module:ClassName`, loading.py) declares the same `Needs` as a class
attribute, `needs = Needs(weights=True)`; its arguments are keyword arguments in the
spec, so it declares no `Argument`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tokenfair.core.policies.base import Policy
from tokenfair.core.policies.needs import Needs
from tokenfair.core.policies.settings import PolicySettings

__all__ = ["Argument", "Declared", "Needs"]


@dataclass(frozen=True, slots=True)
class Argument:
    """The one argument a built-in name takes after a colon (`sjf:20`, `rpm:60`)."""

    name: str  # as the help and the errors say it: `sjf[:aging]`, "needs a limit"
    default: float | None  # None: required (`rpm:N`)
    unit: str = ""  # a whole number >= 1 of these (`requests per minute`); "": any number

    def read(self, spec: str, text: str | None) -> float:
        """The argument's value in `spec` (`text` after the colon, None without one);
        ValueError with what to write instead."""
        example = f"{spec.strip().partition(':')[0]}:20"
        if text is None or text == "":
            if self.default is None:
                raise ValueError(f"policy {spec!r} needs a {self.name}, e.g. {example}")
            return self.default
        if self.unit:
            if not text.isdigit() or int(text) < 1:
                raise ValueError(
                    f"policy {spec!r}: the {self.name} must be a whole number of "
                    f"{self.unit} >= 1, e.g. {example} (got {text!r})"
                )
            return float(text)
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"policy {spec!r}: argument {text!r} is not a number") from None


# (settings, the argument's value: its default when the spec gives none, 0 for a name
# that takes none) -> the policy.
Builder = Callable[[PolicySettings, float], Policy]


@dataclass(frozen=True, slots=True)
class Declared:
    """A built-in policy name: what it does, how it is built, what it needs."""

    name: str
    help: str
    build: Builder
    argument: Argument | None = None
    needs: Needs = field(default_factory=Needs)

    @property
    def usage(self) -> str:
        """The name as the help lists it: `vtc`, `sjf[:aging]`, `rpm:N`."""
        arg = self.argument
        if arg is None:
            return self.name
        return f"{self.name}:N" if arg.default is None else f"{self.name}[:{arg.name}]"

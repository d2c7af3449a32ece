"""Errors a user can act on."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from the user: the message is one line saying what, which input, and what to do.

    The CLI prints the message alone (no traceback) and exits with status 2.
    """


class ConfigError(InputError):
    """A setting that breaks its config's rules: ``Owner.field = value: rule``.

    Attributes:
        owner: the config dataclass's name (``"MeshConfig"``).
        field: the field (``"threshold"``; dotted for a rule between fields).
        value: the value given.
        rule: what the value must be (``"must be a finite number"``).
    """

    def __init__(self, owner: str, field: str, value, rule: str) -> None:
        self.owner, self.field, self.value, self.rule = owner, field, value, rule
        super().__init__(f"{owner}.{field} = {value!r}: {rule}")

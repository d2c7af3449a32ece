"""Errors a user can act on."""


class InputError(ValueError):
    """Bad input from the user: the message is one line saying what, which input, and what to do.

    The CLI prints the message alone (no traceback) and exits with status 2.
    """

"""Errors for bad cost-model input (profiles are untrusted files)."""

from __future__ import annotations


class ProfileError(ValueError):
    """A profile file is malformed. Names the file and the field."""

    exit_code = 2  # the CLI turns any exception with ``exit_code`` into a message + that status

    def __init__(self, path: str, field: str, message: str) -> None:
        super().__init__(f"{path}: field {field!r}: {message}")
        self.path = path
        self.field = field
        self._args = (path, field, message)

    def __reduce__(self):  # rebuilt from its arguments when a sweep worker sends it back
        return type(self), self._args

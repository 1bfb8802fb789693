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


class ModelConfigError(KeyError):
    """A model's config.json is unreadable, malformed or asks for what kvsim does not model.
    Names the file and the field. A ``KeyError`` (a model that cannot be resolved), so every
    command's ``--model`` check reports it in its one line, as for an unknown name."""

    exit_code = 2

    def __init__(self, path: str, field: str, message: str) -> None:
        super().__init__(f"{path}: field {field!r}: {message}")
        self._args = (path, field, message)

    def __str__(self) -> str:  # KeyError's would quote the message
        return str(self.args[0])

    def __reduce__(self):
        return type(self), self._args

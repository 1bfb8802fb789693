"""The cache's errors (a module of their own: compiled modules cannot subclass exceptions)."""


class CapacityError(RuntimeError):
    """An operation would exceed the cache's capacity (a caller bug, not bad user input)."""

"""kvsim: the simulator (docs/ and sim/README.md)."""

from . import native

# The one place the compiled core is chosen: every module of sim (a compiled one included)
# loads after this package's __init__, so the decision precedes them all.
native.install()

"""kvsim: the simulator (docs/ and sim/README.md)."""

from sim.kvcache import native

native.install()  # sim.replay may run compiled: decided before any sim module loads

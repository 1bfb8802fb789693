"""Profiles from NVIDIA's measured GPU kernel tables (``kvsim calibrate --from-kernels``).

aiconfigurator-core (``pip install 'kvsim[kernels]'``) ships kernel latencies measured on ten
GPU systems under SGLang, vLLM and TensorRT-LLM. :mod:`.tables` reads and validates them,
:mod:`.attention` turns prefix-free attention tables into prefill over a cached prefix and
decode, :mod:`.compose` sums one model's layers from them, :mod:`.run` fits the profile form on
a grid and records the provenance, :mod:`.ship` regenerates the shipped ``kernels-*``
profiles. Only numpy, pyarrow and PyYAML are needed; no GPU, no torch.
"""

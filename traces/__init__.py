"""Traces: one canonical in-memory Trace, loaders per format, synthetic generators, stats.

Depends on nothing else of ours. See docs/traces.md.
"""

from .errors import OptionError, TraceFormatError
from .kinds import GAP_KINDS, KIND_NAMES
from .load import FORMATS, detect_format, load_trace, read_trace_files
from .model import Session, Trace, parse_gap_model
from .regions import REGION_NAMES

__all__ = ["FORMATS", "GAP_KINDS", "KIND_NAMES", "REGION_NAMES", "OptionError", "Session", "Trace",
           "TraceFormatError", "detect_format", "load_trace", "parse_gap_model",
           "read_trace_files"]

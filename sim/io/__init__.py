"""Files and sizes: what kvsim reads from and writes to disk, and sizes as users type them.

=========  ==============================================  =================================
module     owns                                            in -> out
=========  ==============================================  =================================
files.py   atomic writes (temp file, rename), reads that   paths -> text, JSON, YAML,
           fail in one line naming the file, the output    Parquet; documents -> files
           folder check and its one-writer lock
sizes.py   the token-size grammar (``256k``, ``3e6``)      text -> tokens
=========  ==============================================  =================================

May import: the standard library (pandas and yaml when a table or a YAML file is read);
nothing else of kvsim's but ``traces.sizes`` (the size grammar, in the leaf package so that
trace specs share it), so every room (runs, sweeps, studies, reports, the CLI) may use it.
"""

from .files import (
    FILE_MODE,
    LOCK_NAME,
    TMP_SUFFIX,
    InputError,
    atomic_save_figure,
    atomic_write_parquet,
    atomic_write_text,
    check_out_dir,
    check_out_file,
    clean_json,
    dumps,
    folder_lock,
    is_tmp_name,
    read_json,
    read_parquet,
    read_text,
    read_yaml,
    remove_stale_tmp,
    yaml_error,
)
from .sizes import MAX_SIZE, SIZE_GRAMMAR, SIZE_UNITS, SizeError, parse_size, tokens

__all__ = ["FILE_MODE", "LOCK_NAME", "MAX_SIZE", "SIZE_GRAMMAR", "SIZE_UNITS", "TMP_SUFFIX",
           "InputError", "SizeError", "atomic_save_figure", "atomic_write_parquet",
           "atomic_write_text", "check_out_dir", "check_out_file", "clean_json", "dumps",
           "folder_lock", "is_tmp_name", "parse_size", "read_json", "read_parquet", "read_text",
           "read_yaml", "remove_stale_tmp", "tokens", "yaml_error"]

"""The ``kvsim`` commands: options, input checks, progress, and printing what the rooms below
build (sim/README.md). Each command is one module (``main.py`` adds them); ``common.py`` holds
what they share (size options, one-line errors, JSON output).

In: the command line. Out: JSON documents on stdout, tables, files under ``--out``.
May import: every room of ``sim``, ``policies``, ``traces``, ``costmodel``, ``calibration``.
Nothing imports the CLI.
"""

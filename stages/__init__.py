"""Thin DVC entry points: parse config, call `pipeline`, write outputs, track.

Each stage runs as `python -m stages.<name>` and calls stages/startup.py's `begin()` before its
other imports (the portable numerics, Ctrl-C held while importing); importing this package or a
stage module changes nothing in the process."""

"""Thin DVC entry points: parse config, call `pipeline`, write outputs, track."""

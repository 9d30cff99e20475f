"""energy-flow: a reproducible experiment pipeline for the energy-flow model.

The library lives here; `stages/` holds thin DVC entry points that call it.
"""

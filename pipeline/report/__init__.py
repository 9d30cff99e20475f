"""Stability report: turn a training run's telemetry into verdicts a researcher can act on.

- `checks.run_checks(steps, events, params)`: one verdict per failure mode (memory growth,
  step-time degradation, non-finite steps, gradient-norm zones, loss spikes, fp16 loss scaling,
  adaptive-step convergence, learning; docs/checks.md), each with its evidence and the recommended
  fix; `checks.stability_metrics(result)` is the DVC metrics file.
- `plots.make_plots(steps, events, params, out_dir)`: the PNGs the verdicts point at.
- `render.render_markdown(...)` / `render.render_html(...)`: the report itself.

Nothing here opens the MLflow store or reads stage outputs: the report stage does the I/O.
"""

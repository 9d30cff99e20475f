"""Stability report: turn a training run's telemetry into verdicts a researcher can act on.

- `checks.run_checks(steps, events, params)`: one verdict per failure mode (memory growth,
  step-time degradation, device utilisation, non-finite steps, gradient-norm zones, loss spikes,
  loss regression, fp16 loss scaling, adaptive-step convergence, learning; docs/checks.md), each a
  CheckResult with its evidence and the recommended fix, one module per check in checks/;
  `checks.stability_metrics(result)` is the DVC metrics file.
- `plots.make_plots(steps, events, params, out_dir)`: the PNGs the verdicts point at.
- `render.render_markdown(...)` / `render.render_html(...)`: the report itself, from the Jinja2
  templates in templates/ over the pieces of layout.py (units.py: numbers with their units).
- `build`: the report built, written and logged to the model's MLflow run.

Nothing here reads stage outputs: the report stage (stages/report.py) reads them and hands them in.
"""

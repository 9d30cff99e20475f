"""The train stage's library: the training loop, per-step health (non-finite, spikes, gradient
zones), injected faults, the resumable state, stop signals, telemetry, the memory check and the
time/memory files kept beside the DVC outputs."""

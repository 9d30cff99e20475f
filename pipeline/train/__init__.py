"""The train stage's library: the training loop (loop.py) and its parts (per-step health, skip
events, the loss scaler, injected faults, telemetry, checkpoints and the resumable state, stop
signals, progress), the memory check, and what the stage reads before training and writes after
it, the time/memory files kept beside the DVC outputs included."""

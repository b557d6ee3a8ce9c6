"""What both task families share: the run schema and its errors, weight sync, offload, gradient averaging,
counter-based noise, checkpoint folders and the runner's helpers. It imports no family."""

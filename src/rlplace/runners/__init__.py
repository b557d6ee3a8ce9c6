"""Training loops: read top to bottom, identical in every placement mode."""

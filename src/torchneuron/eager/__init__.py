"""Eager execution: each ATen op runs as one cached XLA executable (or a counted CPU fallback)."""

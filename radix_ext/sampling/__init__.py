"""Seeded, batch-invariant sampling: the draw in pure torch, and its place in SGLang's sampler."""

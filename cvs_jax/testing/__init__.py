"""Tiny generated data and tiny-run helpers shared by the tests and the benchmarks."""

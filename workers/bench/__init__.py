"""Benchmarks (`dpstream bench …`); one module per target, each exposes `register(subparsers)`."""

"""The declared pipeline and its privacy arithmetic: pure, no I/O beyond reading a topology file."""

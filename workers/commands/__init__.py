"""One module per `dpstream` subcommand; each exposes `register(subparsers)`."""

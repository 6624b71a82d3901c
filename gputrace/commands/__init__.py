"""CLI commands, one module each (see gputrace.cli)."""

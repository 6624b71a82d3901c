"""A program that raises: `gputrace run` must print the traceback as Python does, exit with 1,
and still write the trace (the scope the exception left is flagged)."""

import gputrace


def load(path):
    raise FileNotFoundError(path)


with gputrace.trace("startup"):
    pass
with gputrace.trace("load"):
    load("missing.bin")

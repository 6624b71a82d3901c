"""A program that records a scope, prints its argv and calls sys.exit(3)."""

import sys

import gputrace

with gputrace.trace("work", argc=len(sys.argv)):
    print("argv:", " ".join(sys.argv[1:]))
sys.exit(3)

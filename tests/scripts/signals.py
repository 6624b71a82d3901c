"""A program stopped by a signal while it runs (argv[1]: TERM or INT): the trace must still be
written, and the process must end the way that signal ends it."""

import os
import signal
import sys
import time

import gputrace

with gputrace.trace("before-signal"):
    pass
with gputrace.trace("waiting"):
    os.kill(os.getpid(), getattr(signal, "SIG" + sys.argv[1]))
    time.sleep(10)

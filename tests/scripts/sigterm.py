"""A program stopped by SIGTERM while it runs: the trace must still be written."""

import os
import signal
import time

import gputrace

with gputrace.trace("before-signal"):
    pass
with gputrace.trace("waiting"):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)

"""Record CPU scopes (a sync every 1,000) for ``seconds``, then die without cleanup.

Usage: killed.py PATH HOW SECONDS, HOW being "kill" (SIGKILL) or "exit" (os._exit). Prints the
number of scopes recorded before each sync, flushed, so the parent knows what must be in the file.
"""

import os
import signal
import sys
import time

import gputrace

path, how, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
t0 = time.monotonic()
with gputrace.session(path, backend="cpu", quiet=True):
    i = 0
    while True:
        with gputrace.trace("step", i=i) if i % 100 == 0 else gputrace.trace("step"):
            pass
        i += 1
        if i % 1000 == 0:
            gputrace.sync()
            print(i, flush=True)
            if time.monotonic() - t0 > seconds:
                break
    with gputrace.trace("after the last sync"):
        pass
    sys.stdout.flush()
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)

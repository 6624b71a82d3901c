"""A program with scopes of its own and plain functions that `--trace-module`/`--trace-function`
can trace without editing it. Prints what `gputrace run` must make look like `python scopes.py`."""

import os
import sys

import scopes_helper

import gputrace


def step(i):
    return scopes_helper.double(i) + 1


class Model:
    def forward(self, x):
        return x * 3


def main():
    print("name:", __name__, "file:", os.path.basename(__file__), "path0:", os.path.basename(sys.path[0]))
    total = 0
    for i in range(3):
        with gputrace.trace("iteration", i=i):
            total += step(i)
    total += Model().forward(1)
    print("total:", total)


if __name__ == "__main__":
    main()

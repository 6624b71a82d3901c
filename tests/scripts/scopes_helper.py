"""A module imported by scopes.py, traced with `--trace-module scopes_helper`."""


def double(x):
    return 2 * square_root_of_square(x)


def square_root_of_square(x):
    return abs(x)

"""``gputrace view TRACE``: open a trace in the bundled viewer (or the Perfetto UI).

The viewer and the trace are served on 127.0.0.1 only; nothing leaves the machine unless
``--perfetto`` is given, which hands the trace to https://ui.perfetto.dev in the browser.
"""

from __future__ import annotations

import contextlib
import sys
import webbrowser

import click

from gputrace.commands._common import fail
from gputrace.exporters.json import read_document
from gputrace.safetext import path_text


@click.command()
@click.argument("trace", type=str)  # read (and refused) by gputrace itself, as summarize does
@click.option("--no-browser", is_flag=True, help="Print the URL instead of opening a browser.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Port on 127.0.0.1 (0: any free port).",
)
@click.option(
    "--perfetto",
    is_flag=True,
    help="Hand the trace to the Perfetto UI (ui.perfetto.dev) instead of the bundled viewer.",
)
@click.option("--check", is_flag=True, help="Only check that TRACE can be shown, then exit.")
def view(trace: str, no_browser: bool, port: int, perfetto: bool, check: bool) -> None:
    """Show TRACE (.json or .json.gz) in the browser; serves it on 127.0.0.1 until Ctrl-C."""
    from gputrace.viewer_server import ViewerServer

    try:  # read as the viewer will: a bad file ends in summarize's sentence, not a blank page
        doc = read_document(trace)[0]
    except MemoryError:
        fail(f"{path_text(trace)}: too large to load into memory.")
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        fail(f"{path_text(trace)}: not a Chrome trace (no traceEvents list).")
    if check:
        click.echo(f"gputrace: {path_text(trace)} can be viewed.")
        return
    server = ViewerServer(trace, port=port)
    url = server.perfetto_url if perfetto else server.url
    where = "for the Perfetto UI " if perfetto else ""
    click.echo(f"gputrace: viewing {path_text(trace)} {where}at {url}")
    click.echo("gputrace: press Ctrl-C to stop.")
    sys.stdout.flush()
    if not no_browser:
        webbrowser.open(url)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
    finally:
        server.close()
    click.echo("gputrace: stopped.")

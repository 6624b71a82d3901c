"""``gputrace view TRACE``: open a trace in the bundled viewer (or the Perfetto UI).

    $ gputrace view run.json.gz
    gputrace: viewing run.json.gz at http://127.0.0.1:41237/?trace=trace.json.gz&name=run.json.gz
    gputrace: press Ctrl-C to stop.

The viewer and the trace are served on 127.0.0.1 only; nothing leaves the machine unless
``--perfetto`` is given, which hands the trace to https://ui.perfetto.dev in the browser.
"""

from __future__ import annotations

import sys
import webbrowser
from pathlib import Path

import click

from gputrace.commands._common import fail
from gputrace.errors import GputraceError
from gputrace.loader import read_document


@click.command()
@click.argument("trace", type=click.Path(path_type=Path))
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
def view(trace: Path, no_browser: bool, port: int, perfetto: bool) -> None:
    """Show TRACE (.json, .json.gz or .pftrace) in the browser; serves it on 127.0.0.1 until Ctrl-C."""
    from gputrace.viewer_server import ViewerServer

    served = trace
    try:
        if _is_json(trace):
            doc = read_document(trace)  # a bad file gets one sentence here, not a blank page
            if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
                raise GputraceError(f"{trace}: not a Chrome trace (no traceEvents list).")
            del doc
        else:  # another format of the output layer (.pftrace): the viewer reads JSON
            served = _as_json(trace)
        server = ViewerServer(served, port=port)
    except GputraceError as exc:
        fail(str(exc))
    url = server.perfetto_url if perfetto else server.url
    where = "for the Perfetto UI" if perfetto else ""
    click.echo(f"gputrace: viewing {trace} {where + ' ' if where else ''}at {url}")
    click.echo("gputrace: press Ctrl-C to stop.")
    sys.stdout.flush()
    if not no_browser:
        webbrowser.open(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    click.echo("gputrace: stopped.")


def _is_json(path: Path) -> bool:
    from gputrace import exporters

    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        return True  # read_document says what is wrong with it
    return head[:1] in (b"{", b"[", b"\x1f") or exporters.format_for(path).__name__.endswith(".json")


def _as_json(path: Path) -> Path:
    """``path`` (any format gputrace reads) written as .json.gz in a temporary folder."""
    import atexit
    import shutil
    import tempfile

    from gputrace import exporters
    from gputrace.loader import load

    trace = load(path)
    folder = tempfile.mkdtemp(prefix="gputrace-view-")
    atexit.register(shutil.rmtree, folder, True)
    return exporters.write(trace, Path(folder) / (path.name + ".json.gz"))

"""The run browser's HTTP server: stdlib ``ThreadingHTTPServer``, one GET route per page, every page built from
the run folder when it is asked for (a run still going shows what is there)."""

from __future__ import annotations

import http.server
import logging
import traceback
import urllib.parse

from rsi_jax.view import pages
from rsi_jax.view.data import RunFolder

log = logging.getLogger(__name__)


def _route(run: RunFolder, path: str, qs: dict) -> str:
  one = lambda k, d=None: qs.get(k, [d])[0]  # noqa: E731
  if path == "/":
    return pages.run_page(run)
  if path == "/phase":
    return pages.phase_page(run, one("phase", ""))
  if path == "/step":
    return pages.step_page(run, one("phase", ""), one("step"), one("stage"))
  if path == "/episode":
    return pages.episode_page(run, one("src", ""), int(one("i", "0")))
  if path == "/rsr":
    return pages.rsr_page(run, one("phase", ""))
  if path == "/eval":
    return pages.evaluations_page(run)
  if path == "/evaluation":
    return pages.evaluation_page(run, one("phase", ""), one("step", ""))
  raise FileNotFoundError(path)


def make_server(run_dir, host: str = "127.0.0.1", port: int = 8080) -> http.server.ThreadingHTTPServer:
  """A server over ``run_dir`` (``port`` 0: any free port; ``server.server_address`` says which)."""
  run = RunFolder(run_dir)

  class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
      url = urllib.parse.urlsplit(self.path)
      try:
        body, status = _route(run, url.path, urllib.parse.parse_qs(url.query)), 200
      except (FileNotFoundError, ValueError, KeyError) as e:
        body, status = pages.page("not found", f"<p>{pages.e(str(e))}</p>"), 404
      except Exception:  # noqa: BLE001 - one page failing must not stop the server
        log.error("%s failed:\n%s", self.path, traceback.format_exc())
        body, status = pages.page("error", f"<pre>{pages.e(traceback.format_exc())}</pre>"), 500
      data = body.encode()
      self.send_response(status)
      self.send_header("Content-Type", "text/html; charset=utf-8")
      self.send_header("Content-Length", str(len(data)))
      self.send_header("Cache-Control", "no-store")
      self.end_headers()
      self.wfile.write(data)

    def log_message(self, fmt, *args):
      log.info("%s %s", self.address_string(), fmt % args)

  srv = http.server.ThreadingHTTPServer((host, port), Handler)
  srv.daemon_threads = True
  return srv

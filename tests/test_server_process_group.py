"""A served critic stops as a process group (issue 46, item 5): vLLM's server runs its engine in a child process,
and a stop that signals only the direct child can leave that one holding the GPU. Here a real server process on
127.0.0.1 spawns a grandchild that ignores SIGTERM; after the `with` block both are gone.
"""
import os
import sys
import time

import pytest

from pipeline.critic.server_process import serve_process

SERVER = r"""
import http.server, json, signal, subprocess, sys
port, pids = int(sys.argv[1]), sys.argv[2]
grandchild = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
open(pids, "w").write(f"{grandchild.pid}\n")

class Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": "m"}]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Models).serve_forever()
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) counts as gone
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_stop_ends_the_server_and_the_grandchild_it_spawned(tmp_path):
    pids = tmp_path / "pids"
    with serve_process(lambda port: [sys.executable, "-c", SERVER, str(port), str(pids)], name="test server",
                       timeout_s=60, poll_s=0.1) as url:
        assert url.startswith("http://127.0.0.1:")
        grandchild = int(pids.read_text())
        assert alive(grandchild)
        assert os.getpgid(grandchild) != os.getpgid(0)  # its own group, not the test's
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(grandchild)

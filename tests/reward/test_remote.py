"""The remote reward client against a real local HTTP server: rate limit, retries, errors counted."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from stratarl.reward.remote import RemoteScorer, TokenBucket


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        with server.lock:
            server.times.append(time.monotonic())
            failing = server.fail_next > 0
            server.fail_next -= failing
        if body["solution_str"] == "forbidden":
            return self._reply(403, {"error": "no"})
        if failing:
            return self._reply(503, {"error": "busy"})
        return self._reply(
            200, {"score": float(body["solution_str"] == body["ground_truth"]), "seen": body["data_source"]}
        )

    def _reply(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.lock, httpd.times, httpd.fail_next = threading.Lock(), [], 0
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def url(server):
    return f"http://127.0.0.1:{server.server_address[1]}/score"


def test_scores_with_extras_and_retries_transient_errors(server):
    server.fail_next = 2
    scorer = RemoteScorer(url(server), requests_per_second=100, backoff_s=0.01)
    assert scorer("gsm8k", "4", "4") == {"score": 1.0, "seen": "gsm8k"}
    assert scorer.attempts == 3 and len(server.times) == 3  # two 503s, then success


def test_gives_up_after_max_retries_and_never_retries_a_client_error(server):
    server.fail_next = 10
    scorer = RemoteScorer(url(server), requests_per_second=100, max_retries=2, backoff_s=0.01)
    result = scorer.score_batch(["d"], ["4"], ["4"])
    assert result.scores.tolist() == [0.0] and result.failures == {"HTTPError": 1}
    assert scorer.attempts == 3
    server.fail_next = 0
    forbidden = RemoteScorer(url(server), requests_per_second=100, max_retries=5, backoff_s=0.01)
    assert forbidden.score_batch(["d"], ["forbidden"], ["x"]).failures == {"HTTPError": 1}
    assert forbidden.attempts == 1


def test_rate_limit_holds_under_concurrency(server):
    scorer = RemoteScorer(url(server), requests_per_second=20, burst=1)
    result = scorer.score_batch(["d"] * 6, ["a", "b", "c", "d", "e", "f"], ["a"] * 6, max_concurrency=6)
    assert result.scores.tolist() == [1.0, 0, 0, 0, 0, 0]
    times = sorted(server.times)
    # 6 requests at 20/s with a burst of 1: at least 5 gaps of 50 ms
    assert times[-1] - times[0] >= 5 / 20 - 0.02


def test_unreachable_endpoint_is_a_counted_failure():
    scorer = RemoteScorer("http://127.0.0.1:9/none", max_retries=1, backoff_s=0.01, timeout_s=1)
    assert scorer.score_batch(["d"], ["x"], ["x"]).failures == {"URLError": 1}


def test_token_bucket_rate():
    bucket = TokenBucket(rate=50, burst=2)
    started = time.monotonic()
    for _ in range(7):
        bucket.acquire()
    # 2 at once, then 5 more at 50/s
    assert time.monotonic() - started >= 5 / 50 - 0.01
    with pytest.raises(ValueError):
        TokenBucket(rate=0)

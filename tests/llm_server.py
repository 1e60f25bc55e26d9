"""A local OpenAI-compatible chat-completions server with scripted answers, for tests.

It stands in for a hosted model because no real one can be reached from tests: the LLM rewriter
talks to it over real HTTP through the real `openai` client, so request building, retries,
`response_format` and `usage` accounting are exercised end to end. Only POST /v1/chat/completions
is served. Replies come from a queue (`answer`, `text`, `error`, `rate_limited`); every request is
recorded (path, headers, parsed body) so tests can assert on prompts and settings. An empty queue
answers 503 with `x-should-retry: false`, so a test that asks once too often fails plainly.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

COMPLETIONS_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Reply:
    status: int = 200
    content: str | None = None  # the assistant message (status 200)
    usage: tuple[int, int] | None = (100, 50)  # (prompt, completion) tokens; None sends no usage
    finish_reason: str = "stop"
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] | None = None  # the error body (status != 200)


@dataclass(frozen=True)
class Recorded:
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # parsed JSON, or the raw text when it is not JSON
    raw: str

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.body.get("messages", []) if isinstance(self.body, dict) else []

    @property
    def prompt(self) -> str:
        """Every message's content, joined: what the model was shown."""
        return "\n".join(str(m.get("content", "")) for m in self.messages)


class ScriptedLLMServer:
    """`with ScriptedLLMServer() as server:` binds 127.0.0.1 on a free port; `server.base_url` ends in /v1."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # the script

    def answer(self, obj: Any, usage: tuple[int, int] | None = (100, 50), finish_reason: str = "stop") -> None:
        """A 200 whose message content is `obj` as JSON."""
        self.text(json.dumps(obj), usage, finish_reason)

    def text(self, content: str | None, usage: tuple[int, int] | None = (100, 50), finish_reason: str = "stop") -> None:
        """A 200 whose message content is exactly `content` (malformed answers included)."""
        self.replies.append(Reply(200, content, usage, finish_reason))

    def error(self, status: int = 500, message: str = "scripted failure", headers: dict[str, str] | None = None,
              fast_retry: bool = True) -> None:
        """An error response; `fast_retry` asks the client to retry after 5 ms rather than its backoff."""
        headers = dict(headers or {})
        if fast_retry and not any(h.startswith("retry-after") for h in headers):
            headers["retry-after-ms"] = "5"
        self.replies.append(Reply(status, headers=headers,
                                  body={"error": {"message": message, "type": "server_error", "code": None}}))

    def rate_limited(self, retry_after: float = 0.05) -> None:
        """A 429 with a Retry-After header (seconds)."""
        self.replies.append(Reply(429, headers={"retry-after": str(retry_after)},
                                  body={"error": {"message": "rate limited", "type": "rate_limit_error",
                                                  "code": "rate_limit_exceeded"}}))

    # lifecycle

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "the server is not running"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> ScriptedLLMServer:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="scripted-llm", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=5)
            self._httpd = None

    def __enter__(self) -> ScriptedLLMServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # serving

    def _serve(self, path: str, headers: dict[str, str], raw: str) -> tuple[int, dict[str, str], dict[str, Any]]:
        try:
            body: Any = json.loads(raw)
        except json.JSONDecodeError:
            body = raw
        with self._lock:
            self.requests.append(Recorded(path, headers, body, raw))
            if path != COMPLETIONS_PATH:
                return 404, {}, {"error": {"message": f"no route {path}", "type": "invalid_request_error"}}
            if not self.replies:
                return 503, {"x-should-retry": "false"}, {"error": {"message": "no scripted reply left",
                                                                     "type": "server_error"}}
            reply = self.replies.popleft()
            number = len(self.requests)
        if reply.status != 200:
            return reply.status, reply.headers, reply.body or {}
        completion: dict[str, Any] = {
            "id": f"chatcmpl-scripted-{number}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "") if isinstance(body, dict) else "",
            "choices": [{"index": 0, "logprobs": None, "finish_reason": reply.finish_reason,
                         "message": {"role": "assistant", "content": reply.content, "refusal": None}}],
        }
        if reply.usage is not None:
            prompt, completion_tokens = reply.usage
            completion["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                                   "total_tokens": prompt + completion_tokens}
        return 200, reply.headers, completion


def _handler(server: ScriptedLLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length).decode("utf-8", "replace")
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, extra, payload = server._serve(self.path, headers, raw)
            data = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in extra.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            pass

    return Handler
